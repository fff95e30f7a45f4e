// The resnet example on the GPU: the device main.cpp chose (train::cuda_device_for), a compute
// stream, Exec<Cuda> at the chosen precision and convolution implementation, and the shared
// training loop of train.hpp instantiated for Cuda.
// SPDX-License-Identifier: MIT
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/parallel/cuda/transport.cuh>
#include <ddp/tensor/cuda/allocator.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/prefetcher.hpp>

#include "../common/gpu_run.cuh"
#include "cuda_entry.hpp"

namespace resnet_example {

int train_cuda(Setup& s, int device, const std::string& precision, ddp::ConvImpl conv,
               bool deterministic) {
  s.device_memory = &ddp::cuda_memory_stats;  // GPU memory in the metrics records
  // before any step: a cuDNN mode without cuDNN fails here
  conv = ddp::resolve_conv_impl(conv);
  const std::string note = std::string(", convolutions ") + std::string(ddp::conv_impl_name(conv)) +
                           (deterministic ? " (deterministic)" : "");
  return ddp_example::run_on_gpu(device, ddp::parse_precision(precision), deterministic,
                                 note.c_str(), [&](ddp::Exec<ddp::Cuda>& exec) {
                                   exec.conv = conv;
                                   return train<ddp::Cuda>(s, exec);
                                 });
}

}  // namespace resnet_example
