// The CUDA side of binding a process to its GPU, as calls on the device tag: visible_devices(Cuda{}) and
// set_current_device(Cuda{}, n). train/init.hpp reaches them by argument-dependent lookup, so it names no CUDA
// symbol and compiles without CUDA; comm/factory.hpp includes this header in builds with CUDA. Host API only:
// any C++ compiler against cudart, no nvcc needed.
// SPDX-License-Identifier: MIT
#pragma once

#include <cuda_runtime.h>

#include "ddp/core/cuda_check.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp {

// CUDA devices visible to this process (cuda_device_count: 0 without a driver or device; never throws).
inline int visible_devices(Cuda) noexcept { return cuda_device_count(); }

// Makes `device` this process's current GPU (cudaSetDevice; CudaError if it fails).
inline void set_current_device(Cuda, int device) { DDP_CUDA_CHECK(cudaSetDevice(device)); }

}  // namespace ddp
