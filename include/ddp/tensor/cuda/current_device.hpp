// The CUDA side of binding a process to its GPU, as calls on the device tag:
// visible_devices(Cuda{}) and set_current_device(Cuda{}, n). train/init.hpp reaches them by
// argument-dependent lookup, so it names no CUDA symbol and compiles without CUDA; comm/factory.hpp
// includes this header in builds with CUDA. Also CudaDeviceGuard, which binds a device for a scope
// (the nccl backend, the staging device ops). Host API only: any C++ compiler against cudart, no
// nvcc needed.
// SPDX-License-Identifier: MIT
#pragma once

#include <cuda_runtime.h>

#include "ddp/core/cuda_check.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp {

// CUDA devices visible to this process (cuda_device_count: 0 without a driver or device; never
// throws).
inline int visible_devices(Cuda) noexcept { return cuda_device_count(); }

// Makes `device` this process's current GPU (cudaSetDevice; CudaError if it fails).
inline void set_current_device(Cuda, int device) { DDP_CUDA_CHECK(cudaSetDevice(device)); }

// Makes `device` current for a scope and restores the previous one (the nccl backend and the
// staging device ops set their communicator's device around their CUDA calls). The constructor
// throws CudaError; the destructor never throws.
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

}  // namespace ddp
