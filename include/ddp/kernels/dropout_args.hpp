// Dropout kernels' argument structs and their checks (inverted dropout, masks per
// docs/decisions/0043).
// SPDX-License-Identifier: MIT
//
// Kernels<D> (kernels/kernels.hpp) takes these like the Args of kernels/args.hpp, with the same
// validate() words.
#pragma once

#include <cstdint>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

// Inverted dropout (torch.nn.Dropout in training): y = keep ? x / (1 - p) : 0, keep with
// probability 1 - p. The mask is a function of (seed, rank, stream, step) and the element index
// (kernels/elementwise.hpp, DropoutMask): element i uses word i % 4 of block (step << 32) + i / 4
// of Generator(seed, rank, stream) (tensor/random.hpp) and is dropped when that word's unit value
// (w + 0.5) / 2^32 is below p.
template <class T, Device D>
struct DropoutForwardArgs {
  TensorView<const T, D> x;
  TensorView<T, D> y;                // same shape as x; overwritten (may alias x)
  TensorView<std::uint8_t, D> mask;  // same shape as x; overwritten: 1 kept, 0 dropped
  double p = 0.5;                    // in [0, 1]
  std::uint64_t seed = 0;
  std::uint32_t rank = 0;
  std::uint32_t stream = 0;
  std::uint64_t step = 0;  // below 2^32
};

// dx = mask ? dy / (1 - p) : 0.
template <class T, Device D>
struct DropoutBackwardArgs {
  TensorView<const T, D> dy;
  TensorView<const std::uint8_t, D> mask;  // same shape as dy, from the forward
  TensorView<T, D> dx;                     // same shape as dy; overwritten (may alias dy)
  double p = 0.5;
};

inline void validate_dropout_p(double p, const char* op) {
  if (!(p >= 0.0 && p <= 1.0))
    throw ValueError(detail::str("ddp: ", op, ": p must be in [0, 1], got ", p));
}

// What one step's mask can draw (kernels/elementwise.hpp, DropoutMask): numel elements, at most
// 2^32 Philox blocks of 4, and a step below 2^32 (the counter's 32-bit words).
inline void validate_dropout_draw(std::int64_t numel, std::uint64_t step, const char* op) {
  if (numel > (std::int64_t{1} << 34))
    throw ValueError(detail::str("ddp: ", op, ": ", numel,
                                 " elements exceed the 2^34 one step's mask can draw"));
  if (step >> 32)
    throw ValueError(detail::str("ddp: ", op, ": step ", step, " must be below 2^32"));
}

template <class T, Device D>
void validate(const DropoutForwardArgs<T, D>& a) {
  const char* op = "dropout_forward";
  validate_dropout_p(a.p, op);
  expect_shape(a.y, a.x.shape(), "output y", op);
  expect_shape(a.mask, a.x.shape(), "mask", op);
  validate_dropout_draw(a.x.numel(), a.step, op);
}

template <class T, Device D>
void validate(const DropoutBackwardArgs<T, D>& a) {
  const char* op = "dropout_backward";
  validate_dropout_p(a.p, op);
  expect_shape(a.mask, a.dy.shape(), "mask", op);
  expect_shape(a.dx, a.dy.shape(), "input gradient dx", op);
}

}  // namespace ddp::kernels
