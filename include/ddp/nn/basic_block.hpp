// BasicBlock: ResNet-18/34's residual block (torchvision.models.resnet.BasicBlock), expansion 1.
// SPDX-License-Identifier: MIT
//
//   out = relu( bn2(conv2( relu(bn1(conv1(x))) )) + identity ),  identity = downsample(x) or x
// conv1 3x3 stride s pad 1 (inplanes -> planes), conv2 3x3 pad 1 (planes -> planes); downsample, when
// present, is Sequential(Conv2d 1x1 stride s, BatchNorm2d) named "downsample.0" / "downsample.1".
// Backward (how it works): g = dy * (out > 0); the skip path gets g (through downsample.backward when
// present); the main path runs bn2, conv2, the ReLU mask of bn1's output, bn1, conv1 in reverse; dx is
// the sum of both. The ReLUs run in place on the BatchNorm outputs (torchvision's inplace=True), which
// is safe because BatchNorm's backward needs its input, not its output.
// On the GPU the block runs fused: bn1 + ReLU and bn2 + residual add + ReLU are each one pass
// (BatchNorm2d::forward_act, kernels/cuda/bn_act.cuh), and backward applies the ReLU masks inside the
// BatchNorm backward passes. Same numbers to fp32 rounding; the gradients of bn2 are then reported before
// the downsample's (they used to follow them), which only changes DDP's first-step bucket order.
// The CPU keeps the unfused path (it gains nothing there and its results stay bit-identical).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/batchnorm2d.hpp"
#include "ddp/nn/conv2d.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/sequential.hpp"

namespace ddp::nn {

struct BlockOptions {
  std::int64_t inplanes = 64;
  std::int64_t planes = 64;
  std::int64_t stride = 1;
  bool downsample = false;  // add the 1x1 conv + BN projection on the skip path
};

namespace detail {
// Sequential(Conv2d(inplanes, outplanes, 1, stride, bias=False), BatchNorm2d(outplanes)).
template <class T, Device D>
std::unique_ptr<Sequential<T, D>> make_downsample(std::int64_t inplanes, std::int64_t outplanes, std::int64_t stride) {
  auto ds = std::make_unique<Sequential<T, D>>();
  ds->push_back(std::make_unique<Conv2d<T, D>>(Conv2dOptions{
      .in_channels = inplanes, .out_channels = outplanes, .kernel_size = 1, .stride = stride, .padding = 0}));
  ds->push_back(std::make_unique<BatchNorm2d<T, D>>(BatchNorm2dOptions{.num_features = outplanes}));
  return ds;
}
// g = dy * (y > 0) into a new tensor.
template <class T, Device D>
Tensor<T, D> relu_grad(Exec<D>& exec, TensorView<const T, D> y, TensorView<const T, D> dy, const std::string& where) {
  if (!(dy.shape() == y.shape()))
    throw ValueError(ddp::detail::str("ddp: backward of ", where, ": output gradient has shape ", dy.shape(),
                                      " but the output has shape ", y.shape()));
  Tensor<T, D> g(dy.shape());
  Kernels<D>::for_each_index(exec, static_cast<std::size_t>(dy.numel()),
                             kernels::ReluBackward<T>{.y = y.data(), .dy = dy.data(), .dx = g.data()});
  return g;
}
}  // namespace detail

template <class T, Device D>
class BasicBlock : public Module<T, D> {
 public:
  static constexpr std::int64_t kExpansion = 1;

  explicit BasicBlock(const BlockOptions& o) : o_(o) {
    conv1_ = &this->register_module("conv1", std::make_unique<Conv2d<T, D>>(Conv2dOptions{
                                                 .in_channels = o.inplanes, .out_channels = o.planes,
                                                 .kernel_size = 3, .stride = o.stride, .padding = 1}));
    bn1_ = &this->register_module("bn1", std::make_unique<BatchNorm2d<T, D>>(BatchNorm2dOptions{.num_features = o.planes}));
    conv2_ = &this->register_module("conv2", std::make_unique<Conv2d<T, D>>(Conv2dOptions{
                                                 .in_channels = o.planes, .out_channels = o.planes, .kernel_size = 3,
                                                 .stride = 1, .padding = 1}));
    bn2_ = &this->register_module("bn2", std::make_unique<BatchNorm2d<T, D>>(BatchNorm2dOptions{.num_features = o.planes}));
    if (o.downsample)
      downsample_ = &this->register_module("downsample", detail::make_downsample<T, D>(o.inplanes, o.planes, o.stride));
  }

  // The BatchNorm whose weight zero_init_residual sets to 0.
  BatchNorm2d<T, D>& last_bn() noexcept { return *bn2_; }
  std::string describe() const override {
    return ddp::detail::str("BasicBlock(", o_.inplanes, " -> ", o_.planes, ", stride=", o_.stride,
                            o_.downsample ? ", downsample" : "", ")");
  }

  Tensor<T, D> forward(Exec<D>& exec, TensorView<const T, D> x) override {
    if constexpr (std::is_same_v<D, Cuda>)
      return forward_fused(exec, x);
    else
      return forward_unfused(exec, x);
  }

  Tensor<T, D> backward(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_state_);
    have_state_ = false;
    if constexpr (std::is_same_v<D, Cuda>)
      return backward_fused(exec, dy);
    else
      return backward_unfused(exec, dy);
  }

 private:
  Tensor<T, D> forward_unfused(Exec<D>& exec, TensorView<const T, D> x) {
    c1_ = conv1_->forward(exec, x);
    a1_ = bn1_->forward(exec, c1_.cview());
    relu_(exec, a1_.view());
    c2_ = conv2_->forward(exec, a1_.cview());
    Tensor<T, D> out = bn2_->forward(exec, c2_.cview());
    if (downsample_) {
      id_ = downsample_->forward(exec, x);
      add_(exec, out.view(), id_.cview(), "BasicBlock residual add");
    } else {
      if (!(x.shape() == out.shape()))
        throw ValueError(ddp::detail::str("ddp: ", this->where(), ": input ", x.shape(), " and main-path output ",
                                          out.shape(), " differ but the block has no downsample"));
      add_(exec, out.view(), x, "BasicBlock residual add");
    }
    relu_(exec, out.view());
    y_ = out.cview();
    have_state_ = true;
    return out;
  }

  Tensor<T, D> backward_unfused(Exec<D>& exec, TensorView<const T, D> dy) {
    Tensor<T, D> g = detail::relu_grad(exec, y_, dy, this->where());
    Tensor<T, D> skip = downsample_ ? downsample_->backward(exec, g.cview()) : Tensor<T, D>();
    Tensor<T, D> h = bn2_->backward(exec, g.cview());
    h = conv2_->backward(exec, h.cview());
    relu_backward_(exec, a1_.cview(), h.view());
    h = bn1_->backward(exec, h.cview());
    Tensor<T, D> dx = conv1_->backward(exec, h.cview());
    add_(exec, dx.view(), downsample_ ? skip.cview() : g.cview(), "BasicBlock backward");
    c1_ = {};
    a1_ = {};
    c2_ = {};
    id_ = {};
    return dx;
  }

  Tensor<T, D> forward_fused(Exec<D>& exec, TensorView<const T, D> x) {
    c1_ = conv1_->forward(exec, x);
    a1_ = bn1_->forward_act(exec, c1_.cview(), {}, true);
    c2_ = conv2_->forward(exec, a1_.cview());
    TensorView<const T, D> skip = x;
    if (downsample_) {
      id_ = downsample_->forward(exec, x);
      skip = id_.cview();
    } else if (!(x.shape() == c2_.shape())) {
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": input ", x.shape(), " and main-path output ",
                                        c2_.shape(), " differ but the block has no downsample"));
    }
    Tensor<T, D> out = bn2_->forward_act(exec, c2_.cview(), skip, true);
    y_ = out.cview();
    have_state_ = true;
    return out;
  }

  Tensor<T, D> backward_fused(Exec<D>& exec, TensorView<const T, D> dy) {
    if (!(dy.shape() == y_.shape()))
      throw ValueError(ddp::detail::str("ddp: backward of ", this->where(), ": output gradient has shape ", dy.shape(),
                                        " but the output has shape ", y_.shape()));
    Tensor<T, D> g(dy.shape());  // dy * (out > 0): the skip path's gradient
    Tensor<T, D> h = bn2_->backward_act(exec, dy, y_, g.view());
    Tensor<T, D> skip = downsample_ ? downsample_->backward(exec, g.cview()) : Tensor<T, D>();
    h = conv2_->backward(exec, h.cview());
    h = bn1_->backward_act(exec, h.cview(), a1_.cview(), {});
    Tensor<T, D> dx = conv1_->backward(exec, h.cview());
    add_(exec, dx.view(), downsample_ ? skip.cview() : g.cview(), "BasicBlock backward");
    c1_ = {};
    a1_ = {};
    c2_ = {};
    id_ = {};
    return dx;
  }

  BlockOptions o_;
  Conv2d<T, D>* conv1_ = nullptr;
  BatchNorm2d<T, D>* bn1_ = nullptr;
  Conv2d<T, D>* conv2_ = nullptr;
  BatchNorm2d<T, D>* bn2_ = nullptr;
  Sequential<T, D>* downsample_ = nullptr;
  Tensor<T, D> c1_, a1_, c2_, id_;  // conv1 out, relu(bn1) out, conv2 out, downsample out: (N, H', W', planes)
  TensorView<const T, D> y_;        // the block's output, owned by the caller
  bool have_state_ = false;
};

}  // namespace ddp::nn
