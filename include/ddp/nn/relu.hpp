// ReLU as a module (torch.nn.ReLU): y = max(x, 0), NaN stays NaN; backward masks dy with y > 0.
// SPDX-License-Identifier: MIT
//
// Runs on any device through Kernels<D>::relu_forward / relu_backward (kernels/elementwise.hpp's
// functors). The ResNet blocks and stem do not use it: their ReLUs are fused into
// BatchNorm2d::forward_act.
#pragma once

#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

template <class T, Device D>
class ReLU : public Module<T, D> {
 public:
  std::string describe() const override { return "ReLU()"; }

  // Returns a new tensor; keeps a view of it for backward (the caller keeps y alive until then).
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    Tensor<T, D> y(x.shape());
    Kernels<D>::relu_forward(exec, x, y.view());
    y_ = y.cview();
    have_y_ = true;
    return y;
  }
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_y_);
    have_y_ = false;
    expect_shape(dy, y_.shape(), "output gradient dy", "ReLU.backward");
    Tensor<T, D> dx(dy.shape());
    Kernels<D>::relu_backward(exec, y_, dy, dx.view());
    return dx;
  }

 private:
  TensorView<const T, D> y_;
  bool have_y_ = false;
};

}  // namespace ddp::nn
