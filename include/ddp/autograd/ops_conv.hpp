// conv2d, max_pool2d, adaptive_avg_pool2d and batch_norm on NHWC activations as autograd ops.
// SPDX-License-Identifier: MIT
#pragma once

#include "ddp/autograd/ops_core.hpp"

namespace ddp::autograd {

// ---- convolution, pooling and batch norm on NHWC activations (ddp's layout, docs/decisions/0005)
// conv2d: x (N, H, W, C_in), weight (C_out, kH, kW, C_in) (KRSC), bias (C_out) or an empty Var ->
// (N, H_out, W_out, C_out); torch's conv2d on the NCHW/OIHW permutations (no groups).
struct Conv2dOptions {
  kernels::Size2 stride{1, 1};
  kernels::Size2 padding{0, 0};
  kernels::Size2 dilation{1, 1};
};
template <class T, Device D>
Var<T, D> conv2d(const Var<T, D>& x, const Var<T, D>& weight, const Var<T, D>& bias = {},
                 Conv2dOptions o = {}) {
  const Shape ys =
      kernels::conv2d_output_shape<T, D>(x.value().cview(), weight.value().cview(), o.stride,
                                         o.padding, o.dilation, "autograd conv2d");
  if (bias.defined() && !(bias.shape() == Shape{ys[3]}))
    throw ValueError(ddp::detail::str("ddp: autograd: conv2d: bias has shape ", bias.shape(),
                                      " but the weight ", weight.shape(), " needs (", ys[3], ")"));
  Tensor<T, D> y(ys);
  Kernels<D>::conv2d_forward(
      x.exec(), kernels::Conv2dForwardArgs<T, D>{
                    .x = x.value().cview(),
                    .w = weight.value().cview(),
                    .bias = bias.defined() ? bias.value().cview() : TensorView<const T, D>(),
                    .y = y.view(),
                    .stride = o.stride,
                    .padding = o.padding,
                    .dilation = o.dilation});
  std::vector<std::shared_ptr<Node<T, D>>> inputs{x.node_ptr(), weight.node_ptr()};
  if (bias.defined()) inputs.push_back(bias.node_ptr());
  return detail::record<T, D>("conv2d", std::move(y), std::move(inputs), [o](Node<T, D>& n) {
    auto& X = *n.inputs[0];
    auto& W = *n.inputs[1];
    const bool gb = n.inputs.size() == 3 && n.inputs[2]->requires_grad;
    Tensor<T, D> dx, dw, db;
    if (X.requires_grad) dx = Tensor<T, D>(X.value.shape());
    if (W.requires_grad) dw = Tensor<T, D>(W.value.shape());
    if (gb) db = Tensor<T, D>(Shape{W.value.shape()[0]});
    Kernels<D>::conv2d_backward(n.exec, kernels::Conv2dBackwardArgs<T, D>{.x = X.value.cview(),
                                                                          .w = W.value.cview(),
                                                                          .dy = n.grad.cview(),
                                                                          .dx = dx.view(),
                                                                          .dw = dw.view(),
                                                                          .dbias = db.view(),
                                                                          .stride = o.stride,
                                                                          .padding = o.padding,
                                                                          .dilation = o.dilation});
    if (X.requires_grad) X.accumulate(std::move(dx));
    if (W.requires_grad) W.accumulate(std::move(dw));
    if (gb) n.inputs[2]->accumulate(std::move(db));
  });
}

// max_pool2d (torch's, -infinity padding, floor mode) on x (N, H, W, C); the gradient goes to each
// window's max.
template <class T, Device D>
Var<T, D> max_pool2d(const Var<T, D>& x, kernels::Size2 kernel, kernels::Size2 stride,
                     kernels::Size2 padding = {0, 0}) {
  const Shape ys = kernels::maxpool2d_output_shape(x.value().cview(), kernel, stride, padding);
  Tensor<T, D> y(ys);
  auto argmax = std::make_shared<Tensor<std::int32_t, D>>(ys);
  Kernels<D>::max_pool2d_forward(x.exec(),
                                 kernels::MaxPool2dForwardArgs<T, D>{.x = x.value().cview(),
                                                                     .y = y.view(),
                                                                     .argmax = argmax->view(),
                                                                     .kernel = kernel,
                                                                     .stride = stride,
                                                                     .padding = padding});
  return detail::record<T, D>(
      "max_pool2d", std::move(y), {x.node_ptr()}, [argmax, kernel, stride, padding](Node<T, D>& n) {
        Tensor<T, D> dx(n.inputs[0]->value.shape());
        Kernels<D>::max_pool2d_backward(
            n.exec, kernels::MaxPool2dBackwardArgs<T, D>{.dy = n.grad.cview(),
                                                         .argmax = argmax->cview(),
                                                         .dx = dx.view(),
                                                         .kernel = kernel,
                                                         .stride = stride,
                                                         .padding = padding});
        n.inputs[0]->accumulate(std::move(dx));
      });
}

// adaptive_avg_pool2d on x (N, H, W, C) to (N, out.h, out.w, C), torch's cells; (1, 1) is global
// average pooling.
template <class T, Device D>
Var<T, D> adaptive_avg_pool2d(const Var<T, D>& x, kernels::Size2 out) {
  const Shape& sx = x.shape();
  if (sx.rank() != 4 || out.h < 1 || out.w < 1)
    throw ValueError(ddp::detail::str("ddp: autograd: adaptive_avg_pool2d: x ", sx,
                                      " must be NHWC and the output (", out.h, ", ", out.w,
                                      ") at least 1x1"));
  Tensor<T, D> y(Shape{sx[0], out.h, out.w, sx[3]});
  Kernels<D>::adaptive_avg_pool2d_forward(
      x.exec(), kernels::AdaptiveAvgPool2dForwardArgs<T, D>{.x = x.value().cview(), .y = y.view()});
  return detail::record<T, D>(
      "adaptive_avg_pool2d", std::move(y), {x.node_ptr()}, [](Node<T, D>& n) {
        Tensor<T, D> dx(n.inputs[0]->value.shape());
        Kernels<D>::adaptive_avg_pool2d_backward(
            n.exec,
            kernels::AdaptiveAvgPool2dBackwardArgs<T, D>{.dy = n.grad.cview(), .dx = dx.view()});
        n.inputs[0]->accumulate(std::move(dx));
      });
}

// batch_norm over the last dim of x (N, ..., C) (torch's F.batch_norm on the channels-first
// permutation): training uses the batch statistics and updates running_mean/running_var (C) in
// place (momentum, unbiased variance); eval uses them. weight (gamma) and bias (beta) are (C).
struct BatchNormOptions {
  bool training = true;
  double momentum = 0.1;
  double eps = 1e-5;
};
template <class T, Device D>
Var<T, D> batch_norm(const Var<T, D>& x, const Var<T, D>& weight, const Var<T, D>& bias,
                     Tensor<T, D>& running_mean, Tensor<T, D>& running_var,
                     BatchNormOptions o = {}) {
  const std::int64_t c = x.rank() >= 1 ? x.shape()[-1] : 0;
  auto save_mean = std::make_shared<Tensor<T, D>>(Shape{c});
  auto save_invstd = std::make_shared<Tensor<T, D>>(Shape{c});
  Tensor<T, D> y(x.shape());
  Kernels<D>::batchnorm_forward(
      x.exec(), kernels::BatchNormForwardArgs<T, D>{.x = x.value().cview(),
                                                    .gamma = weight.value().cview(),
                                                    .beta = bias.value().cview(),
                                                    .running_mean = running_mean.view(),
                                                    .running_var = running_var.view(),
                                                    .y = y.view(),
                                                    .save_mean = save_mean->view(),
                                                    .save_invstd = save_invstd->view(),
                                                    .training = o.training,
                                                    .momentum = o.momentum,
                                                    .eps = o.eps});
  const bool training = o.training;
  return detail::record<T, D>(
      "batch_norm", std::move(y), {x.node_ptr(), weight.node_ptr(), bias.node_ptr()},
      [save_mean, save_invstd, training](Node<T, D>& n) {
        auto& X = *n.inputs[0];
        auto& G = *n.inputs[1];
        auto& B = *n.inputs[2];
        Tensor<T, D> dx, dg, db;
        if (X.requires_grad) dx = Tensor<T, D>(X.value.shape());
        if (G.requires_grad) dg = Tensor<T, D>(G.value.shape());
        if (B.requires_grad) db = Tensor<T, D>(B.value.shape());
        Kernels<D>::batchnorm_backward(
            n.exec, kernels::BatchNormBackwardArgs<T, D>{.x = X.value.cview(),
                                                         .dy = n.grad.cview(),
                                                         .gamma = G.value.cview(),
                                                         .save_mean = save_mean->cview(),
                                                         .save_invstd = save_invstd->cview(),
                                                         .dx = dx.view(),
                                                         .dgamma = dg.view(),
                                                         .dbeta = db.view(),
                                                         .training = training});
        if (X.requires_grad) X.accumulate(std::move(dx));
        if (G.requires_grad) G.accumulate(std::move(dg));
        if (B.requires_grad) B.accumulate(std::move(db));
      });
}

}  // namespace ddp::autograd
