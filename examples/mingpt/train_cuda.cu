// The mingpt example on the GPU: the device main.cpp chose, a compute stream, Exec<Cuda> at the
// GEMM precision the config asks for (fp32, or bf16/fp16 with --use_amp: gemm_precision), and the
// shared training loop of train.hpp instantiated for Cuda (GPT's CUDA kernels:
// docs/decisions/0048).
// SPDX-License-Identifier: MIT
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/parallel/cuda/transport.cuh>
#include <ddp/tensor/cuda/allocator.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/prefetcher.hpp>

#include "../common/gpu_run.cuh"
#include "cuda_entry.hpp"

namespace mingpt_example {

int train_cuda(const Setup& s, int device) {
  Setup gpu = s;
  gpu.device_memory = &ddp::cuda_memory_stats;  // GPU memory in the metrics records
  return ddp_example::run_on_gpu(
      device, gemm_precision(s.cfg), false, "",
      [&](ddp::Exec<ddp::Cuda>& exec) { return train<ddp::Cuda>(gpu, exec); });
}

}  // namespace mingpt_example
