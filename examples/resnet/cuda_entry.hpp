// The resnet example's GPU entry points, defined in train_cuda.cu (built only when ddp::cuda
// exists).
// SPDX-License-Identifier: MIT
//
// main.cpp calls them only under `if constexpr (ddp::BuildConfig::with_cuda)`, so a CPU-only build
// needs no definition (a function named only in a discarded statement is not odr-used).
#pragma once

#include <string>

#include <ddp/tensor/conv_impl.hpp>

#include "train.hpp"

namespace resnet_example {

// Trains on GPU `device` (train::cuda_device_for) at `precision` ("fp32" | "tf32" | "bf16";
// ConfigError otherwise) with convolutions by `conv` (ConfigError for a cuDNN mode in a build
// without cuDNN); deterministic: Exec<Cuda>::deterministic. Returns the process exit code.
int train_cuda(Setup& s, int device, const std::string& precision, ddp::ConvImpl conv,
               bool deterministic);

}  // namespace resnet_example
