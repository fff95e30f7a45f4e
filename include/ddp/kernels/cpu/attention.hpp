// CPU causal multi-head self-attention on the packed qkv (B, T, 3C): forward and backward as GEMMs
// per (batch, head).
// SPDX-License-Identifier: MIT
//
// For each of the B * nh (batch b, head h) pairs, hs = C / nh, q, k, v the (T x hs) blocks of qkv
// at columns h*hs, C + h*hs, 2C + h*hs of batch b (leading dimension 3C):
//   forward   att = q k^T * scale                GEMM (T x T x hs), scale = 1 / sqrt(hs)
//             att[i][j] = softmax over j <= i     row max subtracted; masked j > i exactly 0, as
//                                                 torch's masked_fill(-inf) + softmax
//             y = att v                           GEMM (T x hs x T) into columns h*hs of y (ld C),
//                                                 so y is already (B, T, C)
//   backward  datt = dy v^T;  dv = att^T dy       dy: the (T x hs) block of dy at columns h*hs
//             dpre = att * (datt - rowsum(att * datt))   softmax backward, 0 where masked
//             dq = dpre k * scale;  dk = dpre^T q * scale
// With attention dropout (p > 0) the y GEMM reads drop = mask * att / (1 - p) from a (T x T)
// scratch per chunk of pairs, and att keeps the undropped probabilities; backward draws the mask
// again (drop for dv = drop^T dy) and turns datt into mask * datt / (1 - p) before the softmax
// backward. So no state beyond p = 0's is kept, for one more Philox draw per 4 probabilities.
// The pairs are split over exec's pool, each chunk running gemm_serial; pairs' outputs are
// disjoint, so the result does not depend on the thread count (fewer pairs than threads leaves
// threads idle). The full T x T products are computed although half is masked, as torch does;
// accumulation is in T, as torch's CPU softmax. The CUDA version (docs/decisions/0048) keeps the
// same state.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ddp/kernels/attention_args.hpp"
#include "ddp/kernels/cpu/gemm.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/cpu/vec_math.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

namespace detail {

// Row i of the (t x t) scores `att` becomes softmax(att[i][0..i]) and 0 beyond column i, in place.
// In float the exponentials are exp_vectorizable's (a few ulp; GCC vectorises it, unlike libm's
// expf, and they dominated the forward's time at T 64). The sum stays in order.
template <class T>
void causal_softmax_rows(T* att, std::int64_t t) {
  for (std::int64_t i = 0; i < t; ++i) {
    T* row = att + i * t;
    T mx = row[0];
    for (std::int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
    if constexpr (std::is_same_v<T, float>) {
      DDP_CPU_IVDEP
      for (std::int64_t j = 0; j <= i; ++j) row[j] = exp_vectorizable(row[j] - mx);
    } else {
      for (std::int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] - mx);
    }
    T sum = T(0);
    for (std::int64_t j = 0; j <= i; ++j) sum += row[j];
    const T inv = T(1) / sum;
    for (std::int64_t j = 0; j <= i; ++j) row[j] *= inv;
    std::fill(row + i + 1, row + t, T(0));
  }
}

// In place: datt (t x t) becomes d(scores) = att * (datt - rowsum(att * datt)) below the diagonal
// and 0 above it.
template <class T>
void causal_softmax_backward_rows(const T* att, T* datt, std::int64_t t) {
  for (std::int64_t i = 0; i < t; ++i) {
    const T* p = att + i * t;
    T* g = datt + i * t;
    T dot = T(0);
    for (std::int64_t j = 0; j <= i; ++j) dot += p[j] * g[j];
    for (std::int64_t j = 0; j <= i; ++j) g[j] = p[j] * (g[j] - dot);
    std::fill(g + i + 1, g + t, T(0));
  }
}

// Pair p's (t x t) att under the dropout mask: dropped = mask * att * keep_scale (0 above the
// diagonal); with datt, also datt = mask * datt * keep_scale below it, in place.
template <class T>
void dropout_pair(const DropoutMask& m, T keep_scale, std::int64_t p, std::int64_t t, const T* att,
                  T* dropped, T* datt) {
  for (std::int64_t i = 0; i < t; ++i) {
    const auto e_row = static_cast<std::uint64_t>((p * t + i) * t);
    attention_dropout_row(m, keep_scale, e_row, i, att + i * t, dropped + i * t,
                          datt ? datt + i * t : nullptr, 0, 1);
    std::fill(dropped + i * t + i + 1, dropped + (i + 1) * t, T(0));
  }
}

}  // namespace detail

template <class T>
void attention_forward(const Exec<Cpu>& exec, const AttentionForwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t b = a.qkv.dim(0), t = a.qkv.dim(1), c = a.qkv.dim(2) / 3, nh = a.n_head,
                     hs = c / nh;
  const T scale = attention_scale<T>(hs);
  const AttentionDropout& d = a.dropout;
  const bool drop = d.p > 0.0;
  const DropoutMask mask =
      drop ? dropout_mask(d.p, d.seed, d.rank, d.stream, d.step) : DropoutMask{};
  const T keep_scale = dropout_scale<T>(d.p);
  const T* qkv = a.qkv.data();
  T* att_all = a.att.data();
  T* y = a.y.data();
  parallel_for(exec, b * nh, 1, [&](std::int64_t p0, std::int64_t p1, int) {
    std::vector<T> dropped(drop ? static_cast<std::size_t>(t * t) : 0);
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t bi = p / nh, h = p % nh;
      const T* q = qkv + bi * t * 3 * c + h * hs;
      const T* k = q + c;
      const T* v = q + 2 * c;
      T* att = att_all + p * t * t;
      gemm_serial(Trans::No, Trans::Yes, t, t, hs, scale, q, 3 * c, k, 3 * c, T(0), att, t);
      detail::causal_softmax_rows(att, t);
      const T* probs = att;
      if (drop) {
        detail::dropout_pair<T>(mask, keep_scale, p, t, att, dropped.data(), nullptr);
        probs = dropped.data();
      }
      gemm_serial(Trans::No, Trans::No, t, hs, t, T(1), probs, t, v, 3 * c, T(0),
                  y + bi * t * c + h * hs, c);
    }
  });
}

template <class T>
void attention_backward(const Exec<Cpu>& exec, const AttentionBackwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t b = a.qkv.dim(0), t = a.qkv.dim(1), c = a.qkv.dim(2) / 3, nh = a.n_head,
                     hs = c / nh;
  const T scale = attention_scale<T>(hs);
  const AttentionDropout& d = a.dropout;
  const bool drop = d.p > 0.0;
  const DropoutMask mask =
      drop ? dropout_mask(d.p, d.seed, d.rank, d.stream, d.step) : DropoutMask{};
  const T keep_scale = dropout_scale<T>(d.p);
  const T* qkv = a.qkv.data();
  const T* att_all = a.att.data();
  const T* dy_all = a.dy.data();
  T* dqkv = a.dqkv.data();
  parallel_for(exec, b * nh, 1, [&](std::int64_t p0, std::int64_t p1, int) {
    // (T x T), reused per pair
    std::vector<T> datt(static_cast<std::size_t>(t * t));
    std::vector<T> dropped(drop ? static_cast<std::size_t>(t * t) : 0);
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t bi = p / nh, h = p % nh;
      const std::int64_t off = bi * t * 3 * c + h * hs;
      const T* q = qkv + off;
      const T* k = q + c;
      const T* v = q + 2 * c;
      T* dq = dqkv + off;
      T* dk = dq + c;
      T* dv = dq + 2 * c;
      const T* att = att_all + p * t * t;
      const T* dy = dy_all + bi * t * c + h * hs;
      gemm_serial(Trans::No, Trans::Yes, t, t, hs, T(1), dy, c, v, 3 * c, T(0), datt.data(), t);
      const T* probs = att;
      if (drop) {  // the forward's mask again: dropped for dv, and datt becomes d(undropped att)
        detail::dropout_pair<T>(mask, keep_scale, p, t, att, dropped.data(), datt.data());
        probs = dropped.data();
      }
      gemm_serial(Trans::Yes, Trans::No, t, hs, t, T(1), probs, t, dy, c, T(0), dv, 3 * c);
      detail::causal_softmax_backward_rows(att, datt.data(), t);
      gemm_serial(Trans::No, Trans::No, t, hs, t, scale, datt.data(), t, k, 3 * c, T(0), dq, 3 * c);
      gemm_serial(Trans::Yes, Trans::No, t, hs, t, scale, datt.data(), t, q, 3 * c, T(0), dk,
                  3 * c);
    }
  });
}

}  // namespace ddp::kernels::cpu
