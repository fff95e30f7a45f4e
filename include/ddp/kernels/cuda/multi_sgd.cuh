// CUDA multi-tensor SGD: torch.optim.SGD's step over every parameter tensor in one kernel launch.
// SPDX-License-Identifier: MIT
//
// How it works. The tensors' descriptors {param, grad, momentum buffer, numel, first_step} travel as one
// kernel parameter (a __grid_constant__ struct of up to kMultiSgdMaxTensors descriptors, ~22 KiB: kernel
// parameters may be up to 32 KiB since CUDA 12.1 on Volta and newer), so nothing is uploaded and the host
// never waits. Each tensor is cut into chunks of kMultiSgdChunk elements; block b finds its tensor by
// binary search in the prefix table block_begin and updates one chunk with the shared SgdStep functor of
// kernels/elementwise.hpp (the CPU's arithmetic, STYLE.md 3). More tensors than fit are sent in several
// launches. Example: ResNet-50 (161 tensors, 25.6 M elements) -> one launch of ~1,650 blocks instead of
// 161 launches, most of them too small to fill an H100.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/cuda/launch.cuh"
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
  SgdTensor<T> t[kMultiSgdMaxTensors];
  std::int32_t block_begin[kMultiSgdMaxTensors + 1];  // tensor i owns blocks [block_begin[i], block_begin[i + 1])
  int count;
  T lr, momentum, dampening, weight_decay;
  bool nesterov, use_momentum, use_weight_decay;
};

template <class T>
__global__ void __launch_bounds__(kThreads) sgd_multi_kernel(const __grid_constant__ MultiSgdBatch<T> b) {
  const auto blk = static_cast<std::int32_t>(blockIdx.x);
  int lo = 0, hi = b.count;  // invariant: block_begin[lo] <= blk < block_begin[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (b.block_begin[mid] <= blk)
      lo = mid;
    else
      hi = mid;
  }
  const SgdTensor<T>& t = b.t[lo];
  const std::int64_t begin = static_cast<std::int64_t>(blk - b.block_begin[lo]) * kMultiSgdChunk;
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
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) f(static_cast<std::size_t>(i));
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
  auto launch = [&] {
    if (b.count == 0) return;
    detail::sgd_multi_kernel<T><<<static_cast<unsigned>(b.block_begin[b.count]), kThreads, 0, cuda_stream(e)>>>(b);
    check_launch("sgd_multi_kernel", cuda_stream(e));
    b.count = 0;
  };
  constexpr std::int64_t kMaxBlocksPerLaunch = 2147483647 - 65536;
  for (const SgdTensor<T>& t : a.tensors) {
    if (t.numel == 0) continue;
    const std::int64_t blocks = (t.numel + kMultiSgdChunk - 1) / kMultiSgdChunk;
    if (b.count == kMultiSgdMaxTensors || (b.count > 0 && b.block_begin[b.count] + blocks > kMaxBlocksPerLaunch))
      launch();
    if (b.count == 0) b.block_begin[0] = 0;
    b.t[b.count] = t;
    b.block_begin[b.count + 1] = static_cast<std::int32_t>(b.block_begin[b.count] + blocks);
    ++b.count;
  }
  launch();
}

}  // namespace ddp::kernels::cuda
