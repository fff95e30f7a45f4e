// CUDA multi-tensor SGD: torch.optim.SGD's step over every parameter tensor in one kernel launch.
// SPDX-License-Identifier: MIT
//
// The tensors' descriptors {param, grad, momentum buffer, numel, first_step} travel as one kernel
// parameter (kernels/cuda/multi_tensor.cuh: up to kMultiSgdMaxTensors descriptors, ~22 KiB); each
// block updates one chunk of kMultiSgdChunk elements of one tensor with the shared SgdStep functor
// of kernels/elementwise.hpp (the CPU's arithmetic, written once).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/cuda/multi_tensor.cuh"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

inline constexpr int kMultiSgdMaxTensors = 512;
inline constexpr std::int64_t kMultiSgdChunk = std::int64_t{1} << 14;  // elements per block

namespace detail {

template <class T>
struct MultiSgdBatch {
  MultiTensorTable<SgdTensor<T>, kMultiSgdMaxTensors> table;
  T lr, momentum, dampening, weight_decay;
  bool nesterov, use_momentum, use_weight_decay;
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    sgd_multi_kernel(const __grid_constant__ MultiSgdBatch<T> b) {
  const auto blk = static_cast<std::int32_t>(blockIdx.x);
  const int lo = b.table.find(blk);
  const SgdTensor<T>& t = b.table.t[lo];
  const std::int64_t begin =
      static_cast<std::int64_t>(blk - b.table.block_begin[lo]) * kMultiSgdChunk;
  const std::int64_t end = begin + kMultiSgdChunk < t.numel ? begin + kMultiSgdChunk : t.numel;
  const SgdStep<T> f{.param = t.param,
                     .grad = t.grad,
                     .buf = b.use_momentum ? t.momentum_buffer : nullptr,
                     .lr = b.lr,
                     .momentum = b.momentum,
                     .dampening = b.dampening,
                     .weight_decay = b.weight_decay,
                     .first_step = t.first_step,
                     .nesterov = b.nesterov,
                     .use_momentum = b.use_momentum,
                     .use_weight_decay = b.use_weight_decay};
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    f(static_cast<std::size_t>(i));
}

}  // namespace detail

template <class T>
void sgd_step_multi(const Exec<Cuda>& e, const MultiSgdArgs<T, Cuda>& a) {
  validate(a);
  detail::MultiSgdBatch<T> b{};
  b.lr = static_cast<T>(a.lr);
  b.momentum = static_cast<T>(a.momentum);
  b.dampening = static_cast<T>(a.dampening);
  b.weight_decay = static_cast<T>(a.weight_decay);
  b.nesterov = a.nesterov;
  b.use_momentum = a.momentum != 0.0;
  b.use_weight_decay = a.weight_decay != 0.0;
  for_each_multi_tensor_launch(a.tensors, kMultiSgdChunk, b.table, [&] {
    detail::sgd_multi_kernel<T>
        <<<static_cast<unsigned>(b.table.blocks()), kThreads, 0, cuda_stream(e)>>>(b);
    check_launch("sgd_multi_kernel", cuda_stream(e));
  });
}

}  // namespace ddp::kernels::cuda
