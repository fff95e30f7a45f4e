// The multinode example on the GPU: the device main.cpp chose, a compute stream and Exec<Cuda> in
// fp32 (../common/gpu_run.cuh), and the shared training loop of train.hpp instantiated for Cuda.
// SPDX-License-Identifier: MIT
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/parallel/cuda/transport.cuh>
#include <ddp/tensor/cuda/allocator.hpp>
#include <ddp/tensor/cuda/copy.hpp>

#include "../common/gpu_run.cuh"
#include "cuda_entry.hpp"

namespace multinode_example {

int train_cuda(const Setup& s, int device) {
  Setup gpu = s;
  gpu.device_memory = &ddp::cuda_memory_stats;  // GPU memory in the metrics records
  return ddp_example::run_on_gpu(
      device, ddp::Precision::Fp32, false, "",
      [&](ddp::Exec<ddp::Cuda>& exec) { return train<ddp::Cuda>(gpu, exec); });
}

}  // namespace multinode_example
