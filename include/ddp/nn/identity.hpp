// Identity (torch.nn.Identity): y = x, dx = dy; any shape. A placeholder where a model's structure
// wants a module.
// SPDX-License-Identifier: MIT
//
// Both calls return a copy (the one a returned Tensor needs: the input belongs to the caller); no
// state but the shape, so it keeps no view of x.
#pragma once

#include <string>

#include "ddp/core/error.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/tensor/copy.hpp"

namespace ddp::nn {

template <class T, Device D>
class Identity : public Module<T, D> {
 public:
  std::string describe() const override { return "Identity()"; }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    Tensor<T, D> y(x.shape());
    copy(x, y.view(), exec);
    shape_ = x.shape();
    have_forward_ = true;
    return y;
  }
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_forward_);
    have_forward_ = false;
    expect_shape(dy, shape_, "output gradient dy", "Identity.backward");
    Tensor<T, D> dx(dy.shape());
    copy(dy, dx.view(), exec);
    return dx;
  }

 private:
  Shape shape_;  // the last forward's input shape
  bool have_forward_ = false;
};

}  // namespace ddp::nn
