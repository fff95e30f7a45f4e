// Conv2d: 2-D convolution over NHWC activations with KRSC weights (torch.nn.Conv2d without groups).
// SPDX-License-Identifier: MIT
//
//   x (N, H, W, C_in) -> y (N, H_out, W_out, C_out),  H_out = (H + 2 pad - dil (k - 1) - 1) /
//     stride + 1
// Parameters: "weight" (C_out, kH, kW, C_in) in ddp's layout, (C_out, C_in, kH, kW) in the
// state_dict; "bias" (C_out) unless .bias = false (default true, as in torch; ResNet's convs have
// none). Initialisation at construction (torch's reset_parameters, nn/init.hpp): weight and bias ~
// U(-b, b), b = 1/sqrt(C_in kH kW), from the default generator (tensor/random.hpp's manual_seed).
// forward keeps a view of x: the caller keeps x alive and unchanged until backward (parents do).
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

struct Conv2dOptions {
  std::int64_t in_channels = 0;
  std::int64_t out_channels = 0;
  std::int64_t kernel_size = 3;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t dilation = 1;
  // torch.nn.Conv2d's default; ResNet's convolutions, followed by BatchNorm, pass false
  bool bias = true;
};

template <class T, Device D, class A = T>
class Conv2d : public Module<T, D, A> {
 public:
  explicit Conv2d(const Conv2dOptions& o) : o_(o) {
    if (o.in_channels < 1 || o.out_channels < 1 || o.kernel_size < 1 || o.stride < 1 ||
        o.padding < 0 || o.dilation < 1)
      throw ValueError(ddp::detail::str(
          "ddp: invalid ", describe(),
          ": channels, kernel_size, stride and dilation must be >= 1, padding >= 0"));
    weight_ = &this->register_parameter(
        "weight", Shape{o.out_channels, o.kernel_size, o.kernel_size, o.in_channels}, Layout::Krsc);
    if (o.bias) bias_ = &this->register_parameter("bias", Shape{o.out_channels});
    if (!SkipDefaultInit::active()) reset_parameters();
  }

  // torch.nn.Conv2d's default: kaiming_uniform_(a = sqrt(5)) == U(-b, b), b = 1/sqrt(fan_in),
  // fan_in = C_in kH kW (torch's weight.size(1) * kH * kW); bias the same. Draws the weight in
  // ddp's KRSC order, then the bias.
  void reset_parameters(Generator& gen) {
    const double bound = fan_in_bound(o_.in_channels * o_.kernel_size * o_.kernel_size);
    init_uniform(*weight_, gen, -bound, bound);
    if (bias_) init_uniform(*bias_, gen, -bound, bound);
  }
  // The same from the default generator (what the constructor does).
  void reset_parameters() {
    with_default_generator([&](Generator& gen) { reset_parameters(gen); });
  }

  const Conv2dOptions& options() const noexcept { return o_; }
  Parameter<T, D>& weight() noexcept { return *weight_; }  // (C_out, kH, kW, C_in)
  Parameter<T, D>* bias() noexcept { return bias_; }       // (C_out) or nullptr
  // false: backward computes no input gradient and returns an empty tensor (a network's first
  // layer).
  void set_input_grad(bool on) noexcept { input_grad_ = on; }

  std::string describe() const override {
    return ddp::detail::str(
        "Conv2d(", o_.in_channels, ", ", o_.out_channels, ", kernel_size=", o_.kernel_size,
        ", stride=", o_.stride, ", padding=", o_.padding,
        o_.dilation != 1 ? ddp::detail::str(", dilation=", o_.dilation) : std::string(),
        o_.bias ? "" : ", bias=False", ")");
  }

  Shape output_shape(const Shape& x) const {
    check_input(x);
    const std::int64_t ho =
        kernels::conv_out_size(x[1], o_.kernel_size, o_.stride, o_.padding, o_.dilation);
    const std::int64_t wo =
        kernels::conv_out_size(x[2], o_.kernel_size, o_.stride, o_.padding, o_.dilation);
    if (ho < 1 || wo < 1)
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": the ", x[1], "x", x[2],
                                        " input is too small for the kernel (input shape ", x,
                                        "); use larger images"));
    return Shape{x[0], ho, wo, o_.out_channels};
  }

  Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) override {
    Tensor<A, D> y(output_shape(x.shape()));
    Kernels<D>::conv2d_forward(
        exec, kernels::Conv2dForwardArgs<T, D, A>{
                  .x = x,
                  .w = weight_->value().cview(),
                  .bias = bias_ ? bias_->value().cview() : TensorView<const T, D>(),
                  .y = y.view(),
                  .stride = size2(o_.stride),
                  .padding = size2(o_.padding),
                  .dilation = size2(o_.dilation)});
    x_ = x;
    have_x_ = true;
    return y;
  }

  Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dy) override {
    this->require_forward_state(have_x_);
    Tensor<A, D> dx = input_grad_ ? Tensor<A, D>(x_.shape()) : Tensor<A, D>();
    run_backward(exec, dy, input_grad_ ? dx.view() : TensorView<A, D>(), false);
    return dx;
  }
  // backward() that adds d(loss)/dx into dx (x's shape) instead of returning it: a residual block's
  // first conv adds its input gradient to the skip path's in its dgrad (docs/decisions/0061).
  void backward_accumulate(Exec<D>& exec, TensorView<const A, D> dy, TensorView<A, D> dx) {
    const trace::Span span = this->trace_span("backward");
    this->require_forward_state(have_x_);
    if (!(dx.shape() == x_.shape()))
      throw ValueError(ddp::detail::str("ddp: backward of ", this->where(),
                                        ": the input gradient to add to has shape ", dx.shape(),
                                        " but the input has shape ", x_.shape()));
    this->check_input_kept();
    run_backward(exec, dy, input_grad_ ? dx : TensorView<A, D>(), true);
  }
  // Points backward at x instead of the forward's input: the same values at another address (a
  // residual block freed the input after forward and recomputed it, docs/decisions/0068). Same
  // shape; between forward and backward.
  void rebind_input(TensorView<const A, D> x) {
    this->require_forward_state(have_x_);
    if (!(x.shape() == x_.shape()))
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": rebind_input got shape ",
                                        x.shape(), " but the forward's input has shape ",
                                        x_.shape()));
    x_ = x;
    this->remember_input(x.data());
  }

 private:
  static kernels::Size2 size2(std::int64_t v) { return kernels::Size2{.h = v, .w = v}; }
  void run_backward(Exec<D>& exec, TensorView<const A, D> dy, TensorView<A, D> dx,
                    bool accumulate) {
    have_x_ = false;
    Kernels<D>::conv2d_backward(exec, kernels::Conv2dBackwardArgs<T, D, A>{
                                          .x = x_,
                                          .w = weight_->value().cview(),
                                          .dy = dy,
                                          .dx = dx,
                                          .dw = weight_->grad_dest(),
                                          .dbias = bias_ ? bias_->grad_dest() : TensorView<T, D>(),
                                          .stride = size2(o_.stride),
                                          .padding = size2(o_.padding),
                                          .dilation = size2(o_.dilation),
                                          .accumulate_dx = accumulate});
    weight_->grad_done(exec);
    if (bias_) bias_->grad_done(exec);
  }
  void check_input(const Shape& x) const {
    if (x.rank() != 4)
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": input must be NHWC (N, H, W, C) but has shape ", x));
    if (x[0] == 0)
      throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                        ": batch of zero images (input shape ", x,
                                        "); check --batch-size and the loader"));
    if (x[3] != o_.in_channels)
      throw ValueError(ddp::detail::str(
          "ddp: ", this->where(), ": input has ", x[3], " channels but the layer expects ",
          o_.in_channels, " (input shape ", x,
          ", NHWC: channels last; is the input NCHW, or the previous layer mis-sized?)"));
  }

  Conv2dOptions o_;
  Parameter<T, D>* weight_ = nullptr;  // (C_out, kH, kW, C_in)
  Parameter<T, D>* bias_ = nullptr;    // (C_out)
  TensorView<const A, D> x_;           // forward input (N, H, W, C_in), owned by the caller
  bool have_x_ = false;
  bool input_grad_ = true;
};

}  // namespace ddp::nn
