// AdaptiveAvgPool2d: average pooling to a fixed output size (torch.nn.AdaptiveAvgPool2d); ResNet
// uses (1, 1).
// SPDX-License-Identifier: MIT
//
// Output cell (i, j) averages input rows [floor(i H / H_out), ceil((i + 1) H / H_out)) and the same
// for columns, as in PyTorch; with (1, 1) it is the global average: (N, 7, 7, 512) -> (N, 1, 1,
// 512).
#pragma once

#include <cstdint>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

template <class T, Device D, class A = T>
class AdaptiveAvgPool2d : public Module<T, D, A> {
 public:
  explicit AdaptiveAvgPool2d(std::int64_t out_h = 1, std::int64_t out_w = 1)
      : out_h_(out_h), out_w_(out_w) {
    if (out_h < 1 || out_w < 1)
      throw ValueError(ddp::detail::str("ddp: AdaptiveAvgPool2d output size must be >= 1, got (",
                                        out_h, ", ", out_w, ")"));
  }

  std::string describe() const override {
    return ddp::detail::str("AdaptiveAvgPool2d(output_size=(", out_h_, ", ", out_w_, "))");
  }

  Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) override {
    if (x.rank() != 4 || x.dim(0) == 0)
      throw ValueError(ddp::detail::str(
          "ddp: ", this->where(), ": input must be a non-empty NHWC batch, got shape ", x.shape()));
    Tensor<A, D> y(Shape{x.dim(0), out_h_, out_w_, x.dim(3)});
    Kernels<D>::adaptive_avg_pool2d_forward(
        exec, kernels::AdaptiveAvgPool2dForwardArgs<A, D>{.x = x, .y = y.view()});
    x_shape_ = x.shape();
    have_state_ = true;
    return y;
  }

  Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dy) override {
    this->require_forward_state(have_state_);
    have_state_ = false;
    Tensor<A, D> dx(x_shape_);
    Kernels<D>::adaptive_avg_pool2d_backward(
        exec, kernels::AdaptiveAvgPool2dBackwardArgs<A, D>{.dy = dy, .dx = dx.view()});
    return dx;
  }

 private:
  std::int64_t out_h_, out_w_;
  Shape x_shape_;
  bool have_state_ = false;
};

}  // namespace ddp::nn
