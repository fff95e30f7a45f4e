// Kernels<Cpu>: every op on the CPU, each member forwarding to the op's own file in kernels/cpu/.
// SPDX-License-Identifier: MIT
//
// Kernels<Cuda> (kernels/cuda/kernels.cuh) lists the same members with the same signatures. All members
// are blocking: on return the outputs are written. They throw ValueError for bad shapes (see args.hpp).
// Thread-safety: concurrent calls with disjoint outputs are safe; calls sharing one Exec's pool are
// serialised by the pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/batchnorm.hpp"
#include "ddp/kernels/cpu/conv2d.hpp"
#include "ddp/kernels/cpu/gemm.hpp"
#include "ddp/kernels/cpu/linear.hpp"
#include "ddp/kernels/cpu/loss.hpp"
#include "ddp/kernels/cpu/pool.hpp"
#include "ddp/kernels/cpu/sgd.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

template <>
struct Kernels<Cpu> {
  using D = Cpu;

  // f(i) for i in [0, n), spread over the pool in contiguous chunks (f must be order-independent).
  template <class F>
  static void for_each_index(const Exec<Cpu>& e, std::size_t n, F f) {
    cpu::parallel_for(e, static_cast<std::int64_t>(n), 1 << 14, [&](std::int64_t b, std::int64_t end, int) {
      for (auto i = static_cast<std::size_t>(b); i < static_cast<std::size_t>(end); ++i) f(i);
    });
  }

  // ---- element-wise (x, y of equal shape; checked) ----
  template <class T>
  static void relu_forward(const Exec<Cpu>& e, TensorView<const T, D> x, TensorView<T, D> y) {
    expect_shape(y, x.shape(), "output y", "relu_forward");
    for_each_index(e, static_cast<std::size_t>(x.numel()), ReluForward<T>{.x = x.data(), .y = y.data()});
  }
  // dx = dy where the forward output y > 0 (dx may alias dy).
  template <class T>
  static void relu_backward(const Exec<Cpu>& e, TensorView<const T, D> y, TensorView<const T, D> dy,
                            TensorView<T, D> dx) {
    expect_shape(dy, y.shape(), "output gradient dy", "relu_backward");
    expect_shape(dx, y.shape(), "input gradient dx", "relu_backward");
    for_each_index(e, static_cast<std::size_t>(y.numel()),
                   ReluBackward<T>{.y = y.data(), .dy = dy.data(), .dx = dx.data()});
  }
  // out = a + b (the residual add; out may alias a or b).
  template <class T>
  static void add(const Exec<Cpu>& e, TensorView<const T, D> a, TensorView<const T, D> b, TensorView<T, D> out) {
    expect_shape(b, a.shape(), "second operand", "add");
    expect_shape(out, a.shape(), "output", "add");
    for_each_index(e, static_cast<std::size_t>(a.numel()), Add<T>{.a = a.data(), .b = b.data(), .out = out.data()});
  }
  // y += alpha * x.
  template <class T>
  static void axpy(const Exec<Cpu>& e, T alpha, TensorView<const T, D> x, TensorView<T, D> y) {
    expect_shape(y, x.shape(), "y", "axpy");
    for_each_index(e, static_cast<std::size_t>(x.numel()), Axpy<T>{.alpha = alpha, .x = x.data(), .y = y.data()});
  }
  // x *= alpha.
  template <class T>
  static void scale(const Exec<Cpu>& e, T alpha, TensorView<T, D> x) {
    for_each_index(e, static_cast<std::size_t>(x.numel()), Scale<T>{.alpha = alpha, .x = x.data()});
  }
  // x = value.
  template <class T>
  static void fill(const Exec<Cpu>& e, TensorView<T, D> x, T value) {
    for_each_index(e, static_cast<std::size_t>(x.numel()), Fill<T>{.value = value, .x = x.data()});
  }

  // ---- layers ----
  template <class T>
  static void conv2d_forward(const Exec<Cpu>& e, const Conv2dForwardArgs<T, D>& a) {
    cpu::conv2d_forward(e, a);
  }
  template <class T>
  static void conv2d_backward(const Exec<Cpu>& e, const Conv2dBackwardArgs<T, D>& a) {
    cpu::conv2d_backward(e, a);
  }
  template <class T>
  static void batchnorm_forward(const Exec<Cpu>& e, const BatchNormForwardArgs<T, D>& a) {
    cpu::batchnorm_forward(e, a);
  }
  template <class T>
  static void batchnorm_backward(const Exec<Cpu>& e, const BatchNormBackwardArgs<T, D>& a) {
    cpu::batchnorm_backward(e, a);
  }
  template <class T>
  static void max_pool2d_forward(const Exec<Cpu>& e, const MaxPool2dForwardArgs<T, D>& a) {
    cpu::max_pool2d_forward(e, a);
  }
  template <class T>
  static void max_pool2d_backward(const Exec<Cpu>& e, const MaxPool2dBackwardArgs<T, D>& a) {
    cpu::max_pool2d_backward(e, a);
  }
  template <class T>
  static void adaptive_avg_pool2d_forward(const Exec<Cpu>& e, const AdaptiveAvgPool2dForwardArgs<T, D>& a) {
    cpu::adaptive_avg_pool2d_forward(e, a);
  }
  template <class T>
  static void adaptive_avg_pool2d_backward(const Exec<Cpu>& e, const AdaptiveAvgPool2dBackwardArgs<T, D>& a) {
    cpu::adaptive_avg_pool2d_backward(e, a);
  }
  template <class T>
  static void linear_forward(const Exec<Cpu>& e, const LinearForwardArgs<T, D>& a) {
    cpu::linear_forward(e, a);
  }
  template <class T>
  static void linear_backward(const Exec<Cpu>& e, const LinearBackwardArgs<T, D>& a) {
    cpu::linear_backward(e, a);
  }

  // ---- losses (return the mean loss; write the gradient when requested) ----
  template <class T>
  static double cross_entropy(const Exec<Cpu>& e, const CrossEntropyArgs<T, D>& a) {
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
};

}  // namespace ddp::kernels
