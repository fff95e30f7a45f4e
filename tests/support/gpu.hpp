// GPU test helpers: a test executable with no usable GPU prints the reason and exits 77, which ctest
// reports as skipped (never as passed).
// SPDX-License-Identifier: MIT
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace ddp::test {

// Call first in a GPU test case (or from a doctest listener); returns only when a device is usable.
inline void require_gpu_or_skip() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIP: no usable CUDA device (cudaGetDeviceCount: %s, count %d)\n",
                e == cudaSuccess ? "ok" : cudaGetErrorString(e), count);
    std::fflush(stdout);
    std::exit(77);  // test executable, not the library: the skip code ctest understands
  }
}

}  // namespace ddp::test
