// The multinode example on the GPU: the device main.cpp chose, a compute stream, Exec<Cuda> in fp32, and the
// shared training loop of train.hpp instantiated for Cuda.
// SPDX-License-Identifier: MIT
#include <ddp/core/log.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/parallel/cuda/transport.cuh>
#include <ddp/tensor/cuda/allocator.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/stream.hpp>

#include "cuda_entry.hpp"

namespace multinode_example {

int train_cuda(const Setup& s, int device) {
  DDP_CUDA_CHECK(cudaSetDevice(device));
  ddp::Stream stream;  // blocking: orders with the legacy default stream like the resnet example's
  ddp::Exec<ddp::Cuda> exec = stream.exec(ddp::Precision::Fp32);
  DDP_LOG_INFO("training on cuda:", device, " in fp32");
  Setup gpu = s;
  gpu.device_memory = &ddp::cuda_memory_stats;  // GPU memory in the metrics records
  const int rc = train<ddp::Cuda>(gpu, exec);
  stream.synchronize();
  return rc;
}

}  // namespace multinode_example
