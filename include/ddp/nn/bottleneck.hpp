// Bottleneck: ResNet-50/101/152's residual block (torchvision.models.resnet.Bottleneck, "ResNet
// v1.5"), expansion 4.
// SPDX-License-Identifier: MIT
//
//   out = relu( bn3(conv3( relu(bn2(conv2( relu(bn1(conv1(x))) ))) )) + identity )
// conv1 1x1 (inplanes -> planes), conv2 3x3 stride s pad 1 (planes -> planes; the stride sits here,
// as in torchvision, not on conv1 as in the original paper), conv3 1x1 (planes -> 4 planes);
// downsample as in BasicBlock. Forward and backward (and the order gradients are reported in) are
// ResidualBlock's (nn/residual.hpp) over the stages (conv1, bn1), (conv2, bn2), (conv3, bn3).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ddp/core/str.hpp"
#include "ddp/nn/batchnorm2d.hpp"
#include "ddp/nn/conv2d.hpp"
#include "ddp/nn/residual.hpp"
#include "ddp/nn/sequential.hpp"

namespace ddp::nn {

template <class T, Device D, class A = T>
class Bottleneck : public ResidualBlock<T, D, A> {
 public:
  static constexpr std::int64_t kExpansion = 4;

  explicit Bottleneck(const BlockOptions& o) : o_(o) {
    const std::int64_t out = o.planes * kExpansion;
    conv1_ = &this->register_module(
        "conv1", std::make_unique<Conv2d<T, D, A>>(Conv2dOptions{.in_channels = o.inplanes,
                                                                 .out_channels = o.planes,
                                                                 .kernel_size = 1,
                                                                 .stride = 1,
                                                                 .padding = 0,
                                                                 .bias = false}));
    bn1_ = &this->register_module("bn1", std::make_unique<BatchNorm2d<T, D, A>>(
                                             BatchNorm2dOptions{.num_features = o.planes}));
    conv2_ = &this->register_module(
        "conv2", std::make_unique<Conv2d<T, D, A>>(Conv2dOptions{.in_channels = o.planes,
                                                                 .out_channels = o.planes,
                                                                 .kernel_size = 3,
                                                                 .stride = o.stride,
                                                                 .padding = 1,
                                                                 .bias = false}));
    bn2_ = &this->register_module("bn2", std::make_unique<BatchNorm2d<T, D, A>>(
                                             BatchNorm2dOptions{.num_features = o.planes}));
    conv3_ = &this->register_module(
        "conv3", std::make_unique<Conv2d<T, D, A>>(Conv2dOptions{.in_channels = o.planes,
                                                                 .out_channels = out,
                                                                 .kernel_size = 1,
                                                                 .stride = 1,
                                                                 .padding = 0,
                                                                 .bias = false}));
    bn3_ = &this->register_module(
        "bn3", std::make_unique<BatchNorm2d<T, D, A>>(BatchNorm2dOptions{.num_features = out}));
    if (o.downsample)
      this->set_downsample(&this->register_module(
          "downsample", detail::make_downsample<T, D, A>(o.inplanes, out, o.stride)));
    this->add_stage(conv1_, bn1_);
    this->add_stage(conv2_, bn2_);
    this->add_stage(conv3_, bn3_);
    this->set_recompute_relu(o.recompute_relu);
  }

  BatchNorm2d<T, D, A>& last_bn() noexcept { return *bn3_; }
  std::string describe() const override {
    return ddp::detail::str("Bottleneck(", o_.inplanes, " -> ", o_.planes, " -> ",
                            o_.planes * kExpansion, ", stride=", o_.stride,
                            o_.downsample ? ", downsample" : "", ")");
  }

 private:
  BlockOptions o_;
  Conv2d<T, D, A>*conv1_ = nullptr, *conv2_ = nullptr, *conv3_ = nullptr;
  BatchNorm2d<T, D, A>*bn1_ = nullptr, *bn2_ = nullptr, *bn3_ = nullptr;
};

}  // namespace ddp::nn
