// Tanh as a module (torch.nn.Tanh): y = tanh(x); any shape.
// SPDX-License-Identifier: MIT
//
// Forward keeps a view of its output y, as ReLU does (the caller keeps y alive until backward
// returns); backward returns dx = dy (1 - y^2), torch's formula from the output. Runs on any device
// through Kernels<D>::tanh_forward / tanh_backward (kernels/elementwise.hpp's functors).
#pragma once

#include <string>

#include "ddp/core/error.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

template <class T, Device D>
class Tanh : public Module<T, D> {
 public:
  std::string describe() const override { return "Tanh()"; }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    Tensor<T, D> y(x.shape());
    Kernels<D>::tanh_forward(exec, x, y.view());
    y_ = y.cview();
    have_y_ = true;
    return y;
  }
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_y_);
    have_y_ = false;
    expect_shape(dy, y_.shape(), "output gradient dy", "Tanh.backward");
    Tensor<T, D> dx(dy.shape());
    Kernels<D>::tanh_backward(exec, y_, dy, dx.view());
    return dx;
  }

 private:
  TensorView<const T, D> y_;  // the last forward's output, kept alive by the caller
  bool have_y_ = false;
};

}  // namespace ddp::nn
