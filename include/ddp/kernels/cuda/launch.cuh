// CUDA launch helpers: grid sizing, the grid-stride for_each_index kernel, block reductions.
// SPDX-License-Identifier: MIT
//
// for_each_index(exec, n, f) runs the element-wise functors of kernels/elementwise.hpp: one thread
// per index in a grid-stride loop, so any n fits a grid of at most kMaxBlocks. Example: a
// 16x56x56x256 activation (n = 12,845,056) at 256 threads per block takes 50,176 blocks, one index
// per thread. Kernels here are templates: a non-template __global__ in a header breaks the link
// once two .cu files include it. Every launch is followed by check_launch(name, stream).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cuda/sync_check.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

// threads per block for element-wise and reduction kernels
inline constexpr int kThreads = 256;
inline constexpr std::int64_t kMaxBlocks = 65536;  // grid cap for grid-stride loops

// Blocks for n work items at `threads` per block, at least 1, at most kMaxBlocks.
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return static_cast<unsigned>(b);
}

namespace detail {

// "0 (the legacy default stream)" or the handle in hex, for error messages.
inline std::string stream_name(cudaStream_t s) {
  if (s == nullptr) return "0 (the legacy default stream)";
  return ddp::detail::str("0x", std::hex, reinterpret_cast<std::uintptr_t>(s));
}

// The DDP_CUDA_SYNC_CHECK wait: the host waits for `stream`; a failure throws naming what() (called
// only then). Skipped while the stream is being captured into a CUDA graph (its work runs at
// replay; a wait would end the capture).
template <class What>
void sync_check(const What& what, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
      capture != cudaStreamCaptureStatusNone)
    return;
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    throw CudaError(ddp::detail::str("ddp: ", what(), " on stream ", stream_name(stream),
                                     " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
                                     "); found by ", kSyncCheckVar,
                                     "=1, which waits for the stream after every launch"));
}

// "kernel NAME" or "kernel NAME<ARG>".
inline std::string kernel_label(std::string_view kernel, std::string_view arg) {
  return arg.empty() ? ddp::detail::str("kernel ", kernel)
                     : ddp::detail::str("kernel ", kernel, "<", arg, ">");
}

}  // namespace detail

// After every kernel launch on `stream`: a failed launch (bad configuration, no image for this GPU)
// throws a CudaError naming `kernel` (and template argument `arg`, if given) and the stream. With
// DDP_CUDA_SYNC_CHECK=1 the host also waits for the stream, so a fault inside the kernel throws
// here, not at a later synchronising call; otherwise it costs one cudaGetLastError.
inline void check_launch(std::string_view kernel, cudaStream_t stream, std::string_view arg = {}) {
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    throw CudaError(ddp::detail::str("ddp: launch of ", detail::kernel_label(kernel, arg),
                                     " on stream ", detail::stream_name(stream), " failed: ",
                                     cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  if (sync_check_enabled())
    detail::sync_check([&] { return detail::kernel_label(kernel, arg); }, stream);
}

// After a library call that launches its own kernels on `stream` (cuBLAS reports launch failures in
// its status): only the DDP_CUDA_SYNC_CHECK wait, naming `call`.
inline void sync_check_after(std::string_view call, cudaStream_t stream) {
  if (sync_check_enabled()) detail::sync_check([&] { return call; }, stream);
}

// The type name of F as the compiler spells it, e.g. "ddp::kernels::ReluForward<float>" (for error
// messages; a view of a static string, so naming costs nothing until an error is built).
template <class F>
std::string_view type_name() {
  // "... type_name() [with F = X; ...]" (GCC) or "... type_name<F>() [with F=X]" (nvcc's front end)
  std::string_view p = __PRETTY_FUNCTION__;
  const auto b = p.find("[with F");
  if (b == std::string_view::npos) return p;
  p.remove_prefix(b + 7);
  while (!p.empty() && (p.front() == ' ' || p.front() == '=')) p.remove_prefix(1);
  return p.substr(0, std::min(p.find(';'), p.rfind(']')));
}

template <class F>
__global__ void for_each_index_kernel(std::size_t n, F f) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step)
    f(i);
}

template <class F>
void for_each_index(const Exec<Cuda>& e, std::size_t n, F f) {
  if (n == 0) return;
  for_each_index_kernel<F>
      <<<grid_for(static_cast<std::int64_t>(n)), kThreads, 0, cuda_stream(e)>>>(n, f);
  check_launch("for_each_index_kernel", cuda_stream(e), type_name<F>());
}

// Warp sum and maximum, valid in every lane (butterfly: the same order in every lane and run).
template <class V>
__device__ V warp_sum_all(V v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
template <class V>
__device__ V warp_max_all(V v) {
  for (int off = 16; off > 0; off >>= 1) {
    const V o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

// Kernels that give each row one warp (layer_norm.cuh, attention.cuh's softmax): kThreads / 32 rows
// per block, row blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32.
inline constexpr int kWarpRowsPerBlock = kThreads / 32;
inline unsigned warp_row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
}
__device__ inline std::int64_t warp_row() {
  return static_cast<std::int64_t>(blockIdx.x) * kWarpRowsPerBlock + (threadIdx.x >> 5);
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in
// thread 0. Fixed combination order: the same inputs give the same bits on every run.
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
