// Kernels<D>: the one trait through which modules call every op on device D (primary template),
// and the element-wise members both specialisations inherit.
// SPDX-License-Identifier: MIT
//
// Kernels<Cpu> (kernels/cpu/kernels.hpp) and Kernels<Cuda> (kernels/cuda/kernels.cuh, nvcc only)
// have the same static members with the same Args structs, so a module is written once:
// `Kernels<D>::conv2d_forward(exec_, Conv2dForwardArgs<T, D>{...})`. Kernels<D> is the only place
// that knows the device; KernelsApi below is the member list both must have. Using a device whose
// specialisation was not included stops at the static_assert below, which says what to do.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "ddp/config.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/attention_args.hpp"
#include "ddp/kernels/dropout_args.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/embedding_args.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/layer_norm_args.hpp"
#include "ddp/kernels/unary_ops.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

template <Device D>
struct Kernels {
  static_assert(ddp::detail::dependent_false<D>,
                "ddp: Kernels<Cuda> is defined in <ddp/kernels/cuda/kernels.cuh>, which only nvcc "
                "compiles: put this code in a .cu file, include <ddp/ddp.hpp> (or that header) and "
                "link ddp::cuda. For CPU code include <ddp/kernels/cpu/kernels.hpp> and use "
                "Kernels<Cpu>.");
};

// The element-wise members both specialisations inherit: each checks shapes and runs an
// elementwise.hpp functor via Kernels<D>::for_each_index (complete once a member is instantiated).
template <Device D>
struct ElementwiseKernels {
  // y = max(x, 0) (y may alias x).
  template <class T>
  static void relu_forward(const Exec<D>& e, TensorView<const T, D> x, TensorView<T, D> y) {
    expect_shape(y, x.shape(), "output y", "relu_forward");
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(x.numel()),
                               ReluForward<T>{.x = x.data(), .y = y.data()});
  }
  // dx = dy where the forward output y > 0 (dx may alias dy).
  template <class T>
  static void relu_backward(const Exec<D>& e, TensorView<const T, D> y, TensorView<const T, D> dy,
                            TensorView<T, D> dx) {
    expect_shape(dy, y.shape(), "output gradient dy", "relu_backward");
    expect_shape(dx, y.shape(), "input gradient dx", "relu_backward");
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(y.numel()),
                               ReluBackward<T>{.y = y.data(), .dy = dy.data(), .dx = dx.data()});
  }
  // out = a + b (the residual add; out may alias a or b).
  template <class T>
  static void add(const Exec<D>& e, TensorView<const T, D> a, TensorView<const T, D> b,
                  TensorView<T, D> out) {
    expect_shape(b, a.shape(), "second operand", "add");
    expect_shape(out, a.shape(), "output", "add");
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(a.numel()),
                               Add<T>{.a = a.data(), .b = b.data(), .out = out.data()});
  }
  // y += alpha * x.
  template <class T>
  static void axpy(const Exec<D>& e, T alpha, TensorView<const T, D> x, TensorView<T, D> y) {
    expect_shape(y, x.shape(), "y", "axpy");
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(x.numel()),
                               Axpy<T>{.alpha = alpha, .x = x.data(), .y = y.data()});
  }
  // x *= alpha.
  template <class T>
  static void scale(const Exec<D>& e, T alpha, TensorView<T, D> x) {
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(x.numel()),
                               Scale<T>{.alpha = alpha, .x = x.data()});
  }
  // x = value (any element type: parameters, BN's int64 step counter).
  template <class T>
  static void fill(const Exec<D>& e, TensorView<T, D> x, T value) {
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(x.numel()),
                               Fill<T>{.value = value, .x = x.data()});
  }

  // ---- transformer element-wise ops ----
  // y = gelu(x), exact (erf) or tanh form (y may alias x); dx = dy * gelu'(x) (dx may alias dy).
  template <class T>
  static void gelu_forward(const Exec<D>& e, TensorView<const T, D> x, TensorView<T, D> y,
                           bool tanh_form) {
    expect_shape(y, x.shape(), "output y", "gelu_forward");
    Kernels<D>::for_each_index(
        e, static_cast<std::size_t>(x.numel()),
        GeluForward<T>{.x = x.data(), .y = y.data(), .tanh_form = tanh_form});
  }
  template <class T>
  static void gelu_backward(const Exec<D>& e, TensorView<const T, D> x, TensorView<const T, D> dy,
                            TensorView<T, D> dx, bool tanh_form) {
    expect_shape(dy, x.shape(), "output gradient dy", "gelu_backward");
    expect_shape(dx, x.shape(), "input gradient dx", "gelu_backward");
    Kernels<D>::for_each_index(
        e, static_cast<std::size_t>(x.numel()),
        GeluBackward<T>{.x = x.data(), .dy = dy.data(), .dx = dx.data(), .tanh_form = tanh_form});
  }
  // Inverted dropout with a counter-based mask (kernels/dropout_args.hpp), and its backward.
  template <class T>
  static void dropout_forward(const Exec<D>& e, const DropoutForwardArgs<T, D>& a) {
    validate(a);
    const auto n = static_cast<std::size_t>(a.x.numel());
    Kernels<D>::for_each_index(
        e, (n + 3) / 4,
        DropoutForward<T>{.x = a.x.data(),
                          .y = a.y.data(),
                          .mask = a.mask.data(),
                          .n = n,
                          .scale = dropout_scale<T>(a.p),
                          .draw = dropout_mask(a.p, a.seed, a.rank, a.stream, a.step)});
  }
  template <class T>
  static void dropout_backward(const Exec<D>& e, const DropoutBackwardArgs<T, D>& a) {
    validate(a);
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(a.dy.numel()),
                               DropoutBackward<T>{.dy = a.dy.data(),
                                                  .mask = a.mask.data(),
                                                  .dx = a.dx.data(),
                                                  .scale = dropout_scale<T>(a.p)});
  }

  // ---- unary ops of kernels/unary_ops.hpp (activations, autograd's exp, log, ...) ----
  // y = f(x) (y may alias x).
  template <class T, class F>
  static void unary_forward(const Exec<D>& e, TensorView<const T, D> x, TensorView<T, D> y, F f) {
    expect_shape(y, x.shape(), "output y", op_name<F>());
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(x.numel()),
                               UnaryMap<T, F>{.x = x.data(), .y = y.data(), .f = f});
  }
  // dx = dy * f.grad(x, y) from the forward input x and output y; the one f does not read
  // (reads_of<F>()) may be an empty view. dx may alias dy.
  template <class T, class F>
  static void unary_backward(const Exec<D>& e, TensorView<const T, D> x, TensorView<const T, D> y,
                             TensorView<const T, D> dy, TensorView<T, D> dx, F f) {
    constexpr Reads reads = reads_of<F>();
    if constexpr (reads != Reads::Output)
      expect_shape(x, dy.shape(), "forward input x", op_name<F>());
    if constexpr (reads != Reads::Input)
      expect_shape(y, dy.shape(), "forward output y", op_name<F>());
    expect_shape(dx, dy.shape(), "input gradient dx", op_name<F>());
    Kernels<D>::for_each_index(e, static_cast<std::size_t>(dy.numel()),
                               UnaryGrad<T, F>{.x = reads == Reads::Output ? nullptr : x.data(),
                                               .y = reads == Reads::Input ? nullptr : y.data(),
                                               .dy = dy.data(),
                                               .dx = dx.data(),
                                               .f = f});
  }
  // (N, H, W, C) -> (N, C, H, W) when !to_nhwc, else (N, C, H, W) -> (N, H, W, C); not in place.
  template <class T>
  static void permute_nhwc_nchw(const Exec<D>& e, TensorView<const T, D> x, TensorView<T, D> y,
                                bool to_nhwc) {
    if (x.rank() != 4)
      throw ValueError(ddp::detail::str(
          "ddp: permute_nhwc_nchw: input must have rank 4, got shape ", x.shape()));
    const std::int64_t n = x.dim(0), h = to_nhwc ? x.dim(2) : x.dim(1),
                       w = to_nhwc ? x.dim(3) : x.dim(2), c = to_nhwc ? x.dim(1) : x.dim(3);
    expect_shape(y, to_nhwc ? Shape{n, h, w, c} : Shape{n, c, h, w}, "output y",
                 "permute_nhwc_nchw");
    Kernels<D>::for_each_index(
        e, static_cast<std::size_t>(x.numel()),
        PermuteNhwcNchw<T>{
            .x = x.data(), .y = y.data(), .h = h, .w = w, .c = c, .to_nhwc = to_nhwc});
  }
};

// The members every Kernels<D> has, as calls (T = float); both specialisations static_assert it,
// so a member added to only one fails to compile.
template <class K, class D>
concept KernelsApi = requires(
    const Exec<D>& e, std::size_t n, TensorView<const float, D> cx, TensorView<float, D> x,
    const Conv2dForwardArgs<float, D>& conv_f, const Conv2dBackwardArgs<float, D>& conv_b,
    const BatchNormForwardArgs<float, D>& bn_f, const BatchNormBackwardArgs<float, D>& bn_b,
    const BatchNormActForwardArgs<float, D>& bn_act_f,
    const BatchNormActBackwardArgs<float, D>& bn_act_b, const MaxPool2dForwardArgs<float, D>& max_f,
    const MaxPool2dBackwardArgs<float, D>& max_b,
    const AdaptiveAvgPool2dForwardArgs<float, D>& avg_f,
    const AdaptiveAvgPool2dBackwardArgs<float, D>& avg_b, const LinearForwardArgs<float, D>& lin_f,
    const LinearBackwardArgs<float, D>& lin_b, const AttentionForwardArgs<float, D>& att_f,
    const AttentionBackwardArgs<float, D>& att_b, const LayerNormForwardArgs<float, D>& ln_f,
    const LayerNormBackwardArgs<float, D>& ln_b, const EmbeddingForwardArgs<float, D>& emb_f,
    const EmbeddingBackwardArgs<float, D>& emb_b, const CrossEntropyArgs<float, D>& ce,
    const MseArgs<float, D>& mse, const SgdArgs<float, D>& sgd,
    const MultiSgdArgs<float, D>& sgd_multi, const MultiAdamwArgs<float, D>& adamw_multi,
    const MultiTensorArgs<float, D>& tensors, const MultiScaleArgs<float, D>& scale_multi) {
  K::for_each_index(e, n, Fill<float>{});
  K::relu_forward(e, cx, x);
  K::relu_backward(e, cx, cx, x);
  K::add(e, cx, cx, x);
  K::axpy(e, 1.0f, cx, x);
  K::scale(e, 1.0f, x);
  K::fill(e, x, 1.0f);
  K::conv2d_forward(e, conv_f);
  K::conv2d_backward(e, conv_b);
  K::batchnorm_forward(e, bn_f);
  K::batchnorm_backward(e, bn_b);
  K::batchnorm_act_forward(e, bn_act_f);
  K::batchnorm_act_backward(e, bn_act_b);
  K::max_pool2d_forward(e, max_f);
  K::max_pool2d_backward(e, max_b);
  K::adaptive_avg_pool2d_forward(e, avg_f);
  K::adaptive_avg_pool2d_backward(e, avg_b);
  K::linear_forward(e, lin_f);
  K::linear_backward(e, lin_b);
  K::attention_forward(e, att_f);
  K::attention_backward(e, att_b);
  K::layer_norm_forward(e, ln_f);
  K::layer_norm_backward(e, ln_b);
  K::embedding_forward(e, emb_f);
  K::embedding_backward(e, emb_b);
  { K::cross_entropy(e, ce) } -> std::same_as<double>;
  { K::mse(e, mse) } -> std::same_as<double>;
  K::sgd_step(e, sgd);
  K::sgd_step_multi(e, sgd_multi);
  K::adamw_step_multi(e, adamw_multi);
  { K::sum_squares_multi(e, tensors) } -> std::same_as<double>;
  K::scale_multi(e, scale_multi);
};

}  // namespace ddp::kernels

namespace ddp {
using kernels::Kernels;
}
