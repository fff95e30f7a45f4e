// The multinode example's GPU entry point, defined in train_cuda.cu (built only when ddp::cuda
// exists).
// SPDX-License-Identifier: MIT
//
// main.cpp calls it only under `if constexpr (ddp::BuildConfig::with_cuda)`, so a CPU-only build
// needs no definition (a function named only in a discarded statement is not odr-used).
#pragma once

#include "train.hpp"

namespace multinode_example {

// Trains on GPU `device` (train::cuda_device_for) in fp32 (the tutorial's arithmetic; Linear goes
// to cuBLAS without TF32). Returns the process exit code.
int train_cuda(const Setup& s, int device);

}  // namespace multinode_example
