// CUDA pooling in NHWC: max-pool with argmax, adaptive average pool; forward and backward, all
// deterministic.
// SPDX-License-Identifier: MIT
//
// Same rules as kernels/cpu/pool.hpp (padding acts as -infinity, first maximum in row-major window
// order wins, a NaN wins and stays; adaptive cells [floor(i H / Ho), ceil((i + 1) H / Ho))). One
// thread per output element in the forward passes; the channel index is innermost, so a warp reads
// 32 adjacent channels (coalesced). Adaptive-pool backward runs one thread per INPUT element and
// gather from the outputs whose window covers it, instead of scattering with atomics: each dx is
// then summed in a fixed order (deterministic) and written once. Max-pool backward gathers the same
// way: input (h, w) sums, in row-major output order, the dy of the outputs whose window covers it
// and whose stored argmax is h * W + w (no atomics, no zero-fill pass, the same bits on every run).
// Example: adaptive 7 -> 3 cells: rows [0,3), [2,5), [4,7); input row 2 is in cells 0 and 1 and
// receives dy0 / 9 + dy1 / 9 per column pair (3x3 cells).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/geometry.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

namespace detail {

// Arithmetic type of pooling over T: bf16 values are widened as loaded (exact) and each output
// rounded once.
template <class T>
using PoolAcc = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;

template <class T>
__global__ void max_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                          std::int32_t* __restrict__ am, PoolGeometry g) {
  const std::int64_t total = g.n * g.ho * g.wo * g.c;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const std::int64_t k = i % g.c, ow = (i / g.c) % g.wo, oh = (i / (g.c * g.wo)) % g.ho,
                       n = i / (g.c * g.wo * g.ho);
    const std::int64_t h0 = oh * g.stride.h - g.pad.h, w0 = ow * g.stride.w - g.pad.w;
    const std::int64_t hb = h0 > 0 ? h0 : 0, he = h0 + g.kernel.h < g.h ? h0 + g.kernel.h : g.h;
    const std::int64_t wb = w0 > 0 ? w0 : 0, we = w0 + g.kernel.w < g.w ? w0 + g.kernel.w : g.w;
    using C = PoolAcc<T>;
    C best = -INFINITY;
    auto arg = static_cast<std::int32_t>(hb * g.w + wb);
    for (std::int64_t hi = hb; hi < he; ++hi)
      for (std::int64_t wi = wb; wi < we; ++wi) {
        const C v = static_cast<C>(x[((n * g.h + hi) * g.w + wi) * g.c + k]);
        if ((v > best) || ((v != v) && (best == best))) {
          best = v;
          arg = static_cast<std::int32_t>(hi * g.w + wi);
        }
      }
    y[i] = static_cast<T>(best);
    if (am) am[i] = arg;
  }
}

// dx[n][h][w][k] = sum of dy[n][oh][ow][k] over the outputs (oh, ow) whose window covers (h, w) and
// whose argmax is h * W + w. Output rows covering input row h: oh * s - p <= h <= oh * s - p + kh -
// 1, i.e. oh in [ceil((h + p - kh + 1) / s), floor((h + p) / s)] within [0, Ho); the same for
// columns.
template <class T>
__global__ void max_pool2d_backward_kernel(const T* __restrict__ dy,
                                           const std::int32_t* __restrict__ am, T* __restrict__ dx,
                                           PoolGeometry g) {
  const std::int64_t total = g.n * g.h * g.w * g.c;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const std::int64_t k = i % g.c, wi = (i / g.c) % g.w, hi = (i / (g.c * g.w)) % g.h,
                       n = i / (g.c * g.w * g.h);
    const std::int64_t th = hi + g.pad.h - g.kernel.h + 1, tw = wi + g.pad.w - g.kernel.w + 1;
    std::int64_t oh0 = th > 0 ? (th + g.stride.h - 1) / g.stride.h : 0;
    std::int64_t ow0 = tw > 0 ? (tw + g.stride.w - 1) / g.stride.w : 0;
    std::int64_t oh1 = (hi + g.pad.h) / g.stride.h, ow1 = (wi + g.pad.w) / g.stride.w;  // inclusive
    if (oh1 > g.ho - 1) oh1 = g.ho - 1;
    if (ow1 > g.wo - 1) ow1 = g.wo - 1;
    const auto self = static_cast<std::int32_t>(hi * g.w + wi);
    PoolAcc<T> acc = 0;
    for (std::int64_t oh = oh0; oh <= oh1; ++oh)
      for (std::int64_t ow = ow0; ow <= ow1; ++ow) {
        const std::int64_t o = ((n * g.ho + oh) * g.wo + ow) * g.c + k;
        if (am[o] == self) acc += static_cast<PoolAcc<T>>(dy[o]);
      }
    dx[i] = static_cast<T>(acc);
  }
}

template <class T>
__global__ void adaptive_avg_pool2d_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                   PoolGeometry g) {
  const std::int64_t total = g.n * g.ho * g.wo * g.c;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const std::int64_t k = i % g.c, j = (i / g.c) % g.wo, r = (i / (g.c * g.wo)) % g.ho,
                       n = i / (g.c * g.wo * g.ho);
    const std::int64_t hb = pool_start(r, g.h, g.ho), he = pool_end(r, g.h, g.ho);
    const std::int64_t wb = pool_start(j, g.w, g.wo), we = pool_end(j, g.w, g.wo);
    using C = PoolAcc<T>;
    C acc = C(0);
    for (std::int64_t hi = hb; hi < he; ++hi)
      for (std::int64_t wi = wb; wi < we; ++wi)
        acc += static_cast<C>(x[((n * g.h + hi) * g.w + wi) * g.c + k]);
    y[i] = static_cast<T>(acc * (C(1) / static_cast<C>((he - hb) * (we - wb))));
  }
}

// Cells along one axis that contain input index `v`: start(i) <= v < end(i). Cells are monotone in
// i, so the range is contiguous; it starts at most one before floor(v * out / in).
__host__ __device__ inline void cells_covering(std::int64_t v, std::int64_t in, std::int64_t out,
                                               std::int64_t& lo, std::int64_t& hi_excl) {
  std::int64_t i = (v * out) / in;
  if (i > 0 && pool_end(i - 1, in, out) > v) --i;
  while (i > 0 && pool_end(i - 1, in, out) > v) --i;
  lo = i;
  std::int64_t j = i;
  while (j < out && pool_start(j, in, out) <= v) ++j;
  hi_excl = j;
}

template <class T>
__global__ void adaptive_avg_pool2d_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx,
                                                    PoolGeometry g) {
  const std::int64_t total = g.n * g.h * g.w * g.c;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const std::int64_t k = i % g.c, wi = (i / g.c) % g.w, hi = (i / (g.c * g.w)) % g.h,
                       n = i / (g.c * g.w * g.h);
    std::int64_t r0, r1, j0, j1;
    cells_covering(hi, g.h, g.ho, r0, r1);
    cells_covering(wi, g.w, g.wo, j0, j1);
    using C = PoolAcc<T>;
    C acc = C(0);
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t j = j0; j < j1; ++j) {
        const std::int64_t cell = (pool_end(r, g.h, g.ho) - pool_start(r, g.h, g.ho)) *
                                  (pool_end(j, g.w, g.wo) - pool_start(j, g.w, g.wo));
        acc += static_cast<C>(dy[((n * g.ho + r) * g.wo + j) * g.c + k]) *
               (C(1) / static_cast<C>(cell));
      }
    dx[i] = static_cast<T>(acc);
  }
}

}  // namespace detail

template <class T>
void max_pool2d_forward(const Exec<Cuda>& e, const MaxPool2dForwardArgs<T, Cuda>& a) {
  validate(a);
  const PoolGeometry g = pool_geometry(a.x, a.y, a.kernel, a.stride, a.padding);
  detail::max_pool2d_forward_kernel<T><<<grid_for(a.y.numel()), kThreads, 0, cuda_stream(e)>>>(
      a.x.data(), a.y.data(), a.argmax.empty() ? nullptr : a.argmax.data(), g);
  check_launch("max_pool2d_forward_kernel", cuda_stream(e));
}

template <class T>
void max_pool2d_backward(const Exec<Cuda>& e, const MaxPool2dBackwardArgs<T, Cuda>& a) {
  validate(a);
  const PoolGeometry g = pool_geometry(a.dx, a.dy, a.kernel, a.stride, a.padding);
  // The geometry must be the forward's: the output shape it implies must be dy's.
  const std::int64_t ho = conv_out_size(g.h, g.kernel.h, g.stride.h, g.pad.h, 1);
  const std::int64_t wo = conv_out_size(g.w, g.kernel.w, g.stride.w, g.pad.w, 1);
  if (ho != g.ho || wo != g.wo || g.kernel.h < 1 || g.kernel.w < 1 || g.stride.h < 1 ||
      g.stride.w < 1)
    throw ValueError(ddp::detail::str("ddp: max_pool2d_backward: kernel (", g.kernel.h, ", ",
                                      g.kernel.w, "), stride (", g.stride.h, ", ", g.stride.w,
                                      ") and padding (", g.pad.h, ", ", g.pad.w, ") give a ", ho,
                                      "x", wo, " output for dx ", a.dx.shape(), " but dy is ",
                                      a.dy.shape(), "; pass the forward's window geometry"));
  detail::max_pool2d_backward_kernel<T><<<grid_for(a.dx.numel()), kThreads, 0, cuda_stream(e)>>>(
      a.dy.data(), a.argmax.data(), a.dx.data(), g);
  check_launch("max_pool2d_backward_kernel", cuda_stream(e));
}

template <class T>
void adaptive_avg_pool2d_forward(const Exec<Cuda>& e,
                                 const AdaptiveAvgPool2dForwardArgs<T, Cuda>& a) {
  validate(a);
  const PoolGeometry g = pool_geometry(a.x, a.y);
  detail::adaptive_avg_pool2d_forward_kernel<T>
      <<<grid_for(a.y.numel()), kThreads, 0, cuda_stream(e)>>>(a.x.data(), a.y.data(), g);
  check_launch("adaptive_avg_pool2d_forward_kernel", cuda_stream(e));
}

template <class T>
void adaptive_avg_pool2d_backward(const Exec<Cuda>& e,
                                  const AdaptiveAvgPool2dBackwardArgs<T, Cuda>& a) {
  validate(a);
  const PoolGeometry g = pool_geometry(a.dx, a.dy);
  detail::adaptive_avg_pool2d_backward_kernel<T>
      <<<grid_for(a.dx.numel()), kThreads, 0, cuda_stream(e)>>>(a.dy.data(), a.dx.data(), g);
  check_launch("adaptive_avg_pool2d_backward_kernel", cuda_stream(e));
}

}  // namespace ddp::kernels::cuda
