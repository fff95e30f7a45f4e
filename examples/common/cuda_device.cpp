// The examples' CUDA runtime calls (cuda_device.hpp); needs the CUDA runtime's headers, not nvcc.
// SPDX-License-Identifier: MIT
#include "cuda_device.hpp"

#include <ddp/core/cuda_check.hpp>
#include <ddp/tensor/cuda/stream.hpp>

namespace ddp_example {

int cuda_devices() { return ddp::cuda_device_count(); }

void use_cuda_device(int device) { DDP_CUDA_CHECK(cudaSetDevice(device)); }

}  // namespace ddp_example
