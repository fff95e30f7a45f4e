// CUDA batch normalisation over the channel (last) dimension: training and eval forward, and backward.
// SPDX-License-Identifier: MIT
//
// How it works (same formulas as kernels/cpu/batchnorm.hpp). x (N, H, W, C) is M = N*H*W rows of C
// channels. Per-channel sums are computed in two deterministic steps:
//   1. channel_partial_kernel: block (32, 8) covers 32 adjacent channels (one 128-byte row segment per
//      warp, coalesced) and one chunk of rows; each thread sums its rows in double, the 8 row-lanes are
//      combined in a fixed order, and the chunk's sum goes to partial[chunk][c].
//   2. a per-channel kernel adds the chunks in chunk order and derives the statistics.
// Training forward makes two such passes (mean, then sum (x - mean)^2: no cancellation), then
// y = x * scale_c + shift_c with scale = gamma invstd, shift = beta - mean scale (one FMA per element).
// Backward sums dy and dy * xhat, then dx = k1 dy + k2 (x - mean) + k3 (k2 = k3 = 0 in eval).
// Synchronised (Args::sync, training; docs/ARCHITECTURE.md D27): the forward makes one Moments pass (sum x,
// sum x^2), the backward its usual pass; the chunks are folded into (2C + 1) doubles (BnFoldChunks), the
// reducer all-reduces them on the exec's stream, and the per-channel functors of kernels/batchnorm_sync.hpp
// finish the statistics. An empty local batch (rows 0) launches no pass over x and contributes zeros.
// Example: ResNet's bn1 at batch 16: M = 200,704 rows, C = 64 -> grid (2, 512) for the partial sums,
// each chunk 392 rows; then 64 threads finish the statistics.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/batchnorm_sync.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

namespace detail {

// Backward and BackwardMasked differ only in the gradient they sum: dy, or dy * (y > 0) (the ReLU that
// follows the BatchNorm in bn_act.cuh, with y its forward output).
// Moments: partial0 = sum x, partial1 = sum x^2 (the synchronised forward's one pass).
enum class BnSum : int { X = 0, CenteredSquare = 1, Backward = 2, BackwardMasked = 3, Moments = 4 };

inline constexpr int kBnChannels = 32, kBnRowLanes = 8;

// partial0/partial1 (chunks, C) in double. X: sum x. CenteredSquare: sum (x - mean)^2.
// Backward: partial0 = sum dy, partial1 = sum dy (x - mean) invstd. BackwardMasked: the same with
// dy replaced by dy * (ymask > 0).
template <class T, BnSum Mode>
__global__ void channel_partial_kernel(const T* __restrict__ x, const T* __restrict__ dy, const double* __restrict__ mean,
                                       const T* __restrict__ save_mean, const T* __restrict__ invstd, std::int64_t rows,
                                       std::int64_t c, std::int64_t rows_per_chunk, double* __restrict__ partial0,
                                       double* __restrict__ partial1, const T* __restrict__ ymask = nullptr) {
  constexpr bool kBackward = Mode == BnSum::Backward || Mode == BnSum::BackwardMasked;
  __shared__ double s0[kBnRowLanes][kBnChannels];
  __shared__ double s1[kBnRowLanes][kBnChannels];
  const std::int64_t ch = static_cast<std::int64_t>(blockIdx.x) * kBnChannels + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t m0 = chunk * rows_per_chunk, m1 = m0 + rows_per_chunk < rows ? m0 + rows_per_chunk : rows;
  double a0 = 0.0, a1 = 0.0;
  if (ch < c) {
    double mu = 0.0, is = 0.0;
    if constexpr (Mode == BnSum::CenteredSquare) mu = mean[ch];
    if constexpr (kBackward) {
      mu = static_cast<double>(save_mean[ch]);
      is = static_cast<double>(invstd[ch]);
    }
    for (std::int64_t m = m0 + threadIdx.y; m < m1; m += kBnRowLanes) {
      const double v = static_cast<double>(x[m * c + ch]);
      if constexpr (Mode == BnSum::X) {
        a0 += v;
      } else if constexpr (Mode == BnSum::Moments) {
        a0 += v;
        a1 += v * v;
      } else if constexpr (Mode == BnSum::CenteredSquare) {
        const double d = v - mu;
        a0 += d * d;
      } else {
        double g = static_cast<double>(dy[m * c + ch]);
        if constexpr (Mode == BnSum::BackwardMasked) g = ymask[m * c + ch] > T(0) ? g : 0.0;
        a0 += g;
        a1 += g * (v - mu) * is;
      }
    }
  }
  s0[threadIdx.y][threadIdx.x] = a0;
  s1[threadIdx.y][threadIdx.x] = a1;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    for (int l = 1; l < kBnRowLanes; ++l) {
      a0 += s0[l][threadIdx.x];
      a1 += s1[l][threadIdx.x];
    }
    partial0[chunk * c + ch] = a0;
    if constexpr (kBackward || Mode == BnSum::Moments) partial1[chunk * c + ch] = a1;
  }
}

// Training: mean[c] = sum / rows.
template <class T>
__global__ void bn_mean_kernel(const double* __restrict__ partial, std::int64_t chunks, std::int64_t c,
                               std::int64_t rows, double* __restrict__ mean) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= c) return;
  double s = 0.0;
  for (std::int64_t j = 0; j < chunks; ++j) s += partial[j * c + k];
  mean[k] = s / static_cast<double>(rows);
}

// Statistics -> BnChannelOutputs::finish. training: partial holds sum (x - mean)^2 and mean the batch mean;
// eval: both unused (the running statistics normalise).
template <class T>
__global__ void bn_stats_kernel(const double* __restrict__ partial, std::int64_t chunks, std::int64_t c,
                                std::int64_t rows, const double* __restrict__ mean, bool training,
                                BnChannelOutputs<T> out) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= c) return;
  if (!training) return out.finish_eval(k);
  double s = 0.0;
  for (std::int64_t j = 0; j < chunks; ++j) s += partial[j * c + k];
  out.finish(k, mean[k], s / static_cast<double>(rows), static_cast<double>(rows));
}

// Backward coefficients: dbeta, dgamma, and k1..k3 of dx = k1 dy + k2 (x - mean) + k3.
template <class T>
__global__ void bn_backward_coef_kernel(const double* __restrict__ p0, const double* __restrict__ p1,
                                        std::int64_t chunks, std::int64_t c, std::int64_t rows, bool training,
                                        const T* __restrict__ gamma, const T* __restrict__ invstd, T* __restrict__ dgamma,
                                        T* __restrict__ dbeta, T* __restrict__ k1, T* __restrict__ k2,
                                        T* __restrict__ k3) {
  const std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= c) return;
  double sdy = 0.0, sdyx = 0.0;
  for (std::int64_t j = 0; j < chunks; ++j) {
    sdy += p0[j * c + k];
    sdyx += p1[j * c + k];
  }
  if (dbeta) dbeta[k] = static_cast<T>(sdy);
  if (dgamma) dgamma[k] = static_cast<T>(sdyx);
  const double is = static_cast<double>(invstd[k]);
  const double g = static_cast<double>(gamma[k]) * is;
  double c2 = 0.0, c3 = 0.0;
  if (training) {
    c2 = -g * is * sdyx / static_cast<double>(rows);
    c3 = -g * sdy / static_cast<double>(rows);
  }
  k1[k] = static_cast<T>(g);
  k2[k] = static_cast<T>(c2);
  k3[k] = static_cast<T>(c3);
}

// y[i] = x[i] * scale[c] + shift[c], c = i % C.
template <class T>
struct BnApply {
  const T* x;
  const T* scale;
  const T* shift;
  T* y;
  std::int64_t c;
  __device__ void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i % static_cast<std::size_t>(c));
    y[i] = x[i] * scale[k] + shift[k];
  }
};

// dx[i] = k1[c] dy[i] + k2[c] (x[i] - mean[c]) + k3[c].
template <class T>
struct BnBackwardApply {
  const T* x;
  const T* dy;
  const T* mean;
  const T* k1;
  const T* k2;
  const T* k3;
  T* dx;
  std::int64_t c;
  __device__ void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i % static_cast<std::size_t>(c));
    dx[i] = k1[k] * dy[i] + k2[k] * (x[i] - mean[k]) + k3[k];
  }
};

struct BnGrid {
  std::int64_t chunks, rows_per_chunk;
  dim3 grid, block;
};
inline BnGrid bn_grid(std::int64_t rows, std::int64_t c) {
  // ~256 rows per chunk, at most 1024 chunks: enough blocks to fill an H100 (132 SMs) for ResNet's shapes.
  const std::int64_t chunks = std::clamp<std::int64_t>((rows + 255) / 256, 1, 1024);
  const std::int64_t per = (rows + chunks - 1) / chunks;
  const std::int64_t used = (rows + per - 1) / per;
  return {.chunks = used,
          .rows_per_chunk = per,
          .grid = dim3(static_cast<unsigned>((c + kBnChannels - 1) / kBnChannels), static_cast<unsigned>(used)),
          .block = dim3(kBnChannels, kBnRowLanes)};
}

}  // namespace detail

namespace detail {

// This rank's chunked sums (2, chunks, C) -> sums (2C + 1); partial may be null when rows == 0 (no chunks).
inline void bn_fold_chunks(const Exec<Cuda>& e, const double* partial, std::int64_t chunks, std::int64_t c,
                           std::int64_t rows, Tensor<double, Cuda>& sums) {
  for_each_index(e, static_cast<std::size_t>(2 * c + 1),
                 BnFoldChunks{.partial = partial, .sums = sums.data(), .chunks = chunks, .c = c,
                              .rows = static_cast<double>(rows)});
}

// Synchronised training forward: coef = [scale, shift] from the statistics of every rank's batch.
template <class T>
void sync_coefficients(const Exec<Cuda>& e, const BatchNormForwardArgs<T, Cuda>& a, Tensor<T, Cuda>& coef) {
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  const cudaStream_t s = cuda_stream(e);
  const CudaAllocStream on_stream(e);  // temporaries (and coef) are reused in the order of e's stream
  coef = Tensor<T, Cuda>(Shape{2, c});  // scale, shift
  Tensor<double, Cuda> sums(Shape{2 * c + 1});
  Tensor<double, Cuda> partial;
  std::int64_t chunks = 0;
  if (rows > 0) {
    const BnGrid g = bn_grid(rows, c);
    chunks = g.chunks;
    partial = Tensor<double, Cuda>(Shape{2, chunks, c});
    channel_partial_kernel<T, BnSum::Moments><<<g.grid, g.block, 0, s>>>(
        a.x.data(), nullptr, nullptr, nullptr, nullptr, rows, c, g.rows_per_chunk, partial.data(),
        partial.data() + chunks * c);
    check_launch("channel_partial_kernel<BnSum::Moments>", s);
  }
  bn_fold_chunks(e, partial.data(), chunks, c, rows, sums);
  a.sync->all_reduce_sum(e, sums.view());
  if (rows < 2) {  // only then can the total be too small (every rank sees the same total): a host wait here only
    double total = 0.0;
    DDP_CUDA_CHECK(cudaMemcpyAsync(&total, sums.data() + 2 * c, sizeof(double), cudaMemcpyDeviceToHost, s));
    DDP_CUDA_CHECK(cudaStreamSynchronize(s));
    check_sync_count(total, "batchnorm_forward");
  }
  for_each_index(e, static_cast<std::size_t>(c),
                 BnSyncStatistics<T>{.sums = sums.data(), .out = channel_outputs(a, coef.data(), coef.data() + c), .c = c});
}

// Statistics of a (validated) forward: fills save_mean/save_invstd, updates the running statistics when
// training, and writes coef = [scale (C), shift (C)] for y = x scale + shift. Enqueued on e's stream.
template <class T>
void batchnorm_coefficients(const Exec<Cuda>& e, const BatchNormForwardArgs<T, Cuda>& a, Tensor<T, Cuda>& coef) {
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  if (a.training && a.sync) return sync_coefficients(e, a, coef);
  const cudaStream_t s = cuda_stream(e);
  const detail::BnGrid g = detail::bn_grid(rows, c);
  const unsigned cblocks = grid_for(c);
  const CudaAllocStream on_stream(e);  // temporaries (and coef) are reused in the order of e's stream
  Tensor<double, Cuda> partial(Shape{g.chunks, c});
  Tensor<double, Cuda> mean(Shape{c});
  coef = Tensor<T, Cuda>(Shape{2, c});  // scale, shift
  if (a.training) {
    detail::channel_partial_kernel<T, detail::BnSum::X><<<g.grid, g.block, 0, s>>>(
        a.x.data(), nullptr, nullptr, nullptr, nullptr, rows, c, g.rows_per_chunk, partial.data(), nullptr);
    check_launch("channel_partial_kernel<BnSum::X>", s);
    detail::bn_mean_kernel<T><<<cblocks, kThreads, 0, s>>>(partial.data(), g.chunks, c, rows, mean.data());
    check_launch("bn_mean_kernel", s);
    detail::channel_partial_kernel<T, detail::BnSum::CenteredSquare><<<g.grid, g.block, 0, s>>>(
        a.x.data(), nullptr, mean.data(), nullptr, nullptr, rows, c, g.rows_per_chunk, partial.data(), nullptr);
    check_launch("channel_partial_kernel<BnSum::CenteredSquare>", s);
  }
  detail::bn_stats_kernel<T><<<cblocks, kThreads, 0, s>>>(partial.data(), g.chunks, c, rows, mean.data(), a.training,
                                                          channel_outputs(a, coef.data(), coef.data() + c));
  check_launch("bn_stats_kernel", s);
}

}  // namespace detail

template <class T>
void batchnorm_forward(const Exec<Cuda>& e, const BatchNormForwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t c = a.x.dim(-1);
  Tensor<T, Cuda> coef;
  detail::batchnorm_coefficients(e, a, coef);
  for_each_index(e, static_cast<std::size_t>(a.x.numel()),
                 detail::BnApply<T>{.x = a.x.data(), .scale = coef.data(), .shift = coef.data() + c, .y = a.y.data(),
                                    .c = c});
}

namespace detail {

// Synchronised training backward, after this rank's chunked sums (2, chunks, C) of g and g xhat: dgamma and
// dbeta from this rank's sums, then coef = [k1, k2, k3] from every rank's.
template <class T>
void sync_backward_coefficients(const Exec<Cuda>& e, const BatchNormBackwardArgs<T, Cuda>& a, const double* partial,
                                std::int64_t chunks, Tensor<T, Cuda>& coef) {
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  Tensor<double, Cuda> sums(Shape{2 * c + 1});
  bn_fold_chunks(e, partial, chunks, c, rows, sums);
  for_each_index(e, static_cast<std::size_t>(c),
                 BnLocalGrads<T>{.sums = sums.data(), .dgamma = a.dgamma.empty() ? nullptr : a.dgamma.data(),
                                 .dbeta = a.dbeta.empty() ? nullptr : a.dbeta.data(), .c = c});
  a.sync->all_reduce_sum(e, sums.view());
  for_each_index(e, static_cast<std::size_t>(c),
                 BnSyncBackwardCoefficients<T>{.sums = sums.data(), .gamma = a.gamma.data(),
                                               .invstd = a.save_invstd.data(), .k1 = coef.data(),
                                               .k2 = coef.data() + c, .k3 = coef.data() + 2 * c, .c = c});
}

// dgamma, dbeta and coef = [k1, k2, k3] (each C) of dx = k1 g + k2 (x - mean) + k3 for a (validated)
// backward, where g = dy, or dy * (ymask > 0) when ymask is given (bn_act.cuh's fused ReLU).
template <class T>
void batchnorm_backward_coefficients(const Exec<Cuda>& e, const BatchNormBackwardArgs<T, Cuda>& a, const T* ymask,
                                     Tensor<T, Cuda>& coef) {
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  const cudaStream_t s = cuda_stream(e);
  const CudaAllocStream on_stream(e);  // temporaries (and coef) are reused in the order of e's stream
  coef = Tensor<T, Cuda>(Shape{3, c});  // k1, k2, k3
  const bool synced = a.training && a.sync;
  if (synced && rows == 0) return sync_backward_coefficients(e, a, nullptr, 0, coef);
  const BnGrid g = bn_grid(rows, c);
  Tensor<double, Cuda> partial(Shape{2, g.chunks, c});
  double* p0 = partial.data();
  double* p1 = partial.data() + g.chunks * c;
  if (ymask)
    channel_partial_kernel<T, BnSum::BackwardMasked><<<g.grid, g.block, 0, s>>>(
        a.x.data(), a.dy.data(), nullptr, a.save_mean.data(), a.save_invstd.data(), rows, c, g.rows_per_chunk, p0, p1,
        ymask);
  else
    channel_partial_kernel<T, BnSum::Backward><<<g.grid, g.block, 0, s>>>(
        a.x.data(), a.dy.data(), nullptr, a.save_mean.data(), a.save_invstd.data(), rows, c, g.rows_per_chunk, p0, p1);
  check_launch(ymask ? "channel_partial_kernel<BnSum::BackwardMasked>" : "channel_partial_kernel<BnSum::Backward>", s);
  if (synced) return sync_backward_coefficients(e, a, partial.data(), g.chunks, coef);
  bn_backward_coef_kernel<T><<<grid_for(c), kThreads, 0, s>>>(
      p0, p1, g.chunks, c, rows, a.training, a.gamma.data(), a.save_invstd.data(),
      a.dgamma.empty() ? nullptr : a.dgamma.data(), a.dbeta.empty() ? nullptr : a.dbeta.data(), coef.data(),
      coef.data() + c, coef.data() + 2 * c);
  check_launch("bn_backward_coef_kernel", s);
}

}  // namespace detail

template <class T>
void batchnorm_backward(const Exec<Cuda>& e, const BatchNormBackwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t c = a.x.dim(-1);
  Tensor<T, Cuda> coef;
  detail::batchnorm_backward_coefficients(e, a, static_cast<const T*>(nullptr), coef);
  if (a.dx.empty()) return;
  for_each_index(e, static_cast<std::size_t>(a.x.numel()),
                 detail::BnBackwardApply<T>{.x = a.x.data(), .dy = a.dy.data(), .mean = a.save_mean.data(),
                                            .k1 = coef.data(), .k2 = coef.data() + c, .k3 = coef.data() + 2 * c,
                                            .dx = a.dx.data(), .c = c});
}

}  // namespace ddp::kernels::cuda
