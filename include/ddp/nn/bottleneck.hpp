// Bottleneck: ResNet-50/101/152's residual block (torchvision.models.resnet.Bottleneck, "ResNet v1.5"), expansion 4.
// SPDX-License-Identifier: MIT
//
//   out = relu( bn3(conv3( relu(bn2(conv2( relu(bn1(conv1(x))) ))) )) + identity )
// conv1 1x1 (inplanes -> planes), conv2 3x3 stride s pad 1 (planes -> planes; the stride sits here, as in
// torchvision, not on conv1 as in the original paper), conv3 1x1 (planes -> 4 planes); downsample as in
// BasicBlock. Backward mirrors forward exactly like BasicBlock's (see basic_block.hpp), including the
// fused BatchNorm + ReLU (+ residual) path on the GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "ddp/nn/basic_block.hpp"
#include "ddp/nn/batchnorm2d.hpp"
#include "ddp/nn/conv2d.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/relu.hpp"
#include "ddp/nn/sequential.hpp"

namespace ddp::nn {

template <class T, Device D>
class Bottleneck : public Module<T, D> {
 public:
  static constexpr std::int64_t kExpansion = 4;

  explicit Bottleneck(const BlockOptions& o) : o_(o) {
    const std::int64_t out = o.planes * kExpansion;
    conv1_ = &this->register_module("conv1", std::make_unique<Conv2d<T, D>>(Conv2dOptions{
                                                 .in_channels = o.inplanes, .out_channels = o.planes,
                                                 .kernel_size = 1, .stride = 1, .padding = 0}));
    bn1_ = &this->register_module("bn1", std::make_unique<BatchNorm2d<T, D>>(BatchNorm2dOptions{.num_features = o.planes}));
    conv2_ = &this->register_module("conv2", std::make_unique<Conv2d<T, D>>(Conv2dOptions{
                                                 .in_channels = o.planes, .out_channels = o.planes, .kernel_size = 3,
                                                 .stride = o.stride, .padding = 1}));
    bn2_ = &this->register_module("bn2", std::make_unique<BatchNorm2d<T, D>>(BatchNorm2dOptions{.num_features = o.planes}));
    conv3_ = &this->register_module("conv3", std::make_unique<Conv2d<T, D>>(Conv2dOptions{
                                                 .in_channels = o.planes, .out_channels = out, .kernel_size = 1,
                                                 .stride = 1, .padding = 0}));
    bn3_ = &this->register_module("bn3", std::make_unique<BatchNorm2d<T, D>>(BatchNorm2dOptions{.num_features = out}));
    if (o.downsample)
      downsample_ = &this->register_module("downsample", detail::make_downsample<T, D>(o.inplanes, out, o.stride));
  }

  BatchNorm2d<T, D>& last_bn() noexcept { return *bn3_; }
  std::string describe() const override {
    return ddp::detail::str("Bottleneck(", o_.inplanes, " -> ", o_.planes, " -> ", o_.planes * kExpansion,
                            ", stride=", o_.stride, o_.downsample ? ", downsample" : "", ")");
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
    a2_ = bn2_->forward(exec, c2_.cview());
    relu_(exec, a2_.view());
    c3_ = conv3_->forward(exec, a2_.cview());
    Tensor<T, D> out = bn3_->forward(exec, c3_.cview());
    if (downsample_) {
      id_ = downsample_->forward(exec, x);
      add_(exec, out.view(), id_.cview(), "Bottleneck residual add");
    } else {
      if (!(x.shape() == out.shape()))
        throw ValueError(ddp::detail::str("ddp: ", this->where(), ": input ", x.shape(), " and main-path output ",
                                          out.shape(), " differ but the block has no downsample"));
      add_(exec, out.view(), x, "Bottleneck residual add");
    }
    relu_(exec, out.view());
    y_ = out.cview();
    have_state_ = true;
    return out;
  }

  Tensor<T, D> backward_unfused(Exec<D>& exec, TensorView<const T, D> dy) {
    Tensor<T, D> g = detail::relu_grad(exec, y_, dy, this->where());
    Tensor<T, D> skip = downsample_ ? downsample_->backward(exec, g.cview()) : Tensor<T, D>();
    Tensor<T, D> h = bn3_->backward(exec, g.cview());
    h = conv3_->backward(exec, h.cview());
    relu_backward_(exec, a2_.cview(), h.view());
    h = bn2_->backward(exec, h.cview());
    h = conv2_->backward(exec, h.cview());
    relu_backward_(exec, a1_.cview(), h.view());
    h = bn1_->backward(exec, h.cview());
    Tensor<T, D> dx = conv1_->backward(exec, h.cview());
    add_(exec, dx.view(), downsample_ ? skip.cview() : g.cview(), "Bottleneck backward");
    c1_ = {};
    a1_ = {};
    c2_ = {};
    a2_ = {};
    c3_ = {};
    id_ = {};
    return dx;
  }

  Tensor<T, D> forward_fused(Exec<D>& exec, TensorView<const T, D> x) {
    c1_ = conv1_->forward(exec, x);
    a1_ = bn1_->forward_act(exec, c1_.cview(), {}, true);
    c2_ = conv2_->forward(exec, a1_.cview());
    a2_ = bn2_->forward_act(exec, c2_.cview(), {}, true);
    c3_ = conv3_->forward(exec, a2_.cview());
    TensorView<const T, D> skip = x;
    if (downsample_) {
      id_ = downsample_->forward(exec, x);
      skip = id_.cview();
    } else if (!(x.shape() == c3_.shape())) {
      throw ValueError(ddp::detail::str("ddp: ", this->where(), ": input ", x.shape(), " and main-path output ",
                                        c3_.shape(), " differ but the block has no downsample"));
    }
    Tensor<T, D> out = bn3_->forward_act(exec, c3_.cview(), skip, true);
    y_ = out.cview();
    have_state_ = true;
    return out;
  }

  Tensor<T, D> backward_fused(Exec<D>& exec, TensorView<const T, D> dy) {
    if (!(dy.shape() == y_.shape()))
      throw ValueError(ddp::detail::str("ddp: backward of ", this->where(), ": output gradient has shape ", dy.shape(),
                                        " but the output has shape ", y_.shape()));
    Tensor<T, D> g(dy.shape());  // dy * (out > 0): the skip path's gradient
    Tensor<T, D> h = bn3_->backward_act(exec, dy, y_, g.view());
    Tensor<T, D> skip = downsample_ ? downsample_->backward(exec, g.cview()) : Tensor<T, D>();
    h = conv3_->backward(exec, h.cview());
    h = bn2_->backward_act(exec, h.cview(), a2_.cview(), {});
    h = conv2_->backward(exec, h.cview());
    h = bn1_->backward_act(exec, h.cview(), a1_.cview(), {});
    Tensor<T, D> dx = conv1_->backward(exec, h.cview());
    add_(exec, dx.view(), downsample_ ? skip.cview() : g.cview(), "Bottleneck backward");
    c1_ = {};
    a1_ = {};
    c2_ = {};
    a2_ = {};
    c3_ = {};
    id_ = {};
    return dx;
  }

  BlockOptions o_;
  Conv2d<T, D>*conv1_ = nullptr, *conv2_ = nullptr, *conv3_ = nullptr;
  BatchNorm2d<T, D>*bn1_ = nullptr, *bn2_ = nullptr, *bn3_ = nullptr;
  Sequential<T, D>* downsample_ = nullptr;
  Tensor<T, D> c1_, a1_, c2_, a2_, c3_, id_;  // intermediates kept for backward
  TensorView<const T, D> y_;                  // the block's output, owned by the caller
  bool have_state_ = false;
};

}  // namespace ddp::nn
