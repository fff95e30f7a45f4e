// Linear: y = x W^T + b (torch.nn.Linear); x (N, in) or any (N, ...) whose trailing dims multiply
// to `in`.
// SPDX-License-Identifier: MIT
//
// Parameters "weight" (out, in) and "bias" (out), same layout as PyTorch. ResNet feeds it the
// pooled (N, 1, 1, C) activations, which it sees as (N, C) (torch.flatten(x, 1) of an NCHW (N, C,
// 1, 1) is the same numbers). Initialisation at construction (torch's reset_parameters,
// nn/init.hpp): weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)) from the default generator
// (tensor/random.hpp's manual_seed). backward returns dx with the shape forward's x had.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/init.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::nn {

struct LinearOptions {
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  bool bias = true;
};

template <class T, Device D, class A = T>
class Linear : public Module<T, D, A> {
 public:
  explicit Linear(const LinearOptions& o) : o_(o) {
    if (o.in_features < 1 || o.out_features < 1)
      throw ValueError(
          ddp::detail::str("ddp: Linear needs in_features and out_features >= 1, got (",
                           o.in_features, ", ", o.out_features, ")"));
    weight_ = &this->register_parameter("weight", Shape{o.out_features, o.in_features});
    if (o.bias) bias_ = &this->register_parameter("bias", Shape{o.out_features});
    if (!SkipDefaultInit::active()) reset_parameters();
  }

  // torch.nn.Linear's default: kaiming_uniform_(a = sqrt(5)) == U(-1/sqrt(in), 1/sqrt(in)); bias
  // the same. Draws the weight (row-major (out, in)), then the bias.
  void reset_parameters(Generator& gen) {
    const double bound = fan_in_bound(o_.in_features);
    init_uniform(*weight_, gen, -bound, bound);
    if (bias_) init_uniform(*bias_, gen, -bound, bound);
  }
  // The same from the default generator (what the constructor does).
  void reset_parameters() {
    with_default_generator([&](Generator& gen) { reset_parameters(gen); });
  }

  const LinearOptions& options() const noexcept { return o_; }
  Parameter<T, D>& weight() noexcept { return *weight_; }
  Parameter<T, D>* bias() noexcept { return bias_; }

  std::string describe() const override {
    return ddp::detail::str("Linear(in_features=", o_.in_features,
                            ", out_features=", o_.out_features,
                            ", bias=", o_.bias ? "True" : "False", ")");
  }

  Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) override {
    if (x.rank() < 1 || x.dim(0) == 0)
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": batch of zero samples (input shape ", x.shape(),
                                        "); check --batch-size and the loader"));
    const std::int64_t n = x.dim(0), features = x.numel() / n;
    if (features != o_.in_features)
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": input ", x.shape(), " has ",
                                        features, " features per sample but the layer expects ",
                                        o_.in_features,
                                        "; the previous layer's output does not fit this one"));
    x_ = x.reshape(Shape{n, features});
    x_shape_ = x.shape();
    Tensor<A, D> y(Shape{n, o_.out_features});
    Kernels<D>::linear_forward(
        exec, kernels::LinearForwardArgs<T, D, A>{
                  .x = x_,
                  .w = weight_->value().cview(),
                  .bias = bias_ ? bias_->value().cview() : TensorView<const T, D>(),
                  .y = y.view()});
    have_x_ = true;
    return y;
  }

  Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dy) override {
    this->require_forward_state(have_x_);
    have_x_ = false;
    Tensor<A, D> dx(x_.shape());
    Kernels<D>::linear_backward(exec,
                                kernels::LinearBackwardArgs<T, D, A>{
                                    .x = x_,
                                    .w = weight_->value().cview(),
                                    .dy = dy,
                                    .dx = dx.view(),
                                    .dw = weight_->grad_dest(),
                                    .dbias = bias_ ? bias_->grad_dest() : TensorView<T, D>()});
    weight_->grad_done(exec);
    if (bias_) bias_->grad_done(exec);
    dx.reshape(x_shape_);
    return dx;
  }

 private:
  LinearOptions o_;
  Parameter<T, D>* weight_ = nullptr;  // (out, in)
  Parameter<T, D>* bias_ = nullptr;    // (out)
  TensorView<const A, D> x_;           // forward input seen as (N, in), owned by the caller
  Shape x_shape_;
  bool have_x_ = false;
};

}  // namespace ddp::nn
