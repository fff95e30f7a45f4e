// Kernels<Cuda>: every op on the GPU, each member forwarding to the op's own file in kernels/cuda/.
// SPDX-License-Identifier: MIT
//
// The same members and signatures as Kernels<Cpu>, in the same order, so a module written against
// Kernels<D> runs on either device; the element-wise ones come from ElementwiseKernels through
// for_each_index. The fused and multi-tensor ops (batchnorm_act_*, *_multi) are one pass / one
// launch here; their CPU versions are the references. Convolutions and Linear compute at
// exec.precision (Fp32 SIMT, Tf32 or Bf16 tensor cores).
// Contract: members validate their Args on the host (the CPU's ValueError words), enqueue work on
// exec.stream and return without waiting, except the losses and sum_squares_multi (they return a
// value) and embedding_forward/backward (to report a token id out of range). Workspaces come from
// Allocator<Cuda>, released in stream order. Concurrent calls on different streams are safe; one
// stream's calls are ordered. Compiled only by nvcc (a .cu file linked with ddp::cuda).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/attention_args.hpp"
#include "ddp/kernels/bf16_storage.hpp"
#include "ddp/kernels/cuda/attention.cuh"
#include "ddp/kernels/cuda/batchnorm.cuh"
#include "ddp/kernels/cuda/bn_act.cuh"
#include "ddp/kernels/cuda/conv2d.cuh"
#include "ddp/kernels/cuda/embedding.cuh"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/cuda/layer_norm.cuh"
#include "ddp/kernels/cuda/linear.cuh"
#include "ddp/kernels/cuda/loss.cuh"
#include "ddp/kernels/cuda/multi_adamw.cuh"
#include "ddp/kernels/cuda/multi_norm.cuh"
#include "ddp/kernels/cuda/multi_sgd.cuh"
#include "ddp/kernels/cuda/op_profile.cuh"
#include "ddp/kernels/cuda/pool.cuh"
#include "ddp/kernels/cuda/sgd.cuh"
#include "ddp/kernels/dropout_args.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/embedding_args.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/kernels/layer_norm_args.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/copy.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

template <>
struct Kernels<Cuda> : ElementwiseKernels<Cuda> {
  using D = Cuda;

  // f(i) for i in [0, n), a grid-stride loop; f must be order-independent and device-callable.
  template <class F>
  static void for_each_index(const Exec<Cuda>& e, std::size_t n, F f) {
    cuda::for_each_index(e, n, f);
  }

  // The element-wise members a ResNet step calls, each in an op-class scope (op_profile.cuh) around
  // the shared version; the others (GELU, dropout, ...) are counted as unscoped time.
  using Base = ElementwiseKernels<Cuda>;
  template <class T>
  static void relu_forward(const Exec<Cuda>& e, TensorView<const T, D> x, TensorView<T, D> y) {
    const cuda::OpScope scope(e, "relu", "forward");
    Base::relu_forward(e, x, y);
  }
  template <class T>
  static void relu_backward(const Exec<Cuda>& e, TensorView<const T, D> y,
                            TensorView<const T, D> dy, TensorView<T, D> dx) {
    const cuda::OpScope scope(e, "relu", "backward");
    Base::relu_backward(e, y, dy, dx);
  }
  template <class T>
  static void add(const Exec<Cuda>& e, TensorView<const T, D> a, TensorView<const T, D> b,
                  TensorView<T, D> out) {
    const cuda::OpScope scope(e, "add");
    Base::add(e, a, b, out);
  }
  template <class T>
  static void axpy(const Exec<Cuda>& e, T alpha, TensorView<const T, D> x, TensorView<T, D> y) {
    const cuda::OpScope scope(e, "axpy");
    Base::axpy(e, alpha, x, y);
  }
  template <class T>
  static void scale(const Exec<Cuda>& e, T alpha, TensorView<T, D> x) {
    const cuda::OpScope scope(e, "scale");
    Base::scale(e, alpha, x);
  }
  template <class T>
  static void fill(const Exec<Cuda>& e, TensorView<T, D> x, T value) {
    const cuda::OpScope scope(e, "fill");
    Base::fill(e, x, value);
  }

  // ---- layers. bf16 activations (A = bfloat16, docs/decisions/0072): convs on cuBLAS or cuDNN,
  // BatchNorm (+ReLU, +residual) and pooling run natively on bf16; a conv with a bias or on ddp's
  // own kernels, linear and cross-entropy widen, run the float kernel and round. ----
  template <class T, class A>
  static void conv2d_forward(const Exec<Cuda>& e, const Conv2dForwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>) {
      if (cuda::conv2d_bf16_native(e, a)) {
        const cuda::OpScope scope(e, "conv");
        cuda::conv2d_forward(e, a);
      } else {
        Bf16Storage<D>::conv2d_forward(e, a);
      }
    } else {
      const cuda::OpScope scope(e, "conv");
      cuda::conv2d_forward(e, a);
    }
  }
  template <class T, class A>
  static void conv2d_backward(const Exec<Cuda>& e, const Conv2dBackwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>) {
      if (cuda::conv2d_bf16_native(e, a)) {
        const cuda::OpScope scope(e, "conv");
        cuda::conv2d_backward(e, a);
      } else {
        Bf16Storage<D>::conv2d_backward(e, a);
      }
    } else {
      const cuda::OpScope scope(e, "conv");
      cuda::conv2d_backward(e, a);
    }
  }
  template <class T, class A>
  static void batchnorm_forward(const Exec<Cuda>& e, const BatchNormForwardArgs<T, D, A>& a) {
    const cuda::OpScope scope(e, "bn_forward", "stats");
    cuda::batchnorm_forward(e, a);
  }
  template <class T, class A>
  static void batchnorm_backward(const Exec<Cuda>& e, const BatchNormBackwardArgs<T, D, A>& a) {
    const cuda::OpScope scope(e, "bn_backward", "stats");
    cuda::batchnorm_backward(e, a);
  }
  // relu(bn(x) + residual) in one pass; its backward applies the ReLU mask inside bn's passes.
  template <class T, class A>
  static void batchnorm_act_forward(const Exec<Cuda>& e,
                                    const BatchNormActForwardArgs<T, D, A>& a) {
    const cuda::OpScope scope(e, "bn_act_forward", "stats");
    cuda::batchnorm_act_forward(e, a);
  }
  template <class T, class A>
  static void batchnorm_act_backward(const Exec<Cuda>& e,
                                     const BatchNormActBackwardArgs<T, D, A>& a) {
    const cuda::OpScope scope(e, "bn_act_backward", "stats");
    cuda::batchnorm_act_backward(e, a);
  }
  template <class T>
  static void max_pool2d_forward(const Exec<Cuda>& e, const MaxPool2dForwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "pool", "max_forward");
    cuda::max_pool2d_forward(e, a);
  }
  template <class T>
  static void max_pool2d_backward(const Exec<Cuda>& e, const MaxPool2dBackwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "pool", "max_backward");
    cuda::max_pool2d_backward(e, a);
  }
  template <class T>
  static void adaptive_avg_pool2d_forward(const Exec<Cuda>& e,
                                          const AdaptiveAvgPool2dForwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "pool", "avg_forward");
    cuda::adaptive_avg_pool2d_forward(e, a);
  }
  template <class T>
  static void adaptive_avg_pool2d_backward(const Exec<Cuda>& e,
                                           const AdaptiveAvgPool2dBackwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "pool", "avg_backward");
    cuda::adaptive_avg_pool2d_backward(e, a);
  }
  template <class T, class A>
  static void linear_forward(const Exec<Cuda>& e, const LinearForwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>) {
      Bf16Storage<D>::linear_forward(e, a);
    } else {
      const cuda::OpScope scope(e, "linear", "forward");
      cuda::linear_forward(e, a);
    }
  }
  template <class T, class A>
  static void linear_backward(const Exec<Cuda>& e, const LinearBackwardArgs<T, D, A>& a) {
    if constexpr (std::is_same_v<A, bfloat16>) {
      Bf16Storage<D>::linear_backward(e, a);
    } else {
      const cuda::OpScope scope(e, "linear", "backward");
      cuda::linear_backward(e, a);
    }
  }

  // ---- causal self-attention on the packed qkv (B, T, 3C): batched GEMMs + causal softmax ----
  template <class T>
  static void attention_forward(const Exec<Cuda>& e, const AttentionForwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "attention", "forward");
    cuda::attention_forward(e, a);
  }
  template <class T>
  static void attention_backward(const Exec<Cuda>& e, const AttentionBackwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "attention", "backward");
    cuda::attention_backward(e, a);
  }

  // ---- transformer layers ----
  template <class T>
  static void layer_norm_forward(const Exec<Cuda>& e, const LayerNormForwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "layer_norm", "forward");
    cuda::layer_norm_forward(e, a);
  }
  template <class T>
  static void layer_norm_backward(const Exec<Cuda>& e, const LayerNormBackwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "layer_norm", "backward");
    cuda::layer_norm_backward(e, a);
  }
  // Both check the token ids on the device and wait for the stream to report a bad one.
  template <class T>
  static void embedding_forward(const Exec<Cuda>& e, const EmbeddingForwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "embedding", "forward");
    cuda::embedding_forward(e, a);
  }
  template <class T>
  static void embedding_backward(const Exec<Cuda>& e, const EmbeddingBackwardArgs<T, D>& a) {
    const cuda::OpScope scope(e, "embedding", "backward");
    cuda::embedding_backward(e, a);
  }

  // ---- losses: return the mean loss (waiting for the stream); write the gradient if requested
  template <class T>
  static double cross_entropy(const Exec<Cuda>& e, const CrossEntropyArgs<T, D>& a) {
    if constexpr (std::is_same_v<T, bfloat16>) {
      return Bf16Storage<D>::cross_entropy(e, a);
    } else {
      const cuda::OpScope scope(e, "loss", "cross_entropy");
      return cuda::cross_entropy(e, a);
    }
  }
  template <class T>
  static double mse(const Exec<Cuda>& e, const MseArgs<T, D>& a) {
    const cuda::OpScope scope(e, "loss", "mse");
    return cuda::mse(e, a);
  }

  // ---- optimiser ----
  template <class T>
  static void sgd_step(const Exec<Cuda>& e, const SgdArgs<T, D>& a) {
    const cuda::OpScope scope(e, "optimizer", "sgd");
    cuda::sgd_step(e, a);
  }
  // Every tensor's step in one launch (descriptors as a kernel parameter; no host wait).
  template <class T>
  static void sgd_step_multi(const Exec<Cuda>& e, const MultiSgdArgs<T, D>& a) {
    const cuda::OpScope scope(e, "optimizer", "sgd");
    cuda::sgd_step_multi(e, a);
  }
  // AdamW over every tensor in one launch (per-tensor functors as the kernel parameter).
  template <class T>
  static void adamw_step_multi(const Exec<Cuda>& e, const MultiAdamwArgs<T, D>& a) {
    const cuda::OpScope scope(e, "optimizer", "adamw");
    cuda::adamw_step_multi(e, a);
  }
  // Sum of squares over many tensors in double (one launch; waits for the stream), and x *= alpha.
  template <class T>
  static double sum_squares_multi(const Exec<Cuda>& e, const MultiTensorArgs<T, D>& a) {
    const cuda::OpScope scope(e, "optimizer", "grad_norm");
    return cuda::sum_squares_multi(e, a);
  }
  template <class T>
  static void scale_multi(const Exec<Cuda>& e, const MultiScaleArgs<T, D>& a) {
    const cuda::OpScope scope(e, "optimizer", "grad_scale");
    cuda::scale_multi(e, a);
  }
};
static_assert(KernelsApi<Kernels<Cuda>, Cuda>,
              "ddp: Kernels<Cuda> lacks a member of KernelsApi (kernels/kernels.hpp)");

}  // namespace ddp::kernels
