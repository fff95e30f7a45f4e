// The two CUDA runtime calls the examples' main.cpp needs before the communicator exists, defined in
// cuda_device.cpp (compiled, with the CUDA runtime's headers, only when ddp::cuda exists).
// SPDX-License-Identifier: MIT
//
// main.cpp calls them only under `if constexpr (ddp::BuildConfig::with_cuda)`, so a CPU-only build needs no
// definition (a function named only in a discarded statement is not odr-used).
#pragma once

namespace ddp_example {

// CUDA devices visible to this process (0 without a driver or device; never throws).
int cuda_devices();
// Makes `device` this process's current GPU (cudaSetDevice; CudaError if it fails). Called before the
// communicator is built, so nccl's device guard finds it current and no context is created on GPU 0 by ranks
// that train elsewhere.
void use_cuda_device(int device);

}  // namespace ddp_example
