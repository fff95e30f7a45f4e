// LayerNorm over the last dimension (torch.nn.LayerNorm(normalized_shape=C)): x (..., C) -> y (...,
// C).
// SPDX-License-Identifier: MIT
//
// Each row of C elements is normalised by its own mean and biased variance, then scaled and
// shifted:
//   y = (x - mean) / sqrt(var + eps) * weight + bias          (formulas:
//     kernels/cpu/layer_norm.hpp)
// Parameters "weight" and "bias" (C), torch's names, set to ones and zeros at construction (torch's
// reset_parameters, no random draw); elementwise_affine = false registers neither, bias = false
// only no bias (torch >= 2.1's option). Forward keeps a view of x (THE CALLER KEEPS x ALIVE until
// backward returns, nn/module.hpp) and the mean and 1/std of every row (float for float, double for
// double: LayerNormStat<T>); backward returns dx and fills the parameter gradients. In a (B, T, C)
// transformer activation the rows are the B*T token positions. Devices:
// Kernels<D>::layer_norm_forward/backward (kernels/cpu/layer_norm.hpp,
// kernels/cuda/layer_norm.cuh).
#pragma once

#include <cstdint>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

struct LayerNormOptions {
  std::int64_t normalized_shape = 0;  // C, the size of the last dimension
  double eps = 1e-5;
  bool elementwise_affine = true;  // learnable weight (and bias)
  bool bias = true;                // with elementwise_affine: learnable bias
};

template <class T, Device D>
class LayerNorm : public Module<T, D> {
 public:
  using Stat = kernels::LayerNormStat<T>;

  explicit LayerNorm(const LayerNormOptions& o) : o_(o) {
    if (o.normalized_shape < 1)
      throw ValueError(
          ddp::detail::str("ddp: LayerNorm needs normalized_shape >= 1, got ", o.normalized_shape));
    if (!(o.eps > 0.0))
      throw ValueError(ddp::detail::str("ddp: LayerNorm needs eps > 0, got ", o.eps));
    if (o.elementwise_affine) {
      weight_ = &this->register_parameter("weight", Shape{o.normalized_shape});
      if (o.bias) bias_ = &this->register_parameter("bias", Shape{o.normalized_shape});
    }
    reset_parameters();
  }

  // weight 1, bias 0 (torch.nn.LayerNorm.reset_parameters); nothing without elementwise_affine.
  void reset_parameters() {
    if (weight_) detail::fill_value(weight_->value(), T(1));
    if (bias_) detail::zero_fill(bias_->value());
  }

  const LayerNormOptions& options() const noexcept { return o_; }
  Parameter<T, D>* weight() noexcept { return weight_; }
  Parameter<T, D>* bias() noexcept { return bias_; }

  std::string describe() const override {
    return ddp::detail::str("LayerNorm((", o_.normalized_shape, ",), eps=", o_.eps,
                            ", elementwise_affine=", o_.elementwise_affine ? "True" : "False",
                            o_.elementwise_affine && !o_.bias ? ", bias=False" : "", ")");
  }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    const std::int64_t c = o_.normalized_shape;
    if (x.rank() < 1 || x.dim(-1) != c)
      throw ValueError(ddp::detail::str(
          "ddp: ", this->where(), ": input ", x.shape(), " must end in a dimension of ", c,
          " (the normalized_shape); the previous layer's output does not fit"));
    if (x.numel() == 0)
      throw ValueError(
          ddp::detail::str("ddp: ", this->where(), ": empty input (shape ", x.shape(), ")"));
    const std::int64_t rows = x.numel() / c;
    x_ = x.reshape(Shape{rows, c});
    x_shape_ = x.shape();
    if (mean_.numel() != rows) {
      mean_ = Tensor<Stat, D>(Shape{rows});
      rstd_ = Tensor<Stat, D>(Shape{rows});
    }
    Tensor<T, D> y(x.shape());
    Kernels<D>::layer_norm_forward(
        exec, kernels::LayerNormForwardArgs<T, D>{
                  .x = x_,
                  .weight = weight_ ? weight_->value().cview() : TensorView<const T, D>(),
                  .bias = bias_ ? bias_->value().cview() : TensorView<const T, D>(),
                  .y = y.view().reshape(Shape{rows, c}),
                  .mean = mean_.view(),
                  .rstd = rstd_.view(),
                  .eps = o_.eps});
    have_x_ = true;
    return y;
  }

  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_x_);
    have_x_ = false;
    expect_shape(dy, x_shape_, "output gradient dy", "LayerNorm.backward");
    Tensor<T, D> dx(x_shape_);
    Kernels<D>::layer_norm_backward(
        exec, kernels::LayerNormBackwardArgs<T, D>{
                  .x = x_,
                  .weight = weight_ ? weight_->value().cview() : TensorView<const T, D>(),
                  .mean = mean_.cview(),
                  .rstd = rstd_.cview(),
                  .dy = dy.reshape(x_.shape()),
                  .dx = dx.view().reshape(x_.shape()),
                  .dweight = weight_ ? weight_->grad_dest() : TensorView<T, D>(),
                  .dbias = bias_ ? bias_->grad_dest() : TensorView<T, D>()});
    if (weight_) weight_->grad_done(exec);
    if (bias_) bias_->grad_done(exec);
    return dx;
  }

 private:
  LayerNormOptions o_;
  Parameter<T, D>* weight_ = nullptr;  // (C), ones
  Parameter<T, D>* bias_ = nullptr;    // (C), zeros
  TensorView<const T, D> x_;           // forward input seen as (rows, C), owned by the caller
  Shape x_shape_;
  Tensor<Stat, D> mean_, rstd_;  // (rows) per-row statistics of the last forward
  bool have_x_ = false;
};

}  // namespace ddp::nn
