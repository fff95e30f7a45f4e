// CUDA causal multi-head self-attention on the packed qkv (B, T, 3C): cuBLAS strided-batched GEMMs
// per head and a causal softmax kernel; forward and backward.
// SPDX-License-Identifier: MIT
//
// The CPU's algorithm (kernels/cpu/attention.hpp) with the same saved state: forward writes the
// probabilities att (B, nh, T, T), 0 above the diagonal, for backward (docs/decisions/0044). b and
// h have different strides in qkv, so each op loops over the nh heads and batches over b: q of
// (b, h) starts at b*T*3C + h*hs in qkv (batch stride T*3C, leading dimension 3C), at
// (b*nh + h)*T*T in att (batch stride nh*T*T), at b*T*C + h*hs in y and dy (batch stride T*C,
// leading dimension C). Row-major products as column-major cuBLAS calls (a row-major (r x c) block
// with leading dimension ld is the column-major (c x r) matrix with the same ld; blas.cuh):
//   forward   att = scale q k^T    att^T = k q^T      A = k (T), B = q (N)     m = n = T, k = hs
//             softmax rows (kernel below, all B*nh*T rows at once)
//             y = att v            y^T = v^T att^T    A = v (N), B = att (N)   m = hs, n = k = T
//   backward  datt = dy v^T        datt^T = v dy^T    A = v (T), B = dy (N)    m = n = T, k = hs
//             dv = att^T dy        dv^T = dy^T att    A = dy (N), B = att (T)  m = hs, n = k = T
//             dpre = att * (datt - rowsum(att * datt))  in place (kernel below)
//             dq = scale dpre k    dq^T = k^T dpre^T  A = k (N), B = dpre (N)  m = hs, n = k = T
//             dk = scale dpre^T q  dk^T = q^T dpre    A = q (N), B = dpre (T)  m = hs, n = k = T
// datt is one head's (B, T, T) scratch, reused by the next head (stream order). Dropout (p > 0,
// attention_args.hpp's AttentionDropout; the CPU's scheme): per head, a warp-per-row kernel writes
// drop = mask * att / (1 - p) into a second (B, T, T) scratch, which the y GEMM reads instead of
// att (batch stride T*T); in backward it redraws the mask after the datt GEMM, writes drop for the
// dv GEMM and turns datt into mask * datt / (1 - p) in place; the softmax backward reads the
// undropped att. Each lane evaluates one Philox block (4 elements) with the CPU's counter layout
// (attention_dropout_row): both devices draw the same mask. p = 0 launches none of it.
// The GEMMs compute at exec.precision (Fp32: CUBLAS_COMPUTE_32F); the softmax kernels use one warp
// per row with float sums (expf, not the fast-math __expf), as the CPU sums in T.
// Example: minGPT (B 216, T 128, C 512, nh 8): forward is 8 x 2 batched GEMMs of 216 128x128x64
// products plus one softmax launch over 221,184 rows.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ddp/kernels/attention_args.hpp"
#include "ddp/kernels/cuda/blas.cuh"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

namespace detail {

// Row r of `rows` (T x T) matrices, in place: att[i][j] = softmax over j <= i, 0 for j > i
// (i = r % T).
template <class T>
__global__ void causal_softmax_kernel(T* __restrict__ att, std::int64_t rows, std::int64_t t) {
  const std::int64_t r = warp_row();
  if (r >= rows) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t i = r % t;
  T* row = att + r * t;
  T mx = row[0];
  for (std::int64_t j = lane; j <= i; j += 32) mx = row[j] > mx ? row[j] : mx;
  mx = warp_max_all(mx);
  T sum = T(0);
  for (std::int64_t j = lane; j <= i; j += 32) {
    const T p = ::exp(row[j] - mx);
    row[j] = p;
    sum += p;
  }
  const T inv = T(1) / warp_sum_all(sum);
  for (std::int64_t j = lane; j < t; j += 32) row[j] = j <= i ? row[j] * inv : T(0);
}

// One head over the batch, in place on datt (B, T, T): datt[i][j] = att[i][j] (datt[i][j] - dot_i)
// for j <= i, 0 beyond, dot_i = sum_{j <= i} att[i][j] datt[i][j]. att of batch b starts at
// b * att_batch_stride.
template <class T>
__global__ void causal_softmax_backward_kernel(const T* __restrict__ att,
                                               std::int64_t att_batch_stride, T* __restrict__ datt,
                                               std::int64_t rows, std::int64_t t) {
  const std::int64_t r = warp_row();
  if (r >= rows) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t b = r / t, i = r % t;
  const T* p = att + b * att_batch_stride + i * t;
  T* g = datt + r * t;
  T dot = T(0);
  for (std::int64_t j = lane; j <= i; j += 32) dot += p[j] * g[j];
  dot = warp_sum_all(dot);
  for (std::int64_t j = lane; j < t; j += 32) g[j] = j <= i ? p[j] * (g[j] - dot) : T(0);
}

// One head h, rows r = b T + i: drop (B, T, T)[r][j] = mask * att (B, nh, T, T) * keep_scale for
// j <= i, 0 beyond; with datt (B, T, T): datt[r][j] *= mask * keep_scale for j <= i (the softmax
// backward zeroes it beyond).
template <class T>
__global__ void attention_dropout_kernel(const T* __restrict__ att, T* __restrict__ drop,
                                         T* __restrict__ datt, std::int64_t rows, std::int64_t t,
                                         std::int64_t nh, std::int64_t h, DropoutMask m,
                                         T keep_scale) {
  const std::int64_t r = warp_row();
  if (r >= rows) return;
  const unsigned lane = threadIdx.x & 31u;
  const std::int64_t b = r / t, i = r % t;
  // att's flat index of (b, h, i, 0): the mask's element
  const std::int64_t e_row = ((b * nh + h) * t + i) * t;
  T* d = drop + r * t;
  attention_dropout_row(m, keep_scale, static_cast<std::uint64_t>(e_row), i, att + e_row, d,
                        datt != nullptr ? datt + r * t : nullptr, lane, 32u);
  for (std::int64_t j = i + 1 + lane; j < t; j += 32) d[j] = T(0);
}

// Launches attention_dropout_kernel for head h (rows = B * T).
template <class T>
void launch_attention_dropout(cudaStream_t s, const T* att, T* drop, T* datt, std::int64_t rows,
                              std::int64_t t, std::int64_t nh, std::int64_t h, const DropoutMask& m,
                              T keep_scale) {
  attention_dropout_kernel<T>
      <<<warp_row_blocks(rows), kThreads, 0, s>>>(att, drop, datt, rows, t, nh, h, m, keep_scale);
  check_launch("attention_dropout_kernel", s);
}

}  // namespace detail

template <class T>
void attention_forward(const Exec<Cuda>& e, const AttentionForwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t b = a.qkv.dim(0), t = a.qkv.dim(1), c = a.qkv.dim(2) / 3, nh = a.n_head,
                     hs = c / nh;
  const T scale = attention_scale<T>(hs);
  const cudaStream_t s = cuda_stream(e);
  const char* op = "attention_forward";
  for (std::int64_t h = 0; h < nh; ++h) {
    const T* q = a.qkv.data() + h * hs;
    detail::gemm_strided_batched<T>(e, op, CUBLAS_OP_T, CUBLAS_OP_N, t, t, hs, scale, q + c, 3 * c,
                                    t * 3 * c, q, 3 * c, t * 3 * c, T(0), a.att.data() + h * t * t,
                                    t, nh * t * t, b, e.precision);
  }
  const std::int64_t rows = b * nh * t;
  detail::causal_softmax_kernel<T>
      <<<warp_row_blocks(rows), kThreads, 0, s>>>(a.att.data(), rows, t);
  check_launch("causal_softmax_kernel", s);
  const AttentionDropout& d = a.dropout;
  const bool drop = d.p > 0.0;
  // the scratch is freed while the GEMMs below may still run on e's stream
  const CudaAllocStream on_stream(e);
  // one head's
  Tensor<T, Cuda> dropped = drop ? Tensor<T, Cuda>(Shape{b, t, t}) : Tensor<T, Cuda>();
  const DropoutMask mask =
      drop ? dropout_mask(d.p, d.seed, d.rank, d.stream, d.step) : DropoutMask{};
  for (std::int64_t h = 0; h < nh; ++h) {
    const T* v = a.qkv.data() + 2 * c + h * hs;
    const T* probs = a.att.data() + h * t * t;
    std::int64_t probs_stride = nh * t * t;
    if (drop) {
      detail::launch_attention_dropout<T>(s, a.att.data(), dropped.data(), nullptr, b * t, t, nh, h,
                                          mask, dropout_scale<T>(d.p));
      probs = dropped.data();
      probs_stride = t * t;
    }
    detail::gemm_strided_batched<T>(e, op, CUBLAS_OP_N, CUBLAS_OP_N, hs, t, t, T(1), v, 3 * c,
                                    t * 3 * c, probs, t, probs_stride, T(0), a.y.data() + h * hs, c,
                                    t * c, b, e.precision);
  }
}

template <class T>
void attention_backward(const Exec<Cuda>& e, const AttentionBackwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t b = a.qkv.dim(0), t = a.qkv.dim(1), c = a.qkv.dim(2) / 3, nh = a.n_head,
                     hs = c / nh;
  const T scale = attention_scale<T>(hs);
  const cudaStream_t s = cuda_stream(e);
  const char* op = "attention_backward";
  // the scratch is freed while the kernels below may still run on e's stream
  const CudaAllocStream on_stream(e);
  Tensor<T, Cuda> datt(Shape{b, t, t});
  const AttentionDropout& d = a.dropout;
  const bool drop = d.p > 0.0;
  // one head's
  Tensor<T, Cuda> dropped = drop ? Tensor<T, Cuda>(Shape{b, t, t}) : Tensor<T, Cuda>();
  const DropoutMask mask =
      drop ? dropout_mask(d.p, d.seed, d.rank, d.stream, d.step) : DropoutMask{};
  const std::int64_t sq = t * 3 * c, sy = t * c, sa = nh * t * t, st = t * t;  // batch strides
  for (std::int64_t h = 0; h < nh; ++h) {
    const T* q = a.qkv.data() + h * hs;
    const T* k = q + c;
    const T* v = q + 2 * c;
    T* dq = a.dqkv.data() + h * hs;
    T* dk = dq + c;
    T* dv = dq + 2 * c;
    const T* att = a.att.data() + h * st;
    const T* dy = a.dy.data() + h * hs;
    detail::gemm_strided_batched<T>(e, op, CUBLAS_OP_T, CUBLAS_OP_N, t, t, hs, T(1), v, 3 * c, sq,
                                    dy, c, sy, T(0), datt.data(), t, st, b, e.precision);
    const T* probs = att;
    std::int64_t probs_stride = sa;
    if (drop) {  // the forward's mask again: dropped for dv, and datt becomes d(undropped att)
      detail::launch_attention_dropout<T>(s, a.att.data(), dropped.data(), datt.data(), b * t, t,
                                          nh, h, mask, dropout_scale<T>(d.p));
      probs = dropped.data();
      probs_stride = st;
    }
    detail::gemm_strided_batched<T>(e, op, CUBLAS_OP_N, CUBLAS_OP_T, hs, t, t, T(1), dy, c, sy,
                                    probs, t, probs_stride, T(0), dv, 3 * c, sq, b, e.precision);
    detail::causal_softmax_backward_kernel<T>
        <<<warp_row_blocks(b * t), kThreads, 0, s>>>(att, sa, datt.data(), b * t, t);
    check_launch("causal_softmax_backward_kernel", s);
    detail::gemm_strided_batched<T>(e, op, CUBLAS_OP_N, CUBLAS_OP_N, hs, t, t, scale, k, 3 * c, sq,
                                    datt.data(), t, st, T(0), dq, 3 * c, sq, b, e.precision);
    detail::gemm_strided_batched<T>(e, op, CUBLAS_OP_N, CUBLAS_OP_T, hs, t, t, scale, q, 3 * c, sq,
                                    datt.data(), t, st, T(0), dk, 3 * c, sq, b, e.precision);
  }
}

}  // namespace ddp::kernels::cuda
