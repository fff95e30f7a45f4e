// MaxPool2d: max pooling over NHWC activations (torch.nn.MaxPool2d, floor mode, -inf padding).
// SPDX-License-Identifier: MIT
//
// ResNet's stem uses kernel 3, stride 2, padding 1: (N, 112, 112, 64) -> (N, 56, 56, 64). forward
// keeps the argmax of each output (an int32 h * W + w index into the input plane), so backward
// routes each output gradient to the input pixel that won, needing no copy of x.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

// torch.nn.MaxPool2d's: kernel_size is required, stride defaults to kernel_size (0 here, torch's
// None), padding 0.
struct MaxPool2dOptions {
  std::int64_t kernel_size = 0;
  std::int64_t stride = 0;
  std::int64_t padding = 0;
};

template <class T, Device D, class A = T>
class MaxPool2d : public Module<T, D, A> {
 public:
  explicit MaxPool2d(const MaxPool2dOptions& o) : o_(o) {
    this->backward_reads_no_input();  // it keeps argmax
    if (o_.stride == 0) o_.stride = o_.kernel_size;
    if (o_.kernel_size < 1 || o_.stride < 1 || o_.padding < 0 || 2 * o_.padding > o_.kernel_size)
      throw ValueError(ddp::detail::str(
          "ddp: MaxPool2d needs kernel_size >= 1, stride >= 1 (0: kernel_size) and ",
          "0 <= padding <= kernel_size / 2, got kernel_size=", o.kernel_size, ", stride=", o.stride,
          ", padding=", o.padding, " (torch.nn.MaxPool2d(kernel_size, stride=None, padding=0))"));
  }

  std::string describe() const override {
    return ddp::detail::str("MaxPool2d(kernel_size=", o_.kernel_size, ", stride=", o_.stride,
                            ", padding=", o_.padding, ")");
  }

  Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) override {
    if (x.rank() != 4 || x.dim(0) == 0)
      throw ValueError(ddp::detail::str(
          "ddp: ", this->where(), ": input must be a non-empty NHWC batch, got shape ", x.shape()));
    const kernels::Size2 k{o_.kernel_size, o_.kernel_size}, s{o_.stride, o_.stride},
        p{o_.padding, o_.padding};
    const Shape ys = kernels::maxpool2d_output_shape(x, k, s, p);
    Tensor<A, D> y(ys);
    argmax_ = Tensor<std::int32_t, D>(ys);
    Kernels<D>::max_pool2d_forward(exec,
                                   kernels::MaxPool2dForwardArgs<A, D>{.x = x,
                                                                       .y = y.view(),
                                                                       .argmax = argmax_.view(),
                                                                       .kernel = k,
                                                                       .stride = s,
                                                                       .padding = p});
    x_shape_ = x.shape();
    have_state_ = true;
    return y;
  }

  Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dy) override {
    this->require_forward_state(have_state_);
    have_state_ = false;
    Tensor<A, D> dx(x_shape_);
    Kernels<D>::max_pool2d_backward(
        exec, kernels::MaxPool2dBackwardArgs<A, D>{.dy = dy,
                                                   .argmax = argmax_.cview(),
                                                   .dx = dx.view(),
                                                   .kernel = {o_.kernel_size, o_.kernel_size},
                                                   .stride = {o_.stride, o_.stride},
                                                   .padding = {o_.padding, o_.padding}});
    return dx;
  }

 private:
  MaxPool2dOptions o_;
  Tensor<std::int32_t, D> argmax_;  // (N, H_out, W_out, C)
  Shape x_shape_;
  bool have_state_ = false;
};

}  // namespace ddp::nn
