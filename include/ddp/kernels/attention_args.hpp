// Argument structs and checks of causal multi-head self-attention (minGPT's CausalSelfAttention).
// SPDX-License-Identifier: MIT
//
// The kernels work on the packed projection qkv = c_attn(x) (B, T, 3C), as llm.c does: row (b, t)
// holds q (columns [0, C)), k ([C, 2C)) and v ([2C, 3C)); head h of each is the hs = C / n_head
// columns from h * hs. So q of head h, batch b is a (T x hs) matrix with leading dimension 3C
// inside qkv, and no kernel transposes to (B, nh, T, hs) or back:
//   attention_forward   att = softmax(causal_mask(q k^T / sqrt(hs)))  (B, nh, T, T);
//                       y = dropout(att) v  (B, T, C)
//   attention_backward  dqkv (B, T, 3C) from dy (B, T, C), qkv and the forward's att
// Both Kernels<D> implement them (kernels/cpu/attention.hpp, kernels/cuda/attention.cuh).
// validate() throws ValueError. Dropout (minGPT's attn_dropout): att keeps the undropped
// probabilities, which the softmax backward needs; the dropped ones live only in a scratch for the
// y GEMM (and the backward's dv GEMM, which redraws the same mask from its Philox counters).
#pragma once

#include <cmath>
#include <cstdint>

#include "ddp/config.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/dropout_args.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

// Inverted dropout on att before the y GEMM: y = (mask * att / (1 - p)) v. The mask is
// nn::Dropout's over att (B, nh, T, T) as one tensor (docs/decisions/0043): element e (att's flat
// index ((b nh + h) T + i) T + j) uses word e % 4 of block (step << 32) + e / 4 of
// Generator(seed, rank, stream), so both devices, any thread count and the backward's redraw see
// the same mask. p = 0 (the default): no dropout, nothing drawn.
struct AttentionDropout {
  double p = 0.0;  // in [0, 1]
  std::uint64_t seed = 0;
  std::uint32_t rank = 0;
  std::uint32_t stream = 0;
  std::uint64_t step = 0;  // below 2^32
};

template <class T, Device D>
struct AttentionForwardArgs {
  TensorView<const T, D> qkv;  // (B, T, 3C): q, k, v side by side
  // (B, nh, T, T): overwritten with the probabilities; row i is 0 beyond column i
  TensorView<T, D> att;
  // (B, T, C): att v with the heads side by side (torch's y.transpose(1, 2).view(B, T, C))
  TensorView<T, D> y;
  std::int64_t n_head = 1;
  AttentionDropout dropout;  // on att before y = att v (att itself is written undropped)
};

template <class T, Device D>
struct AttentionBackwardArgs {
  TensorView<const T, D> qkv;  // (B, T, 3C): the forward's input
  TensorView<const T, D> att;  // (B, nh, T, T): the forward's probabilities (undropped)
  TensorView<const T, D> dy;   // (B, T, C)
  TensorView<T, D> dqkv;       // (B, T, 3C): overwritten with dq, dk, dv side by side
  std::int64_t n_head = 1;
  AttentionDropout dropout;  // the forward's, so the same mask
};

// Row i of one (batch, head)'s probabilities under dropout mask m, for both devices; e_row is the
// flat index in att of the row's element (i, 0). For j <= i, dropped[j] = att[j] * scale if m
// keeps element e_row + j, else 0; datt (backward: d(dropped att) in, d(att) out, in place)
// likewise. Columns beyond i are left alone (att is 0 there). One Philox block per 4 elements:
// worker `lane` of `stride` takes blocks e_row / 4 + lane, + stride, ... (a warp's 32 lanes on the
// GPU; lane 0 of 1 on the CPU). A block straddling two rows is evaluated for each (same words).
template <class T>
DDP_HOST_DEVICE void attention_dropout_row(const DropoutMask& m, T scale, std::uint64_t e_row,
                                           std::int64_t i, const T* att, T* dropped, T* datt,
                                           unsigned lane, unsigned stride) {
  // one past the row's last element <= i
  const std::uint64_t end = e_row + static_cast<std::uint64_t>(i) + 1;
  for (std::uint64_t blk = e_row / 4 + lane; 4 * blk < end; blk += stride) {
    std::uint32_t w[4];
    m.words(blk, w);
    for (unsigned k = 0; k < 4; ++k) {
      const std::uint64_t e = 4 * blk + k;
      if (e < e_row || e >= end) continue;
      const std::uint64_t j = e - e_row;
      const bool keep = m.keep(w[k]);
      dropped[j] = keep ? att[j] * scale : T(0);
      if (datt != nullptr) datt[j] = keep ? datt[j] * scale : T(0);
    }
  }
}

inline void validate_attention_dropout(const AttentionDropout& d, std::int64_t att_numel,
                                       const char* op) {
  validate_dropout_p(d.p, op);
  if (d.p > 0.0) validate_dropout_draw(att_numel, d.step, op);
}

// torch's 1.0 / math.sqrt(hs) in double, rounded once to T: every device's score scale.
template <class T>
T attention_scale(std::int64_t hs) {
  return static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
}

// Checks qkv (B, T, 3C) with C divisible by n_head and returns C.
template <class T, Device D>
std::int64_t validate_qkv(const TensorView<const T, D>& qkv, std::int64_t n_head, const char* op) {
  if (qkv.rank() != 3 || qkv.dim(0) < 1 || qkv.dim(1) < 1 || qkv.dim(2) % 3 != 0)
    throw ValueError(detail::str(
        "ddp: ", op, ": qkv ", qkv.shape(),
        " must be (B, T, 3C) with B, T >= 1: q, k and v of every position side by side"));
  const std::int64_t c = qkv.dim(2) / 3;
  if (n_head < 1 || c % n_head != 0)
    throw ValueError(
        detail::str("ddp: ", op, ": n_head = ", n_head, " must be >= 1 and divide C = ", c));
  return c;
}

template <class T, Device D>
void validate(const AttentionForwardArgs<T, D>& a) {
  const char* op = "attention_forward";
  const std::int64_t c = validate_qkv(a.qkv, a.n_head, op);
  const std::int64_t b = a.qkv.dim(0), t = a.qkv.dim(1);
  expect_shape(a.att, Shape{b, a.n_head, t, t}, "probabilities att", op);
  expect_shape(a.y, Shape{b, t, c}, "output y", op);
  validate_attention_dropout(a.dropout, a.att.numel(), op);
}

template <class T, Device D>
void validate(const AttentionBackwardArgs<T, D>& a) {
  const char* op = "attention_backward";
  const std::int64_t c = validate_qkv(a.qkv, a.n_head, op);
  const std::int64_t b = a.qkv.dim(0), t = a.qkv.dim(1);
  expect_shape(a.att, Shape{b, a.n_head, t, t}, "probabilities att", op);
  expect_shape(a.dy, Shape{b, t, c}, "output gradient dy", op);
  expect_shape(a.dqkv, a.qkv.shape(), "input gradient dqkv", op);
  validate_attention_dropout(a.dropout, a.att.numel(), op);
}

}  // namespace ddp::kernels
