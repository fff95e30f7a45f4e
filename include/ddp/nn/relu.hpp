// ReLU as a module, plus the in-place forms and the residual add the ResNet blocks use.
// SPDX-License-Identifier: MIT
//
// relu_(y) clamps y at 0 in place (torchvision's ReLU(inplace=True)); relu_backward_(y, dy) then turns
// dy into dy * (y > 0) in place, using the clamped output as the mask, as PyTorch's threshold_backward does.
// All three run on any device through Kernels<D>::for_each_index and the functors in kernels/elementwise.hpp.
#pragma once

#include <cstddef>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

// y = max(y, 0) in place.
template <class T, Device D>
void relu_(Exec<D>& exec, TensorView<T, D> y) {
  Kernels<D>::for_each_index(exec, static_cast<std::size_t>(y.numel()),
                             kernels::ReluForward<T>{.x = y.data(), .y = y.data()});
}
// g = g * (y > 0) in place; y is the ReLU's output.
template <class T, Device D>
void relu_backward_(Exec<D>& exec, TensorView<const T, D> y, TensorView<T, D> g) {
  expect_shape(g, y.shape(), "gradient", "relu_backward");
  Kernels<D>::for_each_index(exec, static_cast<std::size_t>(y.numel()),
                             kernels::ReluBackward<T>{.y = y.data(), .dy = g.data(), .dx = g.data()});
}
// a += b (the residual connection).
template <class T, Device D>
void add_(Exec<D>& exec, TensorView<T, D> a, TensorView<const T, D> b, const char* what = "residual add") {
  expect_shape(b, a.shape(), "second operand", what);
  Kernels<D>::for_each_index(exec, static_cast<std::size_t>(a.numel()),
                             kernels::Add<T>{.a = a.data(), .b = b.data(), .out = a.data()});
}

template <class T, Device D>
class ReLU : public Module<T, D> {
 public:
  std::string describe() const override { return "ReLU()"; }

  // Returns a new tensor; keeps a view of it for backward (the caller keeps y alive until then).
  Tensor<T, D> forward(Exec<D>& exec, TensorView<const T, D> x) override {
    Tensor<T, D> y(x.shape());
    Kernels<D>::for_each_index(exec, static_cast<std::size_t>(x.numel()),
                               kernels::ReluForward<T>{.x = x.data(), .y = y.data()});
    y_ = y.cview();
    have_y_ = true;
    return y;
  }
  Tensor<T, D> backward(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_y_);
    have_y_ = false;
    expect_shape(dy, y_.shape(), "output gradient dy", "ReLU.backward");
    Tensor<T, D> dx(dy.shape());
    Kernels<D>::for_each_index(exec, static_cast<std::size_t>(dy.numel()),
                               kernels::ReluBackward<T>{.y = y_.data(), .dy = dy.data(), .dx = dx.data()});
    return dx;
  }

 private:
  TensorView<const T, D> y_;
  bool have_y_ = false;
};

}  // namespace ddp::nn
