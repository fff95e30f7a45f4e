// Launch helpers for CUDA kernels: grid sizing, the grid-stride for_each_index kernel, block reductions.
// SPDX-License-Identifier: MIT
//
// for_each_index(exec, n, f) runs the shared element-wise functors of kernels/elementwise.hpp: one
// thread per index in a grid-stride loop, so any n fits a bounded grid. Example: n = 12,845,056
// (a 16x56x56x256 activation) with 256 threads per block gives 50,176 blocks, capped at kMaxBlocks =
// 65,536, each thread handling one index per pass. Every kernel here is a template (STYLE.md 3: a
// non-template __global__ in a header breaks the link once two .cu files include it), and every
// launch is followed by DDP_CUDA_CHECK(cudaGetLastError()).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ddp/core/cuda_check.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

inline constexpr int kThreads = 256;           // threads per block for element-wise and reduction kernels
inline constexpr std::int64_t kMaxBlocks = 65536;  // grid cap for grid-stride loops

// Blocks for n work items at `threads` per block, at least 1, at most kMaxBlocks.
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return static_cast<unsigned>(b);
}

template <class F>
__global__ void for_each_index_kernel(std::size_t n, F f) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) f(i);
}

template <class F>
void for_each_index(const Exec<Cuda>& e, std::size_t n, F f) {
  if (n == 0) return;
  for_each_index_kernel<F><<<grid_for(static_cast<std::int64_t>(n)), kThreads, 0, cuda_stream(e)>>>(n, f);
  DDP_CUDA_CHECK(cudaGetLastError());
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in thread 0.
// Fixed combination order: the same inputs give the same bits on every run.
template <class V>
__device__ V block_sum(V v) {
  __shared__ V warp_part[32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // warp_part may still be read by a previous call
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x >> 5);
  if (warp == 0) {
    v = lane < warps ? warp_part[lane] : V(0);
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  }
  return v;
}

// Maximum of v over the block; valid in every thread (broadcast through shared memory).
template <class V>
__device__ V block_max(V v) {
  __shared__ V warp_part[32];
  __shared__ V result;
  for (int off = 16; off > 0; off >>= 1) {
    const V o = __shfl_down_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x >> 5);
  if (warp == 0) {
    v = lane < warps ? warp_part[lane] : warp_part[0];
    for (int off = 16; off > 0; off >>= 1) {
      const V o = __shfl_down_sync(0xffffffffu, v, off);
      v = o > v ? o : v;
    }
    if (lane == 0) result = v;
  }
  __syncthreads();
  return result;
}

}  // namespace ddp::kernels::cuda
