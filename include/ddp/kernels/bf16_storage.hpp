// The layers' kernels on bf16 activations (A = bfloat16, parameters float), written once for both
// devices.
// SPDX-License-Identifier: MIT
//
// Each op widens its bf16 inputs to float (exact), runs the device's float kernel through
// Kernels<D>, and rounds its activation outputs to bf16 (nearest even): every stored activation and
// activation gradient is bf16, arithmetic is fp32 (docs/decisions/0070). The GEMM-shaped ops
// (conv2d, linear) round their weight operand to bf16 first, as bf16 tensor cores read it; bias,
// weight and bias gradients, and BatchNorm's parameters, statistics and gradients stay float. So
// the CPU instance is the host model of the GPU's, rounding for rounding. Cost: a float copy of
// each operand for the length of one op (what is kept between forward and backward is bf16).
// Kernels<Cpu> sends its members' bf16 calls here, Kernels<Cuda> those without a native bf16 kernel
// (docs/decisions/ 0072; this stays their reference); the name Kernels<D> is looked up when a
// member is instantiated, as for ElementwiseKernels.
#pragma once

#include <cstddef>

#include "ddp/core/dtype.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

template <Device D>
struct Bf16Storage {
  using F = Tensor<float, D>;
  template <class T>
  using Const = TensorView<const T, D>;

  // x as float (exact); an absent (empty) view gives an empty tensor.
  static F widen(const Exec<D>& e, Const<bfloat16> x) {
    if (x.empty()) return {};
    F out(x.shape());
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(x.numel()),
                               Bf16Widen{.x = x.data(), .y = out.data()});
    return out;
  }
  // y = bf16(x), when y is wanted.
  static void narrow(const Exec<D>& e, const F& x, TensorView<bfloat16, D> y) {
    if (y.empty()) return;
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(x.numel()),
                               Bf16Narrow{.x = x.data(), .y = y.data()});
  }
  // w as a bf16 GEMM operand reads it.
  static F operand(const Exec<D>& e, Const<float> w) {
    F out(w.shape());
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(w.numel()),
                               Bf16RoundOperand{.x = w.data(), .y = out.data()});
    return out;
  }
  // The float stand-in of a wanted output (holding its values when the op adds into it), or an
  // empty tensor.
  static F output(const Exec<D>& e, TensorView<bfloat16, D> out, bool keep_values = false) {
    if (out.empty()) return {};
    return keep_values ? widen(e, Const<bfloat16>(out)) : F(out.shape());
  }
  static TensorView<float, D> view(F& t) { return t.empty() ? TensorView<float, D>() : t.view(); }
  static Const<float> cview(const F& t) { return t.empty() ? Const<float>() : t.cview(); }

  // ---- conv2d and linear ----
  static void conv2d_forward(const Exec<D>& e, const Conv2dForwardArgs<float, D, bfloat16>& a) {
    validate(a);
    const F x = widen(e, a.x), w = operand(e, a.w);
    F y(a.y.shape());
    Kernels<D>::conv2d_forward(e, Conv2dForwardArgs<float, D>{.x = x.cview(),
                                                              .w = w.cview(),
                                                              .bias = a.bias,
                                                              .y = y.view(),
                                                              .stride = a.stride,
                                                              .padding = a.padding,
                                                              .dilation = a.dilation});
    narrow(e, y, a.y);
  }
  static void conv2d_backward(const Exec<D>& e, const Conv2dBackwardArgs<float, D, bfloat16>& a) {
    validate(a);
    const F x = widen(e, a.x), w = operand(e, a.w), dy = widen(e, a.dy);
    // the skip gradient it adds to, in float: one rounding after the add
    F dx = output(e, a.dx, a.accumulate_dx);
    Kernels<D>::conv2d_backward(e, Conv2dBackwardArgs<float, D>{.x = x.cview(),
                                                                .w = w.cview(),
                                                                .dy = dy.cview(),
                                                                .dx = view(dx),
                                                                .dw = a.dw,
                                                                .dbias = a.dbias,
                                                                .stride = a.stride,
                                                                .padding = a.padding,
                                                                .dilation = a.dilation,
                                                                .accumulate_dx = a.accumulate_dx});
    narrow(e, dx, a.dx);
  }
  static void linear_forward(const Exec<D>& e, const LinearForwardArgs<float, D, bfloat16>& a) {
    validate(a);
    const F x = widen(e, a.x), w = operand(e, a.w);
    F y(a.y.shape());
    Kernels<D>::linear_forward(
        e,
        LinearForwardArgs<float, D>{.x = x.cview(), .w = w.cview(), .bias = a.bias, .y = y.view()});
    narrow(e, y, a.y);
  }
  static void linear_backward(const Exec<D>& e, const LinearBackwardArgs<float, D, bfloat16>& a) {
    validate(a);
    const F x = widen(e, a.x), w = operand(e, a.w), dy = widen(e, a.dy);
    F dx = output(e, a.dx);
    Kernels<D>::linear_backward(e, LinearBackwardArgs<float, D>{.x = x.cview(),
                                                                .w = w.cview(),
                                                                .dy = dy.cview(),
                                                                .dx = view(dx),
                                                                .dw = a.dw,
                                                                .dbias = a.dbias});
    narrow(e, dx, a.dx);
  }

  // ---- BatchNorm, and BatchNorm + (residual) + ReLU: the sum and the ReLU in float, one rounding
  //   at the store
  static BatchNormForwardArgs<float, D> as_float(const BatchNormForwardArgs<float, D, bfloat16>& a,
                                                 const F& x, F& y) {
    return {.x = x.cview(),
            .gamma = a.gamma,
            .beta = a.beta,
            .running_mean = a.running_mean,
            .running_var = a.running_var,
            .y = y.view(),
            .save_mean = a.save_mean,
            .save_invstd = a.save_invstd,
            .training = a.training,
            .momentum = a.momentum,
            .eps = a.eps,
            .sync = a.sync,
            .num_batches_tracked = a.num_batches_tracked};
  }
  static BatchNormBackwardArgs<float, D> as_float(
      const BatchNormBackwardArgs<float, D, bfloat16>& a, const F& x, const F& dy, F& dx) {
    return {.x = x.cview(),
            .dy = dy.cview(),
            .gamma = a.gamma,
            .save_mean = a.save_mean,
            .save_invstd = a.save_invstd,
            .dx = view(dx),
            .dgamma = a.dgamma,
            .dbeta = a.dbeta,
            .training = a.training,
            .sync = a.sync};
  }
  static void batchnorm_forward(const Exec<D>& e,
                                const BatchNormForwardArgs<float, D, bfloat16>& a) {
    validate(a);
    const F x = widen(e, a.x);
    F y(a.y.shape());
    Kernels<D>::batchnorm_forward(e, as_float(a, x, y));
    narrow(e, y, a.y);
  }
  static void batchnorm_backward(const Exec<D>& e,
                                 const BatchNormBackwardArgs<float, D, bfloat16>& a) {
    validate(a);
    const F x = widen(e, a.x), dy = widen(e, a.dy);
    F dx = output(e, a.dx);
    Kernels<D>::batchnorm_backward(e, as_float(a, x, dy, dx));
    narrow(e, dx, a.dx);
  }
  static void batchnorm_act_forward(const Exec<D>& e,
                                    const BatchNormActForwardArgs<float, D, bfloat16>& a) {
    validate(a);
    const F x = widen(e, a.bn.x), residual = widen(e, a.residual);
    F y(a.bn.y.shape());
    Kernels<D>::batchnorm_act_forward(
        e, BatchNormActForwardArgs<float, D>{
               .bn = as_float(a.bn, x, y), .residual = cview(residual), .relu = a.relu});
    narrow(e, y, a.bn.y);
  }
  static void batchnorm_act_backward(const Exec<D>& e,
                                     const BatchNormActBackwardArgs<float, D, bfloat16>& a) {
    validate(a);
    const F x = widen(e, a.bn.x), dy = widen(e, a.bn.dy), y = widen(e, a.y);
    F dx = output(e, a.bn.dx), dresidual = output(e, a.dresidual);
    Kernels<D>::batchnorm_act_backward(
        e, BatchNormActBackwardArgs<float, D>{.bn = as_float(a.bn, x, dy, dx),
                                              .y = cview(y),
                                              .dresidual = view(dresidual),
                                              .relu = a.relu});
    narrow(e, dx, a.bn.dx);
    narrow(e, dresidual, a.dresidual);
  }

  // ---- pooling (max is exact in bf16; overlapping windows' gradients add in float, then round)
  static void max_pool2d_forward(const Exec<D>& e, const MaxPool2dForwardArgs<bfloat16, D>& a) {
    validate(a);
    const F x = widen(e, a.x);
    F y(a.y.shape());
    Kernels<D>::max_pool2d_forward(e, MaxPool2dForwardArgs<float, D>{.x = x.cview(),
                                                                     .y = y.view(),
                                                                     .argmax = a.argmax,
                                                                     .kernel = a.kernel,
                                                                     .stride = a.stride,
                                                                     .padding = a.padding});
    narrow(e, y, a.y);
  }
  static void max_pool2d_backward(const Exec<D>& e, const MaxPool2dBackwardArgs<bfloat16, D>& a) {
    validate(a);
    const F dy = widen(e, a.dy);
    F dx(a.dx.shape());
    Kernels<D>::max_pool2d_backward(e, MaxPool2dBackwardArgs<float, D>{.dy = dy.cview(),
                                                                       .argmax = a.argmax,
                                                                       .dx = dx.view(),
                                                                       .kernel = a.kernel,
                                                                       .stride = a.stride,
                                                                       .padding = a.padding});
    narrow(e, dx, a.dx);
  }
  static void adaptive_avg_pool2d_forward(const Exec<D>& e,
                                          const AdaptiveAvgPool2dForwardArgs<bfloat16, D>& a) {
    validate(a);
    const F x = widen(e, a.x);
    F y(a.y.shape());
    Kernels<D>::adaptive_avg_pool2d_forward(
        e, AdaptiveAvgPool2dForwardArgs<float, D>{.x = x.cview(), .y = y.view()});
    narrow(e, y, a.y);
  }
  static void adaptive_avg_pool2d_backward(const Exec<D>& e,
                                           const AdaptiveAvgPool2dBackwardArgs<bfloat16, D>& a) {
    validate(a);
    const F dy = widen(e, a.dy);
    F dx(a.dx.shape());
    Kernels<D>::adaptive_avg_pool2d_backward(
        e, AdaptiveAvgPool2dBackwardArgs<float, D>{.dy = dy.cview(), .dx = dx.view()});
    narrow(e, dx, a.dx);
  }

  // ---- cross-entropy on bf16 logits: softmax and loss in float (the CPU sums in double), dlogits
  //   rounded
  static double cross_entropy(const Exec<D>& e, const CrossEntropyArgs<bfloat16, D>& a) {
    validate(a);
    const F logits = widen(e, a.logits);
    F dlogits = output(e, a.dlogits);
    const double loss = Kernels<D>::cross_entropy(
        e, CrossEntropyArgs<float, D>{.logits = logits.cview(),
                                      .labels = a.labels,
                                      .dlogits = view(dlogits),
                                      .label_smoothing = a.label_smoothing});
    narrow(e, dlogits, a.dlogits);
    return loss;
  }
};

}  // namespace ddp::kernels
