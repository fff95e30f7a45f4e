// CUDA layer normalisation over the last dimension (torch.nn.LayerNorm): forward and backward.
// SPDX-License-Identifier: MIT
//
// Same formulas and saved state as kernels/cpu/layer_norm.hpp (x (M, C) is M rows; mean and rstd
// per row, in LayerNormStat<T>). One warp per row (launch.cuh's warp_row: kWarpRowsPerBlock rows
// per 256-thread block), each lane striding over the row:
//   forward   pass 1 sum x -> mean; pass 2 sum (x - mean)^2 -> var (two passes: no cancellation;
//     the second
//             re-reads the row, which is in L1/L2); rstd = 1 / sqrt(var + eps) in double, rounded
//               once;
//             y = (x rstd - mean rstd) * weight + bias, the CPU's order of operations
//   dx        per row sum g and sum g xhat (g = dy * weight), then dx = rstd (g - mean g - xhat
//     mean(g xhat))
// Row sums accumulate in LayerNormStat<T> (float for float: ~1e-7 relative for C in the thousands;
// the CPU uses double) and are combined with __shfl_xor_sync, a fixed order. dweight and dbias are
// column sums over the M rows: a (column tile x row chunk) grid writes one double partial per chunk
// and column, and a second kernel adds the chunks in order, so both are deterministic (the same
// bits on every run; not the CPU's bits).
// Example: minGPT's M = 216 * 128 = 27,648 rows of C = 512: 3,456 forward blocks; the parameter
//   sums use 16
// column tiles x 256 chunks of 108 rows.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/layer_norm_args.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

namespace detail {

template <class T>
__global__ void layer_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                          const T* __restrict__ b, T* __restrict__ y,
                                          LayerNormStat<T>* __restrict__ mean_out,
                                          LayerNormStat<T>* __restrict__ rstd_out, std::int64_t m,
                                          std::int64_t c, double eps) {
  using S = LayerNormStat<T>;
  const std::int64_t r = warp_row();
  if (r >= m) return;  // whole warps leave together: the shuffles below see full warps
  const int lane = static_cast<int>(threadIdx.x & 31);
  const T* xr = x + r * c;
  T* yr = y + r * c;
  S sum = S(0);
  for (std::int64_t j = lane; j < c; j += 32) sum += static_cast<S>(xr[j]);
  const S mean = warp_sum_all(sum) / static_cast<S>(c);
  S sq = S(0);
  for (std::int64_t j = lane; j < c; j += 32) {
    const S d = static_cast<S>(xr[j]) - mean;
    sq += d * d;
  }
  const S var = warp_sum_all(sq) / static_cast<S>(c);
  const auto rstd = static_cast<S>(1.0 / ::sqrt(static_cast<double>(var) + eps));
  if (lane == 0) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
  const S shift = -rstd * mean;
  for (std::int64_t j = lane; j < c; j += 32) {
    S v = static_cast<S>(xr[j]) * rstd + shift;
    if (w) v = v * static_cast<S>(w[j]);
    if (b) v = v + static_cast<S>(b[j]);
    yr[j] = static_cast<T>(v);
  }
}

template <class T>
__global__ void layer_norm_dx_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                     const LayerNormStat<T>* __restrict__ mean,
                                     const LayerNormStat<T>* __restrict__ rstd,
                                     const T* __restrict__ dy, T* __restrict__ dx, std::int64_t m,
                                     std::int64_t c) {
  using S = LayerNormStat<T>;
  const std::int64_t r = warp_row();
  if (r >= m) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const T* xr = x + r * c;
  const T* dyr = dy + r * c;
  T* dxr = dx + r * c;
  const S mu = mean[r], rs = rstd[r];
  S sum_g = S(0), sum_gx = S(0);
  for (std::int64_t j = lane; j < c; j += 32) {
    const S g = w ? static_cast<S>(dyr[j]) * static_cast<S>(w[j]) : static_cast<S>(dyr[j]);
    sum_g += g;
    sum_gx += g * ((static_cast<S>(xr[j]) - mu) * rs);
  }
  const S mean_g = warp_sum_all(sum_g) / static_cast<S>(c);
  const S mean_gx = warp_sum_all(sum_gx) / static_cast<S>(c);
  for (std::int64_t j = lane; j < c; j += 32) {
    const S g = w ? static_cast<S>(dyr[j]) * static_cast<S>(w[j]) : static_cast<S>(dyr[j]);
    const S xhat = (static_cast<S>(xr[j]) - mu) * rs;
    dxr[j] = static_cast<T>(rs * (g - mean_g - xhat * mean_gx));
  }
}

// Block (32, 8): column col0 + threadIdx.x, rows [chunk * rows_per_chunk, ...) strided by 8; the 8
// partial sums of a column are added in threadIdx.y order and written to partial_{w,b}[chunk * c +
// col] (either may be null).
template <class T>
__global__ void layer_norm_param_partial_kernel(const T* __restrict__ x,
                                                const LayerNormStat<T>* __restrict__ mean,
                                                const LayerNormStat<T>* __restrict__ rstd,
                                                const T* __restrict__ dy, std::int64_t m,
                                                std::int64_t c, std::int64_t rows_per_chunk,
                                                double* __restrict__ partial_w,
                                                double* __restrict__ partial_b) {
  using S = LayerNormStat<T>;
  __shared__ double sw[8][33], sb[8][33];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t r0 = chunk * rows_per_chunk,
                     r1 = r0 + rows_per_chunk < m ? r0 + rows_per_chunk : m;
  double aw = 0.0, ab = 0.0;
  if (col < c) {
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const S d = static_cast<S>(dy[r * c + col]);
      aw += static_cast<double>(d * ((static_cast<S>(x[r * c + col]) - mean[r]) * rstd[r]));
      ab += static_cast<double>(d);
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    double tw = 0.0, tb = 0.0;
    for (int k = 0; k < 8; ++k) {
      tw += sw[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    if (partial_w) partial_w[chunk * c + col] = tw;
    if (partial_b) partial_b[chunk * c + col] = tb;
  }
}

// out[j] = sum over chunks of partial[chunk * c + j], in chunk order.
template <class T>
__global__ void layer_norm_param_finalize_kernel(const double* __restrict__ partial,
                                                 std::int64_t chunks, std::int64_t c,
                                                 T* __restrict__ out) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  double s = 0.0;
  for (std::int64_t k = 0; k < chunks; ++k) s += partial[k * c + j];
  out[j] = static_cast<T>(s);
}

}  // namespace detail

template <class T>
void layer_norm_forward(const Exec<Cuda>& e, const LayerNormForwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t m = a.x.dim(0), c = a.x.dim(1);
  const cudaStream_t s = cuda_stream(e);
  detail::layer_norm_forward_kernel<T><<<warp_row_blocks(m), kThreads, 0, s>>>(
      a.x.data(), a.weight.empty() ? nullptr : a.weight.data(),
      a.bias.empty() ? nullptr : a.bias.data(), a.y.data(), a.mean.data(), a.rstd.data(), m, c,
      a.eps);
  check_launch("layer_norm_forward_kernel", s);
}

template <class T>
void layer_norm_backward(const Exec<Cuda>& e, const LayerNormBackwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t m = a.x.dim(0), c = a.x.dim(1);
  const cudaStream_t s = cuda_stream(e);
  if (!a.dx.empty()) {
    detail::layer_norm_dx_kernel<T><<<warp_row_blocks(m), kThreads, 0, s>>>(
        a.x.data(), a.weight.empty() ? nullptr : a.weight.data(), a.mean.data(), a.rstd.data(),
        a.dy.data(), a.dx.data(), m, c);
    check_launch("layer_norm_dx_kernel", s);
  }
  if (a.dweight.empty() && a.dbias.empty()) return;
  // About 4096 blocks in all, chunks of at least 64 rows (a partial per 64+ rows keeps the buffer
  // small).
  const std::int64_t tiles = (c + 31) / 32;
  const std::int64_t chunks = std::max<std::int64_t>(
      1, std::min<std::int64_t>({(m + 63) / 64, std::max<std::int64_t>(1, 4096 / tiles), 65535}));
  const std::int64_t rows_per_chunk = (m + chunks - 1) / chunks;
  // partials are freed while the kernels below may still run on e's stream
  const CudaAllocStream on_stream(e);
  Tensor<double, Cuda> pw(Shape{a.dweight.empty() ? 1 : chunks, c}),
      pb(Shape{a.dbias.empty() ? 1 : chunks, c});
  double* pw_ptr = a.dweight.empty() ? nullptr : pw.data();
  double* pb_ptr = a.dbias.empty() ? nullptr : pb.data();
  detail::layer_norm_param_partial_kernel<T>
      <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), dim3(32, 8), 0, s>>>(
          a.x.data(), a.mean.data(), a.rstd.data(), a.dy.data(), m, c, rows_per_chunk, pw_ptr,
          pb_ptr);
  check_launch("layer_norm_param_partial_kernel", s);
  if (pw_ptr) {
    detail::layer_norm_param_finalize_kernel<T>
        <<<grid_for(c), kThreads, 0, s>>>(pw_ptr, chunks, c, a.dweight.data());
    check_launch("layer_norm_param_finalize_kernel", s, "dweight");
  }
  if (pb_ptr) {
    detail::layer_norm_param_finalize_kernel<T>
        <<<grid_for(c), kThreads, 0, s>>>(pb_ptr, chunks, c, a.dbias.data());
    check_launch("layer_norm_param_finalize_kernel", s, "dbias");
  }
}

}  // namespace ddp::kernels::cuda
