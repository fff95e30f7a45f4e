// CUDA batch normalisation over the channel (last) dimension: training and eval forward, and
// backward.
// SPDX-License-Identifier: MIT
//
// Same formulas as kernels/cpu/batchnorm.hpp. x (N, H, W, C) is M = N*H*W rows of C channels, cut
// into tiles of channels and chunks of rows (bn_stats.hpp's BnGeometry); the kernel bodies are
// bn_stats.hpp's host/device arithmetic, tested by a host emulation (docs/decisions/0063).
// Training forward, three launches:
//   1. bn_moments_kernel: grid (tiles, chunks), block (cols, lanes); each thread's rows in shifted
//      float segments merged into double moments (n, mean, M2), lanes merged in a fixed tree ->
//      partial (chunks, C). One read of x (16-byte vector loads when aligned), no mean pass.
//   2. bn_finalize_kernel: grid ceil(C / 32), block (32 channels, 16 chunk lanes) merges the chunks
//      in a fixed order, then BnChannelOutputs::finish (save_mean/invstd, running statistics with
//      the unbiased variance, num_batches_tracked, scale and shift).
//   3. bn_act_apply_kernel: y = x scale + shift (+ residual, ReLU for bn_act.cuh) on a 2-D grid
//      (tiles, row blocks), scale and shift in registers: no per-element i % C.
// Backward: bn_grad_sums_kernel (sum g, sum g xhat), bn_grad_finalize_kernel (dgamma, dbeta, and
// k1..k3 of dx = k1 g + k2 (x - mean) + k3; k2 = k3 = 0 in eval), bn_act_backward_apply_kernel.
// Every summation order is fixed by the geometry: results repeat bit for bit. Synchronised
// (Args::sync, training; docs/decisions/0027): the finalize kernels write this rank's (2C + 1)
// sums instead (sum x = n mean, sum x^2 = M2 + n mean^2; or sum g, sum g xhat; and M), the reducer
// all-reduces them on the exec's stream, and kernels/batchnorm_sync.hpp's functors finish. An
// empty local batch (rows 0) launches no pass over x and contributes zeros.
// Example: ResNet's bn1 at batch 16: M = 200,704, C = 64 -> vec 4, block (16, 16), grid (1, 784)
// for the moments (256 rows per chunk, 16 per thread); the finalize is 2 blocks of 512 threads.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/batchnorm_sync.hpp"
#include "ddp/kernels/bn_stats.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/cuda/op_profile.cuh"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

namespace detail {

static_assert(sizeof(BnMoments) == 3 * sizeof(double), "BnMoments is stored as three doubles");

// Block (cols, lanes) covers tile blockIdx.x of chunk blockIdx.y -> partial (chunks, C).
template <class T, int V>
__global__ void __launch_bounds__(kBnBlockThreads)
    bn_moments_kernel(const T* __restrict__ x, BnGeometry g, BnMoments* __restrict__ partial) {
  // BnMoments [lane][col * V + l] (no constructor in shared)
  __shared__ double raw[3 * kBnBlockThreads * V];
  BnMoments* s = reinterpret_cast<BnMoments*>(raw);
  const int col = static_cast<int>(threadIdx.x), lane = static_cast<int>(threadIdx.y),
            w = g.cols * V;
  const std::int64_t ch0 = g.channel(blockIdx.x, col), chunk = blockIdx.y;
  BnMoments m[V];
  if (ch0 < g.c)
    bn_thread_moments<T, V>(x + ch0, g.c, g.chunk_begin(chunk) + lane, g.chunk_end(chunk), g.lanes,
                            m);
  for (int l = 0; l < V; ++l) s[lane * w + col * V + l] = m[l];
  __syncthreads();
  for (int h = g.lanes / 2; h > 0; h /= 2) {
    if (lane < h)
      for (int l = 0; l < V; ++l) bn_tree_step(s, lane, h, w, col * V + l);
    __syncthreads();
  }
  if (lane == 0 && ch0 < g.c)
    for (int l = 0; l < V; ++l) partial[chunk * g.c + ch0 + l] = s[col * V + l];
}

// Chunks -> one channel's moments per thread of lane 0. sums == nullptr: BnChannelOutputs::finish;
// else this rank's synchronised sums (2C + 1): sum x, sum x^2, M.
template <class T>
__global__ void __launch_bounds__(kBnFinCols* kBnFinLanes)
    bn_finalize_kernel(const BnMoments* __restrict__ partial, std::int64_t chunks, std::int64_t c,
                       BnChannelOutputs<T> out, double* __restrict__ sums) {
  __shared__ double raw[3 * kBnFinCols * kBnFinLanes];
  BnMoments* s = reinterpret_cast<BnMoments*>(raw);
  const int col = static_cast<int>(threadIdx.x), lane = static_cast<int>(threadIdx.y);
  const std::int64_t ch = static_cast<std::int64_t>(blockIdx.x) * kBnFinCols + col;
  s[lane * kBnFinCols + col] = ch < c ? bn_merge_chunks(partial, chunks, c, ch, lane) : BnMoments{};
  __syncthreads();
  for (int h = kBnFinLanes / 2; h > 0; h /= 2) {
    if (lane < h) bn_tree_step(s, lane, h, kBnFinCols, col);
    __syncthreads();
  }
  if (lane != 0 || ch >= c) return;
  const BnMoments m = s[col];
  if (sums) {
    sums[ch] = m.n * m.mean;
    sums[c + ch] = m.m2 + m.n * m.mean * m.mean;
    if (ch == 0) sums[2 * c] = m.n;
    return;
  }
  out.finish(ch, m.mean, m.m2 / m.n, m.n);
}

// Eval: the running statistics normalise (one index per channel).
template <class T>
struct BnEvalFinish {
  BnChannelOutputs<T> out;
  __device__ void operator()(std::size_t i) const { out.finish_eval(static_cast<std::int64_t>(i)); }
};

// partial (2, chunks, C) = sum g, sum g (x - mean) invstd per chunk; g = dy, or dy * (ymask > 0)
// with ymask (bn_act.cuh's ReLU). T: the statistics' type, A: the activations' (bf16 widened).
template <class T, class A, int V>
__global__ void __launch_bounds__(kBnBlockThreads)
    bn_grad_sums_kernel(const A* __restrict__ x, const A* __restrict__ dy,
                        const A* __restrict__ ymask, const T* __restrict__ save_mean,
                        const T* __restrict__ save_invstd, BnGeometry g,
                        double* __restrict__ partial) {
  __shared__ double s0[kBnBlockThreads * V], s1[kBnBlockThreads * V];
  const int col = static_cast<int>(threadIdx.x), lane = static_cast<int>(threadIdx.y),
            w = g.cols * V;
  const std::int64_t ch0 = g.channel(blockIdx.x, col), chunk = blockIdx.y;
  double sg[V], sgx[V];
  for (int l = 0; l < V; ++l) sg[l] = sgx[l] = 0.0;
  if (ch0 < g.c) {
    BnAcc<A> mu[V], is[V];
    for (int l = 0; l < V; ++l) {
      mu[l] = static_cast<BnAcc<A>>(save_mean[ch0 + l]);
      is[l] = static_cast<BnAcc<A>>(save_invstd[ch0 + l]);
    }
    bn_thread_grad_sums<A, V>(x + ch0, dy + ch0, ymask ? ymask + ch0 : nullptr, mu, is, g.c,
                              g.chunk_begin(chunk) + lane, g.chunk_end(chunk), g.lanes, sg, sgx);
  }
  for (int l = 0; l < V; ++l) {
    s0[lane * w + col * V + l] = sg[l];
    s1[lane * w + col * V + l] = sgx[l];
  }
  __syncthreads();
  for (int h = g.lanes / 2; h > 0; h /= 2) {
    if (lane < h)
      for (int l = 0; l < V; ++l) {
        bn_tree_step(s0, lane, h, w, col * V + l);
        bn_tree_step(s1, lane, h, w, col * V + l);
      }
    __syncthreads();
  }
  if (lane == 0 && ch0 < g.c)
    for (int l = 0; l < V; ++l) {
      partial[chunk * g.c + ch0 + l] = s0[col * V + l];
      partial[(g.chunks + chunk) * g.c + ch0 + l] = s1[col * V + l];
    }
}

// Chunks -> dbeta = sum g, dgamma = sum g xhat (either nullable), then either coef = [k1, k2, k3]
// (C each) or, synchronised (sums != nullptr), this rank's sums (2C + 1): sum g, sum g xhat, M.
template <class T>
__global__ void __launch_bounds__(kBnFinCols* kBnFinLanes)
    bn_grad_finalize_kernel(const double* __restrict__ partial, std::int64_t chunks, std::int64_t c,
                            std::int64_t rows, bool training, const T* __restrict__ gamma,
                            const T* __restrict__ invstd, T* __restrict__ dgamma,
                            T* __restrict__ dbeta, T* __restrict__ coef,
                            double* __restrict__ sums) {
  __shared__ double s0[kBnFinCols * kBnFinLanes], s1[kBnFinCols * kBnFinLanes];
  const int col = static_cast<int>(threadIdx.x), lane = static_cast<int>(threadIdx.y);
  const std::int64_t ch = static_cast<std::int64_t>(blockIdx.x) * kBnFinCols + col;
  double sg = 0.0, sgx = 0.0;
  if (ch < c) bn_add_chunks(partial, chunks, c, ch, lane, sg, sgx);
  s0[lane * kBnFinCols + col] = sg;
  s1[lane * kBnFinCols + col] = sgx;
  __syncthreads();
  for (int h = kBnFinLanes / 2; h > 0; h /= 2) {
    if (lane < h) {
      bn_tree_step(s0, lane, h, kBnFinCols, col);
      bn_tree_step(s1, lane, h, kBnFinCols, col);
    }
    __syncthreads();
  }
  if (lane != 0 || ch >= c) return;
  sg = s0[col];
  sgx = s1[col];
  if (dbeta) dbeta[ch] = static_cast<T>(sg);
  if (dgamma) dgamma[ch] = static_cast<T>(sgx);
  if (sums) {
    sums[ch] = sg;
    sums[c + ch] = sgx;
    if (ch == 0) sums[2 * c] = static_cast<double>(rows);
    return;
  }
  bn_dx_coefficients(static_cast<double>(gamma[ch]), static_cast<double>(invstd[ch]), sg, sgx,
                     static_cast<double>(rows), training, coef[ch], coef[c + ch], coef[2 * c + ch]);
}

// y = act(x scale + shift + residual), coef = [scale (C), shift (C)]; residual nullable; act =
// ReLU (NaN stays) when relu, else identity. y may be x (same thread reads, then writes).
// Arithmetic in T; x, residual, y of type A: bf16 widened on load, y rounded once after the ReLU.
template <class T, class A, int V>
__global__ void __launch_bounds__(kBnBlockThreads)
    bn_act_apply_kernel(BnGeometry g, const A* x, const T* __restrict__ coef, const A* residual,
                        A* y, bool relu) {
  const std::int64_t ch0 = g.channel(blockIdx.x, static_cast<int>(threadIdx.x));
  if (ch0 >= g.c) return;
  T sc[V], sh[V];
  for (int l = 0; l < V; ++l) {
    sc[l] = coef[ch0 + l];
    sh[l] = coef[g.c + ch0 + l];
  }
  const std::int64_t step = static_cast<std::int64_t>(gridDim.y) * g.lanes;
  for (std::int64_t m = static_cast<std::int64_t>(blockIdx.y) * g.lanes + threadIdx.y; m < g.rows;
       m += step) {
    const std::int64_t i = m * g.c + ch0;
    BnVec<A, V> v = bn_load<A, V>(x + i);
    BnVec<A, V> r{};
    if (residual) r = bn_load<A, V>(residual + i);
    for (int l = 0; l < V; ++l) {
      T u = static_cast<T>(v.v[l]) * sc[l] + sh[l];
      if (residual) u = u + static_cast<T>(r.v[l]);
      if (relu) u = ((u > T(0)) | (u != u)) ? u : T(0);
      v.v[l] = static_cast<A>(u);
    }
    bn_store<A, V>(y + i, v);
  }
}

// g = y ? (y > 0 ? dy : 0) : dy; dres = g (nullable); dx = k1 g + k2 (x - mean) + k3 (nullable),
// coef = [k1, k2, k3] (C each). Same grid as the apply. dx may be dy (same thread). Arithmetic in
// T; x, dy, y, dx, dres of type A (dres = g is dy or 0: no rounding).
template <class T, class A, int V>
__global__ void __launch_bounds__(kBnBlockThreads)
    bn_act_backward_apply_kernel(BnGeometry g, const A* x, const A* dy, const A* y,
                                 const T* __restrict__ mean, const T* __restrict__ coef, A* dx,
                                 A* dres) {
  const std::int64_t ch0 = g.channel(blockIdx.x, static_cast<int>(threadIdx.x));
  if (ch0 >= g.c) return;
  T k1[V], k2[V], k3[V], mu[V];
  for (int l = 0; l < V; ++l) {
    k1[l] = coef[ch0 + l];
    k2[l] = coef[g.c + ch0 + l];
    k3[l] = coef[2 * g.c + ch0 + l];
    mu[l] = mean[ch0 + l];
  }
  const std::int64_t step = static_cast<std::int64_t>(gridDim.y) * g.lanes;
  for (std::int64_t m = static_cast<std::int64_t>(blockIdx.y) * g.lanes + threadIdx.y; m < g.rows;
       m += step) {
    const std::int64_t i = m * g.c + ch0;
    BnVec<A, V> gv = bn_load<A, V>(dy + i);
    if (y) {
      const BnVec<A, V> yv = bn_load<A, V>(y + i);
      for (int l = 0; l < V; ++l)
        gv.v[l] = static_cast<T>(yv.v[l]) > T(0) ? gv.v[l] : static_cast<A>(T(0));
    }
    if (dres) bn_store<A, V>(dres + i, gv);
    if (dx) {
      const BnVec<A, V> xv = bn_load<A, V>(x + i);
      BnVec<A, V> o;
      for (int l = 0; l < V; ++l)
        o.v[l] = static_cast<A>(k1[l] * static_cast<T>(gv.v[l]) +
                                k2[l] * (static_cast<T>(xv.v[l]) - mu[l]) + k3[l]);
      bn_store<A, V>(dx + i, o);
    }
  }
}

// Whether every given pointer allows 16-byte vector access (null: not used by the pass).
inline bool bn_aligned(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// The apply passes' grid: (tiles, row blocks), at least ~4 rows per thread, at most ~8192 blocks
// (the rows are grid-strided), gridDim.y <= 65535.
inline dim3 bn_apply_grid(const BnGeometry& g) {
  const std::int64_t per_block = static_cast<std::int64_t>(g.lanes) * 4;
  const std::int64_t cap = std::max<std::int64_t>(1, std::min<std::int64_t>(65535, 8192 / g.tiles));
  const std::int64_t blocks =
      std::clamp<std::int64_t>((g.rows + per_block - 1) / per_block, 1, cap);
  return dim3(static_cast<unsigned>(g.tiles), static_cast<unsigned>(blocks));
}

// Column sums of a (rows, C) matrix for conv2d.cuh's dbias: partial[chunk][c] in double, block
// (32, 8) over 32 adjacent channels (coalesced), the 8 row-lanes added in a fixed order.
enum class BnSum : int { X = 0 };
inline constexpr int kBnChannels = 32, kBnRowLanes = 8;
template <class T, BnSum Mode>
__global__ void channel_partial_kernel(const T* __restrict__ x, const T*, const double*, const T*,
                                       const T*, std::int64_t rows, std::int64_t c,
                                       std::int64_t rows_per_chunk, double* __restrict__ partial0,
                                       double*) {
  static_assert(Mode == BnSum::X, "column sums only");
  __shared__ double s0[kBnRowLanes][kBnChannels];
  const std::int64_t ch = static_cast<std::int64_t>(blockIdx.x) * kBnChannels + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t m0 = chunk * rows_per_chunk,
                     m1 = m0 + rows_per_chunk < rows ? m0 + rows_per_chunk : rows;
  double a0 = 0.0;
  if (ch < c)
    for (std::int64_t m = m0 + threadIdx.y; m < m1; m += kBnRowLanes)
      a0 += static_cast<double>(x[m * c + ch]);
  s0[threadIdx.y][threadIdx.x] = a0;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    for (int l = 1; l < kBnRowLanes; ++l) a0 += s0[l][threadIdx.x];
    partial0[chunk * c + ch] = a0;
  }
}
struct BnGrid {
  std::int64_t chunks, rows_per_chunk;
  dim3 grid, block;
};
inline BnGrid bn_grid(std::int64_t rows, std::int64_t c) {
  // ~256 rows per chunk, at most 1024 chunks.
  const std::int64_t chunks = std::clamp<std::int64_t>((rows + 255) / 256, 1, 1024);
  const std::int64_t per = (rows + chunks - 1) / chunks;
  const std::int64_t used = (rows + per - 1) / per;
  return {.chunks = used,
          .rows_per_chunk = per,
          .grid = dim3(static_cast<unsigned>((c + kBnChannels - 1) / kBnChannels),
                       static_cast<unsigned>(used)),
          .block = dim3(kBnChannels, kBnRowLanes)};
}

// f(std::integral_constant<int, V>), V = g.vec: kBnVec<T> (16-byte vectors) or 1.
template <class T, class F>
void bn_with_vec(const BnGeometry& g, F&& f) {
  if (g.vec == kBnVec<T>)
    f(std::integral_constant<int, kBnVec<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

}  // namespace detail

namespace detail {

// Fills save_mean/save_invstd, updates the running statistics and num_batches_tracked when
// training, writes coef = [scale (C), shift (C)] for y = x scale + shift. Synchronised: this rank's
// sums, the all-reduce, then BnSyncStatistics. Enqueued on e's stream (synchronised: a host wait
// only when the local batch has fewer than 2 rows).
template <class T, class A>
void batchnorm_coefficients(const Exec<Cuda>& e, const BatchNormForwardArgs<T, Cuda, A>& a,
                            Tensor<T, Cuda>& coef) {
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  const cudaStream_t s = cuda_stream(e);
  // temporaries (and coef) are reused in the order of e's stream
  const CudaAllocStream on_stream(e);
  coef = Tensor<T, Cuda>(Shape{2, c});  // scale, shift
  const BnChannelOutputs<T> out = channel_outputs(a, coef.data(), coef.data() + c);
  if (!a.training) {
    op_phase(e, "finalize");  // op_profile.cuh
    for_each_index(e, static_cast<std::size_t>(c), BnEvalFinish<T>{.out = out});
    return;
  }
  const bool synced = a.sync != nullptr;
  const BnGeometry g = bn_geometry<A>(rows, c, bn_aligned({a.x.data()}));
  // (chunks, C) BnMoments
  Tensor<double, Cuda> partial(Shape{3 * std::max<std::int64_t>(g.chunks, 1) * c});
  auto* moments = reinterpret_cast<BnMoments*>(partial.data());
  if (rows > 0)
    bn_with_vec<A>(g, [&](auto v) {
      constexpr int V = decltype(v)::value;
      bn_moments_kernel<A, V>
          <<<dim3(static_cast<unsigned>(g.tiles), static_cast<unsigned>(g.chunks)),
             dim3(static_cast<unsigned>(g.cols), static_cast<unsigned>(g.lanes)), 0, s>>>(
              a.x.data(), g, moments);
      check_launch("bn_moments_kernel", s);
    });
  Tensor<double, Cuda> sums;
  if (synced) sums = Tensor<double, Cuda>(Shape{2 * c + 1});
  op_phase(e, "finalize");  // op_profile.cuh: the pass from partial sums to coefficients
  bn_finalize_kernel<T>
      <<<static_cast<unsigned>((c + kBnFinCols - 1) / kBnFinCols), dim3(kBnFinCols, kBnFinLanes), 0,
         s>>>(moments, g.chunks, c, out, synced ? sums.data() : nullptr);
  check_launch("bn_finalize_kernel", s);
  if (!synced) return;
  a.sync->all_reduce_sum(e, sums.view());
  // Only then can the total be below 2 (every rank sees the same one): the only host wait.
  if (rows < 2) {
    double total = 0.0;
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(&total, sums.data() + 2 * c, sizeof(double), cudaMemcpyDeviceToHost, s));
    DDP_CUDA_CHECK(cudaStreamSynchronize(s));
    check_sync_count(total, "batchnorm_forward");
  }
  for_each_index(e, static_cast<std::size_t>(c),
                 BnSyncStatistics<T>{.sums = sums.data(), .out = out, .c = c});
}

// y = act(x scale + shift + residual) with coef = [scale, shift] (bn_act_apply_kernel).
template <class T, class A>
void batchnorm_apply(const Exec<Cuda>& e, TensorView<const A, Cuda> x, const Tensor<T, Cuda>& coef,
                     const A* residual, A* y, bool relu) {
  const std::int64_t c = x.dim(-1), rows = x.numel() / c;
  if (rows == 0) return;
  const cudaStream_t s = cuda_stream(e);
  const BnGeometry g = bn_geometry<A>(rows, c, bn_aligned({x.data(), residual, y}));
  bn_with_vec<A>(g, [&](auto v) {
    constexpr int V = decltype(v)::value;
    bn_act_apply_kernel<T, A, V>
        <<<bn_apply_grid(g), dim3(static_cast<unsigned>(g.cols), static_cast<unsigned>(g.lanes)), 0,
           s>>>(g, x.data(), coef.data(), residual, y, relu);
    check_launch("bn_act_apply_kernel", s);
  });
}

}  // namespace detail

template <class T, class A>
void batchnorm_forward(const Exec<Cuda>& e, const BatchNormForwardArgs<T, Cuda, A>& a) {
  validate(a);
  Tensor<T, Cuda> coef;
  detail::batchnorm_coefficients(e, a, coef);
  op_phase(e, "apply");
  detail::batchnorm_apply(e, a.x, coef, static_cast<const A*>(nullptr), a.y.data(), false);
}

namespace detail {

// dgamma, dbeta and coef = [k1, k2, k3] (each C) of dx = k1 g + k2 (x - mean) + k3; g = dy, or
// dy * (ymask > 0) with ymask (bn_act.cuh's ReLU). Synchronised: dgamma and dbeta from this rank's
// sums, k1..k3 from every rank's (BnSyncBackwardCoefficients).
template <class T, class A>
void batchnorm_backward_coefficients(const Exec<Cuda>& e,
                                     const BatchNormBackwardArgs<T, Cuda, A>& a, const A* ymask,
                                     Tensor<T, Cuda>& coef) {
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  const cudaStream_t s = cuda_stream(e);
  // temporaries (and coef) are reused in the order of e's stream
  const CudaAllocStream on_stream(e);
  coef = Tensor<T, Cuda>(Shape{3, c});  // k1, k2, k3
  const bool synced = a.training && a.sync;
  const BnGeometry g = bn_geometry<A>(rows, c, bn_aligned({a.x.data(), a.dy.data(), ymask}));
  // (2, chunks, C)
  Tensor<double, Cuda> partial(Shape{2 * std::max<std::int64_t>(g.chunks, 1) * c});
  if (rows > 0)
    bn_with_vec<A>(g, [&](auto v) {
      constexpr int V = decltype(v)::value;
      bn_grad_sums_kernel<T, A, V>
          <<<dim3(static_cast<unsigned>(g.tiles), static_cast<unsigned>(g.chunks)),
             dim3(static_cast<unsigned>(g.cols), static_cast<unsigned>(g.lanes)), 0, s>>>(
              a.x.data(), a.dy.data(), ymask, a.save_mean.data(), a.save_invstd.data(), g,
              partial.data());
      check_launch("bn_grad_sums_kernel", s, ymask ? "masked" : "");
    });
  Tensor<double, Cuda> sums;
  if (synced) sums = Tensor<double, Cuda>(Shape{2 * c + 1});
  op_phase(e, "finalize");
  bn_grad_finalize_kernel<T><<<static_cast<unsigned>((c + kBnFinCols - 1) / kBnFinCols),
                               dim3(kBnFinCols, kBnFinLanes), 0, s>>>(
      partial.data(), g.chunks, c, rows, a.training, a.gamma.data(), a.save_invstd.data(),
      a.dgamma.empty() ? nullptr : a.dgamma.data(), a.dbeta.empty() ? nullptr : a.dbeta.data(),
      coef.data(), synced ? sums.data() : nullptr);
  check_launch("bn_grad_finalize_kernel", s);
  if (!synced) return;
  a.sync->all_reduce_sum(e, sums.view());  // every rank, even without dx
  for_each_index(e, static_cast<std::size_t>(c),
                 BnSyncBackwardCoefficients<T>{.sums = sums.data(),
                                               .gamma = a.gamma.data(),
                                               .invstd = a.save_invstd.data(),
                                               .k1 = coef.data(),
                                               .k2 = coef.data() + c,
                                               .k3 = coef.data() + 2 * c,
                                               .c = c});
}

// dres = g, dx = k1 g + k2 (x - mean) + k3 (either nullable); g = dy, or dy * (y > 0) with y.
template <class T, class A>
void batchnorm_backward_apply(const Exec<Cuda>& e, const BatchNormBackwardArgs<T, Cuda, A>& a,
                              const A* y, const Tensor<T, Cuda>& coef, A* dx, A* dres) {
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  if (rows == 0 || (!dx && !dres)) return;
  const cudaStream_t s = cuda_stream(e);
  const BnGeometry g = bn_geometry<A>(rows, c, bn_aligned({a.x.data(), a.dy.data(), y, dx, dres}));
  bn_with_vec<A>(g, [&](auto v) {
    constexpr int V = decltype(v)::value;
    bn_act_backward_apply_kernel<T, A, V>
        <<<bn_apply_grid(g), dim3(static_cast<unsigned>(g.cols), static_cast<unsigned>(g.lanes)), 0,
           s>>>(g, a.x.data(), a.dy.data(), y, a.save_mean.data(), coef.data(), dx, dres);
    check_launch("bn_act_backward_apply_kernel", s);
  });
}

}  // namespace detail

template <class T, class A>
void batchnorm_backward(const Exec<Cuda>& e, const BatchNormBackwardArgs<T, Cuda, A>& a) {
  validate(a);
  Tensor<T, Cuda> coef;
  detail::batchnorm_backward_coefficients(e, a, static_cast<const A*>(nullptr), coef);
  if (a.dx.empty()) return;
  op_phase(e, "apply");
  detail::batchnorm_backward_apply(e, a, static_cast<const A*>(nullptr), coef, a.dx.data(),
                                   static_cast<A*>(nullptr));
}

}  // namespace ddp::kernels::cuda
