// LayerNorm kernels' argument structs and their checks (torch.nn.LayerNorm over the last
// dimension).
// SPDX-License-Identifier: MIT
//
// Kernels<D> (kernels/kernels.hpp) takes these like the Args of kernels/args.hpp, with the same
// validate() words.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

// The per-row statistics LayerNorm keeps for backward: float for float and the 16-bit types, double
// for double.
template <class T>
using LayerNormStat = std::conditional_t<std::is_same_v<T, double>, double, float>;

// torch.nn.LayerNorm over the last dimension of rows of C elements (the module flattens any leading
// dims):
//   mean = sum x / C, var = sum (x - mean)^2 / C (biased), rstd = 1 / sqrt(var + eps)
//   y = ((x - mean) rstd) * weight + bias
template <class T, Device D>
struct LayerNormForwardArgs {
  TensorView<const T, D> x;              // (M, C)
  TensorView<const T, D> weight;         // (C), optional (elementwise_affine=False: 1)
  TensorView<const T, D> bias;           // (C), optional (0)
  TensorView<T, D> y;                    // (M, C); overwritten
  TensorView<LayerNormStat<T>, D> mean;  // (M); overwritten
  TensorView<LayerNormStat<T>, D> rstd;  // (M); overwritten
  double eps = 1e-5;
};

// With xhat = (x - mean) rstd and g = dy * weight (dy when no weight):
//   dx = rstd (g - mean_row(g) - xhat mean_row(g xhat)),  dweight = sum_rows dy xhat,  dbias =
//     sum_rows dy
template <class T, Device D>
struct LayerNormBackwardArgs {
  TensorView<const T, D> x;                    // (M, C), the forward input
  TensorView<const T, D> weight;               // (C), optional
  TensorView<const LayerNormStat<T>, D> mean;  // (M), from the forward
  TensorView<const LayerNormStat<T>, D> rstd;  // (M), from the forward
  TensorView<const T, D> dy;                   // (M, C)
  TensorView<T, D> dx;                         // (M, C), optional; overwritten
  TensorView<T, D> dweight;                    // (C), optional; overwritten
  TensorView<T, D> dbias;                      // (C), optional; overwritten
};

template <class T, Device D>
void validate_layer_norm_x(const TensorView<const T, D>& x, const TensorView<const T, D>& weight,
                           const char* op) {
  if (x.rank() != 2 || x.dim(0) == 0 || x.dim(1) == 0)
    throw ValueError(
        detail::str("ddp: ", op, ": x ", x.shape(),
                    " must be (M, C) with M, C >= 1; flatten the leading dimensions first"));
  if (!weight.empty()) expect_shape(weight, Shape{x.dim(1)}, "weight", op);
}

template <class T, Device D>
void validate(const LayerNormForwardArgs<T, D>& a) {
  const char* op = "layer_norm_forward";
  validate_layer_norm_x(a.x, a.weight, op);
  if (!a.bias.empty()) expect_shape(a.bias, Shape{a.x.dim(1)}, "bias", op);
  expect_shape(a.y, a.x.shape(), "output y", op);
  expect_shape(a.mean, Shape{a.x.dim(0)}, "mean", op);
  expect_shape(a.rstd, Shape{a.x.dim(0)}, "rstd", op);
  if (!(a.eps > 0.0)) throw ValueError(detail::str("ddp: ", op, ": eps must be > 0, got ", a.eps));
}

template <class T, Device D>
void validate(const LayerNormBackwardArgs<T, D>& a) {
  const char* op = "layer_norm_backward";
  validate_layer_norm_x(a.x, a.weight, op);
  expect_shape(a.mean, Shape{a.x.dim(0)}, "mean", op);
  expect_shape(a.rstd, Shape{a.x.dim(0)}, "rstd", op);
  expect_shape(a.dy, a.x.shape(), "output gradient dy", op);
  if (!a.dx.empty()) expect_shape(a.dx, a.x.shape(), "input gradient dx", op);
  if (!a.dweight.empty()) expect_shape(a.dweight, Shape{a.x.dim(1)}, "weight gradient dweight", op);
  if (!a.dbias.empty()) expect_shape(a.dbias, Shape{a.x.dim(1)}, "bias gradient dbias", op);
}

}  // namespace ddp::kernels
