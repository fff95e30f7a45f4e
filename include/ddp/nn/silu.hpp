// SiLU as a module (torch.nn.SiLU): y = x sigmoid(x) = x / (1 + exp(-x)); any shape.
// SPDX-License-Identifier: MIT
//
// Forward keeps a view of x (THE CALLER KEEPS x ALIVE until backward returns, nn/module.hpp);
// backward returns dx = dy s (1 + x (1 - s)), s = sigmoid(x), torch's formula. Runs on any device
// through Kernels<D>::silu_forward / silu_backward (kernels/elementwise.hpp's functors).
#pragma once

#include <string>

#include "ddp/core/error.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

template <class T, Device D>
class SiLU : public Module<T, D> {
 public:
  std::string describe() const override { return "SiLU()"; }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    Tensor<T, D> y(x.shape());
    Kernels<D>::silu_forward(exec, x, y.view());
    x_ = x;
    have_x_ = true;
    return y;
  }
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_x_);
    have_x_ = false;
    expect_shape(dy, x_.shape(), "output gradient dy", "SiLU.backward");
    Tensor<T, D> dx(dy.shape());
    Kernels<D>::silu_backward(exec, x_, dy, dx.view());
    return dx;
  }

 private:
  TensorView<const T, D> x_;  // the last forward's input, owned by the caller
  bool have_x_ = false;
};

}  // namespace ddp::nn
