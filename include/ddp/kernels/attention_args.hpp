// Argument structs of causal multi-head self-attention (the core of minGPT's CausalSelfAttention) and their checks.
// SPDX-License-Identifier: MIT
//
// The kernels work on the packed projection qkv = c_attn(x) (B, T, 3C), as llm.c's attention_forward does: row
// (b, t) holds q (columns [0, C)), k ([C, 2C)) and v ([2C, 3C)); head h of each is the hs = C / n_head columns
// starting at h * hs. So q of head h for batch b is a (T x hs) matrix with leading dimension 3C inside qkv, and
// no kernel needs a transpose to (B, nh, T, hs) or back:
//   attention_forward   att = softmax(causal_mask(q k^T / sqrt(hs))) (B, nh, T, T);  y = att v as (B, T, C)
//   attention_backward  dqkv (B, T, 3C) from dy (B, T, C), qkv and the forward's att
// Kernels<Cpu> (kernels/cpu/attention.hpp) and Kernels<Cuda> (kernels/cuda/attention.cuh) implement them; both are
// in KernelsApi. validate() throws ValueError like args.hpp's.
#pragma once

#include <cmath>
#include <cstdint>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

template <class T, Device D>
struct AttentionForwardArgs {
  TensorView<const T, D> qkv;  // (B, T, 3C): q, k, v side by side
  TensorView<T, D> att;        // (B, nh, T, T): overwritten with the probabilities; row i is 0 beyond column i
  TensorView<T, D> y;          // (B, T, C): att v with the heads side by side (torch's y.transpose(1, 2).view(B, T, C))
  std::int64_t n_head = 1;
};

template <class T, Device D>
struct AttentionBackwardArgs {
  TensorView<const T, D> qkv;  // (B, T, 3C): the forward's input
  TensorView<const T, D> att;  // (B, nh, T, T): the forward's probabilities
  TensorView<const T, D> dy;   // (B, T, C)
  TensorView<T, D> dqkv;       // (B, T, 3C): overwritten with dq, dk, dv side by side
  std::int64_t n_head = 1;
};

// torch's 1.0 / math.sqrt(hs), computed in double and rounded once to T: the scores' scale of every device's kernel.
template <class T>
T attention_scale(std::int64_t hs) {
  return static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
}

// Checks qkv (B, T, 3C) with C divisible by n_head and returns C.
template <class T, Device D>
std::int64_t validate_qkv(const TensorView<const T, D>& qkv, std::int64_t n_head, const char* op) {
  if (qkv.rank() != 3 || qkv.dim(0) < 1 || qkv.dim(1) < 1 || qkv.dim(2) % 3 != 0)
    throw ValueError(detail::str("ddp: ", op, ": qkv ", qkv.shape(),
                                 " must be (B, T, 3C) with B, T >= 1: q, k and v of every position side by side"));
  const std::int64_t c = qkv.dim(2) / 3;
  if (n_head < 1 || c % n_head != 0)
    throw ValueError(detail::str("ddp: ", op, ": n_head = ", n_head, " must be >= 1 and divide C = ", c));
  return c;
}

template <class T, Device D>
void validate(const AttentionForwardArgs<T, D>& a) {
  const char* op = "attention_forward";
  const std::int64_t c = validate_qkv(a.qkv, a.n_head, op);
  const std::int64_t b = a.qkv.dim(0), t = a.qkv.dim(1);
  expect_shape(a.att, Shape{b, a.n_head, t, t}, "probabilities att", op);
  expect_shape(a.y, Shape{b, t, c}, "output y", op);
}

template <class T, Device D>
void validate(const AttentionBackwardArgs<T, D>& a) {
  const char* op = "attention_backward";
  const std::int64_t c = validate_qkv(a.qkv, a.n_head, op);
  const std::int64_t b = a.qkv.dim(0), t = a.qkv.dim(1);
  expect_shape(a.att, Shape{b, a.n_head, t, t}, "probabilities att", op);
  expect_shape(a.dy, Shape{b, t, c}, "output gradient dy", op);
  expect_shape(a.dqkv, a.qkv.shape(), "input gradient dqkv", op);
}

}  // namespace ddp::kernels
