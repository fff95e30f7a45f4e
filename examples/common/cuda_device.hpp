// The two CUDA runtime calls the examples make before the communicator exists (placement.hpp uses them),
// defined in cuda_device.cpp, which is compiled, with the CUDA runtime's headers, only when ddp::cuda exists.
// SPDX-License-Identifier: MIT
#pragma once

namespace ddp_example {

// CUDA devices visible to this process (0 without a driver or device; never throws).
int cuda_devices();
// Makes `device` this process's current GPU (cudaSetDevice; CudaError if it fails).
void use_cuda_device(int device);

}  // namespace ddp_example
