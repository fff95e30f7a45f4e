// CUDA multi-tensor AdamW: torch.optim.AdamW's step over every parameter tensor in one kernel
// launch.
// SPDX-License-Identifier: MIT
//
// The host turns each tensor's lr, weight decay and step count into its AdamwStep functor
// (adamw_step_for, kernels/fused_args.hpp: the bias corrections in double, as on the CPU) and sends
// the functors as the descriptors of a multi-tensor launch (kernels/cuda/multi_tensor.cuh: up to
// kMultiAdamwMaxTensors of ~72 bytes, ~19 KiB of kernel parameter); each block runs its tensor's
// functor over one chunk.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/cuda/multi_tensor.cuh"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

inline constexpr int kMultiAdamwMaxTensors = 256;
inline constexpr std::int64_t kMultiAdamwChunk = std::int64_t{1} << 14;  // elements per block

namespace detail {

template <class T>
struct AdamwDesc {
  AdamwStep<T> f;
  std::int64_t numel;
};

template <class T>
struct MultiAdamwBatch {
  MultiTensorTable<AdamwDesc<T>, kMultiAdamwMaxTensors> table;
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    adamw_multi_kernel(const __grid_constant__ MultiAdamwBatch<T> b) {
  const auto blk = static_cast<std::int32_t>(blockIdx.x);
  const int k = b.table.find(blk);
  const AdamwDesc<T>& d = b.table.t[k];
  const std::int64_t begin =
      static_cast<std::int64_t>(blk - b.table.block_begin[k]) * kMultiAdamwChunk;
  const std::int64_t end = begin + kMultiAdamwChunk < d.numel ? begin + kMultiAdamwChunk : d.numel;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    d.f(static_cast<std::size_t>(i));
}

}  // namespace detail

template <class T>
void adamw_step_multi(const Exec<Cuda>& e, const MultiAdamwArgs<T, Cuda>& a) {
  validate(a);
  std::vector<detail::AdamwDesc<T>> descs;
  descs.reserve(a.tensors.size());
  for (const AdamwTensor<T>& t : a.tensors)
    descs.push_back({.f = adamw_step_for(t, a.beta1, a.beta2, a.eps), .numel = t.numel});
  detail::MultiAdamwBatch<T> b{};
  for_each_multi_tensor_launch(
      std::span<const detail::AdamwDesc<T>>(descs), kMultiAdamwChunk, b.table, [&] {
        detail::adamw_multi_kernel<T>
            <<<static_cast<unsigned>(b.table.blocks()), kThreads, 0, cuda_stream(e)>>>(b);
        check_launch("adamw_multi_kernel", cuda_stream(e));
      });
}

}  // namespace ddp::kernels::cuda
