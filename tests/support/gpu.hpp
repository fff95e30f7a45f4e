// GPU test helpers. A GPU test case starts with
//   if (ddp::test::skip_without_gpu()) return;
// Without a usable device it returns at once and the executable exits 77 (ctest: skipped, never passed)
// once its other cases (host-only checks) have run and passed; see support/skip.hpp.
// SPDX-License-Identifier: MIT
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "support/skip.hpp"

namespace ddp::test {

// True (and the case recorded as skipped) when no CUDA device is usable. Checked once per executable.
[[nodiscard]] inline bool skip_without_gpu() {
  static const std::string why = [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count > 0) return std::string();
    return std::string("no usable CUDA device (cudaGetDeviceCount: ") +
           (e == cudaSuccess ? "ok" : cudaGetErrorString(e)) + ", count " + std::to_string(count) + ")";
  }();
  if (why.empty()) return false;
  note_skipped(why.c_str());
  return true;
}

}  // namespace ddp::test
