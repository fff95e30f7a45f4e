// Kernels<Cpu>: every op on the CPU, each member forwarding to the op's own file in kernels/cpu/.
// SPDX-License-Identifier: MIT
//
// Kernels<Cuda> (kernels/cuda/kernels.cuh) lists the same members with the same signatures, in the
// same order; the element-wise ones (relu_forward/backward, add, axpy, scale, fill) are written
// once in ElementwiseKernels (kernels/kernels.hpp) and run through for_each_index below. All
// members are blocking: on return the outputs are written. They throw ValueError for bad shapes
// (see args.hpp). Thread-safety: concurrent calls with disjoint outputs are safe; calls sharing one
// Exec's pool are serialised by the pool.
#pragma once

#include <cstddef>
#include <type_traits>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/bf16_storage.hpp"
#include "ddp/kernels/cpu/attention.hpp"
#include "ddp/kernels/cpu/batchnorm.hpp"
#include "ddp/kernels/cpu/bn_act.hpp"
#include "ddp/kernels/cpu/conv2d.hpp"
#include "ddp/kernels/cpu/embedding.hpp"
#include "ddp/kernels/cpu/gelu.hpp"
#include "ddp/kernels/cpu/gemm.hpp"
#include "ddp/kernels/cpu/layer_norm.hpp"
#include "ddp/kernels/cpu/linear.hpp"
#include "ddp/kernels/cpu/loss.hpp"
#include "ddp/kernels/cpu/multi_adamw.hpp"
#include "ddp/kernels/cpu/multi_norm.hpp"
#include "ddp/kernels/cpu/multi_sgd.hpp"
#include "ddp/kernels/cpu/pool.hpp"
#include "ddp/kernels/cpu/sgd.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/dropout_args.hpp"
#include "ddp/kernels/embedding_args.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/kernels/layer_norm_args.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

template <>
struct Kernels<Cpu> : ElementwiseKernels<Cpu> {
  using D = Cpu;

  // f(i) for i in [0, n), spread over the pool in contiguous chunks (f must be order-independent).
  template <class F>
  static void for_each_index(const Exec<Cpu>& e, std::size_t n, F f) {
    cpu::for_each_index(e, n, f);
  }

  // GELU: the exact form in float runs cpu/gelu.hpp's vectorised loops, everything else the
  // functors.
  template <class T>
  static void gelu_forward(const Exec<Cpu>& e, TensorView<const T, D> x, TensorView<T, D> y,
                           bool tanh_form) {
    if constexpr (std::is_same_v<T, float>) {
      if (!tanh_form) {
        expect_shape(y, x.shape(), "output y", "gelu_forward");
        return cpu::gelu_exact_forward(e, x.data(), y.data(), static_cast<std::size_t>(x.numel()));
      }
    }
    ElementwiseKernels<Cpu>::gelu_forward(e, x, y, tanh_form);
  }
  template <class T>
  static void gelu_backward(const Exec<Cpu>& e, TensorView<const T, D> x, TensorView<const T, D> dy,
                            TensorView<T, D> dx, bool tanh_form) {
    if constexpr (std::is_same_v<T, float>) {
      if (!tanh_form) {
        expect_shape(dy, x.shape(), "output gradient dy", "gelu_backward");
        expect_shape(dx, x.shape(), "input gradient dx", "gelu_backward");
        return cpu::gelu_exact_backward(e, x.data(), dy.data(), dx.data(),
                                        static_cast<std::size_t>(x.numel()));
      }
    }
    ElementwiseKernels<Cpu>::gelu_backward(e, x, dy, dx, tanh_form);
  }

  // ---- layers (bf16 activations, A = bfloat16: kernels/bf16_storage.hpp) ----
  template <class T, class A>
  static void conv2d_forward(const Exec<Cpu>& e, const Conv2dForwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>)
      Bf16Storage<D>::conv2d_forward(e, a);
    else
      cpu::conv2d_forward(e, a);
  }
  template <class T, class A>
  static void conv2d_backward(const Exec<Cpu>& e, const Conv2dBackwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>)
      Bf16Storage<D>::conv2d_backward(e, a);
    else
      cpu::conv2d_backward(e, a);
  }
  template <class T, class A>
  static void batchnorm_forward(const Exec<Cpu>& e, const BatchNormForwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>)
      Bf16Storage<D>::batchnorm_forward(e, a);
    else
      cpu::batchnorm_forward(e, a);
  }
  template <class T, class A>
  static void batchnorm_backward(const Exec<Cpu>& e, const BatchNormBackwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>)
      Bf16Storage<D>::batchnorm_backward(e, a);
    else
      cpu::batchnorm_backward(e, a);
  }
  // relu(bn(x) + residual), and its backward with the ReLU mask (bn_act.hpp: the unfused passes in
  // a row).
  template <class T, class A>
  static void batchnorm_act_forward(const Exec<Cpu>& e, const BatchNormActForwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>)
      Bf16Storage<D>::batchnorm_act_forward(e, a);
    else
      cpu::batchnorm_act_forward(e, a);
  }
  template <class T, class A>
  static void batchnorm_act_backward(const Exec<Cpu>& e,
                                     const BatchNormActBackwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>)
      Bf16Storage<D>::batchnorm_act_backward(e, a);
    else
      cpu::batchnorm_act_backward(e, a);
  }
  template <class T>
  static void max_pool2d_forward(const Exec<Cpu>& e, const MaxPool2dForwardArgs<T, D>& a) {
    if constexpr (std::is_same_v<T, bfloat16>)
      Bf16Storage<D>::max_pool2d_forward(e, a);
    else
      cpu::max_pool2d_forward(e, a);
  }
  template <class T>
  static void max_pool2d_backward(const Exec<Cpu>& e, const MaxPool2dBackwardArgs<T, D>& a) {
    if constexpr (std::is_same_v<T, bfloat16>)
      Bf16Storage<D>::max_pool2d_backward(e, a);
    else
      cpu::max_pool2d_backward(e, a);
  }
  template <class T>
  static void adaptive_avg_pool2d_forward(const Exec<Cpu>& e,
                                          const AdaptiveAvgPool2dForwardArgs<T, D>& a) {
    if constexpr (std::is_same_v<T, bfloat16>)
      Bf16Storage<D>::adaptive_avg_pool2d_forward(e, a);
    else
      cpu::adaptive_avg_pool2d_forward(e, a);
  }
  template <class T>
  static void adaptive_avg_pool2d_backward(const Exec<Cpu>& e,
                                           const AdaptiveAvgPool2dBackwardArgs<T, D>& a) {
    if constexpr (std::is_same_v<T, bfloat16>)
      Bf16Storage<D>::adaptive_avg_pool2d_backward(e, a);
    else
      cpu::adaptive_avg_pool2d_backward(e, a);
  }
  template <class T, class A>
  static void linear_forward(const Exec<Cpu>& e, const LinearForwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>)
      Bf16Storage<D>::linear_forward(e, a);
    else
      cpu::linear_forward(e, a);
  }
  template <class T, class A>
  static void linear_backward(const Exec<Cpu>& e, const LinearBackwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>)
      Bf16Storage<D>::linear_backward(e, a);
    else
      cpu::linear_backward(e, a);
  }

  // ---- causal self-attention on the packed qkv (B, T, 3C) (kernels/cpu/attention.hpp; CUDA:
  //   kernels/cuda/attention.cuh)
  template <class T>
  static void attention_forward(const Exec<Cpu>& e, const AttentionForwardArgs<T, D>& a) {
    cpu::attention_forward(e, a);
  }
  template <class T>
  static void attention_backward(const Exec<Cpu>& e, const AttentionBackwardArgs<T, D>& a) {
    cpu::attention_backward(e, a);
  }

  // ---- transformer layers (issue 19; CUDA: kernels/cuda/layer_norm.cuh, embedding.cuh) ----
  template <class T>
  static void layer_norm_forward(const Exec<Cpu>& e, const LayerNormForwardArgs<T, D>& a) {
    cpu::layer_norm_forward(e, a);
  }
  template <class T>
  static void layer_norm_backward(const Exec<Cpu>& e, const LayerNormBackwardArgs<T, D>& a) {
    cpu::layer_norm_backward(e, a);
  }
  template <class T>
  static void embedding_forward(const Exec<Cpu>& e, const EmbeddingForwardArgs<T, D>& a) {
    cpu::embedding_forward(e, a);
  }
  template <class T>
  static void embedding_backward(const Exec<Cpu>& e, const EmbeddingBackwardArgs<T, D>& a) {
    cpu::embedding_backward(e, a);
  }

  // ---- losses (return the mean loss; write the gradient when requested) ----
  template <class T>
  static double cross_entropy(const Exec<Cpu>& e, const CrossEntropyArgs<T, D>& a) {
    if constexpr (std::is_same_v<T, bfloat16>)
      return Bf16Storage<D>::cross_entropy(e, a);
    else
      return cpu::cross_entropy(e, a);
  }
  template <class T>
  static double mse(const Exec<Cpu>& e, const MseArgs<T, D>& a) {
    return cpu::mse(e, a);
  }

  // ---- optimiser ----
  template <class T>
  static void sgd_step(const Exec<Cpu>& e, const SgdArgs<T, D>& a) {
    cpu::sgd_step(e, a);
  }
  // Every tensor's step in one call (tensor after tensor; the same bits as one sgd_step per
  // tensor).
  template <class T>
  static void sgd_step_multi(const Exec<Cpu>& e, const MultiSgdArgs<T, D>& a) {
    cpu::sgd_step_multi(e, a);
  }
  // AdamW over every tensor in one call (tensor after tensor).
  template <class T>
  static void adamw_step_multi(const Exec<Cpu>& e, const MultiAdamwArgs<T, D>& a) {
    cpu::adamw_step_multi(e, a);
  }
  // Sum of squares over many tensors in double (chunk partials added in a fixed order), and x *=
  // alpha.
  template <class T>
  static double sum_squares_multi(const Exec<Cpu>& e, const MultiTensorArgs<T, D>& a) {
    return cpu::sum_squares_multi(e, a);
  }
  template <class T>
  static void scale_multi(const Exec<Cpu>& e, const MultiScaleArgs<T, D>& a) {
    cpu::scale_multi(e, a);
  }
};
static_assert(KernelsApi<Kernels<Cpu>, Cpu>,
              "ddp: Kernels<Cpu> lacks a member of KernelsApi (kernels/kernels.hpp)");

}  // namespace ddp::kernels
