// CUDA sum of squares and scaling over many tensors (clip_grad_norm): one launch each.
// SPDX-License-Identifier: MIT
//
// sum_squares_multi: a multi-tensor launch (kernels/cuda/multi_tensor.cuh) where block b sums x^2
// over its chunk of kSumSquaresChunkCuda elements in double (block_sum, fixed order) into
// partial[b]; the host copies the partials back (this synchronises exec's stream: the norm is
// needed on the host to compute the clip factor, as torch's .item() would) and adds them in block
// order, so the value is deterministic. scale_multi: x *= alpha over every tensor in one launch, no
// host wait.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/cuda/multi_tensor.cuh"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

// 16-byte descriptors: ~20 KiB of kernel parameter
inline constexpr int kMultiNormMaxTensors = 1024;
inline constexpr std::int64_t kSumSquaresChunkCuda = std::int64_t{1} << 14;

namespace detail {

template <class T>
struct SumSquaresBatch {
  MultiTensorTable<TensorPtr<T>, kMultiNormMaxTensors> table;
  double* partial;  // one per block of this launch
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    sum_squares_multi_kernel(const __grid_constant__ SumSquaresBatch<T> b) {
  const auto blk = static_cast<std::int32_t>(blockIdx.x);
  const int k = b.table.find(blk);
  const TensorPtr<T>& t = b.table.t[k];
  const std::int64_t begin =
      static_cast<std::int64_t>(blk - b.table.block_begin[k]) * kSumSquaresChunkCuda;
  const std::int64_t end =
      begin + kSumSquaresChunkCuda < t.numel ? begin + kSumSquaresChunkCuda : t.numel;
  double acc = 0.0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = static_cast<double>(t.data[i]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) b.partial[blk] = acc;
}

template <class T>
struct ScaleBatch {
  MultiTensorTable<TensorPtr<T>, kMultiNormMaxTensors> table;
  T alpha;
};

template <class T>
__global__ void __launch_bounds__(kThreads)
    scale_multi_kernel(const __grid_constant__ ScaleBatch<T> b) {
  const auto blk = static_cast<std::int32_t>(blockIdx.x);
  const int k = b.table.find(blk);
  const TensorPtr<T>& t = b.table.t[k];
  const std::int64_t begin =
      static_cast<std::int64_t>(blk - b.table.block_begin[k]) * kSumSquaresChunkCuda;
  const std::int64_t end =
      begin + kSumSquaresChunkCuda < t.numel ? begin + kSumSquaresChunkCuda : t.numel;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) t.data[i] *= b.alpha;
}

}  // namespace detail

template <class T>
double sum_squares_multi(const Exec<Cuda>& e, const MultiTensorArgs<T, Cuda>& a) {
  validate(a);
  std::int64_t total_blocks = 0;
  for (const TensorPtr<T>& t : a.tensors)
    total_blocks += (t.numel + kSumSquaresChunkCuda - 1) / kSumSquaresChunkCuda;
  if (total_blocks == 0) return 0.0;
  const cudaStream_t s = cuda_stream(e);
  const CudaAllocStream on_stream(e);  // the partials are reused in the order of e's stream
  Tensor<double, Cuda> partial(Shape{total_blocks});
  detail::SumSquaresBatch<T> b{};
  std::int64_t offset = 0;  // blocks of earlier launches
  for_each_multi_tensor_launch(a.tensors, kSumSquaresChunkCuda, b.table, [&] {
    b.partial = partial.data() + offset;
    detail::sum_squares_multi_kernel<T>
        <<<static_cast<unsigned>(b.table.blocks()), kThreads, 0, s>>>(b);
    check_launch("sum_squares_multi_kernel", s);
    offset += b.table.blocks();
  });
  std::vector<double> host(static_cast<std::size_t>(total_blocks));
  DDP_CUDA_CHECK(cudaMemcpyAsync(host.data(), partial.data(), host.size() * sizeof(double),
                                 cudaMemcpyDeviceToHost, s));
  DDP_CUDA_CHECK(cudaStreamSynchronize(s));
  double total = 0.0;
  for (double p : host) total += p;
  return total;
}

template <class T>
void scale_multi(const Exec<Cuda>& e, const MultiScaleArgs<T, Cuda>& a) {
  validate(a);
  detail::ScaleBatch<T> b{};
  b.alpha = static_cast<T>(a.alpha);
  for_each_multi_tensor_launch(a.tensors, kSumSquaresChunkCuda, b.table, [&] {
    detail::scale_multi_kernel<T>
        <<<static_cast<unsigned>(b.table.blocks()), kThreads, 0, cuda_stream(e)>>>(b);
    check_launch("scale_multi_kernel", cuda_stream(e));
  });
}

}  // namespace ddp::kernels::cuda
