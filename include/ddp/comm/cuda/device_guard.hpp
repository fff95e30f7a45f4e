// CudaDeviceGuard: makes a CUDA device current for a scope and restores the previous one (the nccl backend
// and the staging device ops set the communicator's device around their CUDA calls).
// SPDX-License-Identifier: MIT
#pragma once

#include <cuda_runtime.h>

#include "ddp/core/cuda_check.hpp"

namespace ddp::comm {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    DDP_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) DDP_CUDA_CHECK(cudaSetDevice(device));
  }
  ~CudaDeviceGuard() { cudaSetDevice(prev_); }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace ddp::comm
