// The resnet example on the GPU: the device main.cpp chose (train::cuda_device_for), a compute stream,
// Exec<Cuda> at the chosen precision, and the shared training loop of train.hpp instantiated for Cuda.
// SPDX-License-Identifier: MIT
#include <ddp/core/log.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/parallel/cuda/transport.cuh>
#include <ddp/tensor/cuda/allocator.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/prefetcher.hpp>
#include <ddp/tensor/cuda/stream.hpp>

#include "cuda_entry.hpp"

namespace resnet_example {

int train_cuda(Setup& s, int device, const std::string& precision, bool deterministic) {
  const ddp::Precision p = ddp::parse_precision(precision);
  DDP_CUDA_CHECK(cudaSetDevice(device));
  ddp::Stream stream;  // blocking: orders with the allocator's frees on the legacy default stream
  ddp::Exec<ddp::Cuda> exec = stream.exec(p, deterministic);
  DDP_LOG_INFO("training on cuda:", device, " at precision ", ddp::precision_name(p),
               deterministic ? " (deterministic)" : "");
  s.device_memory = &ddp::cuda_memory_stats;  // GPU memory in the metrics records
  const int rc = train<ddp::Cuda>(s, exec);
  stream.synchronize();
  return rc;
}

}  // namespace resnet_example
