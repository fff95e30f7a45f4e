// BasicBlock: ResNet-18/34's residual block (torchvision.models.resnet.BasicBlock), expansion 1.
// SPDX-License-Identifier: MIT
//
//   out = relu( bn2(conv2( relu(bn1(conv1(x))) )) + identity ),  identity = downsample(x) or x
// conv1 3x3 stride s pad 1 (inplanes -> planes), conv2 3x3 pad 1 (planes -> planes); downsample,
// when present, is Sequential(Conv2d 1x1 stride s, BatchNorm2d) named "downsample.0" /
// "downsample.1". Forward and backward (and the order gradients are reported in) are
// ResidualBlock's (nn/residual.hpp) over the stages (conv1, bn1), (conv2, bn2).
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
class BasicBlock : public ResidualBlock<T, D, A> {
 public:
  static constexpr std::int64_t kExpansion = 1;

  explicit BasicBlock(const BlockOptions& o) : o_(o) {
    conv1_ = &this->register_module(
        "conv1", std::make_unique<Conv2d<T, D, A>>(Conv2dOptions{.in_channels = o.inplanes,
                                                                 .out_channels = o.planes,
                                                                 .kernel_size = 3,
                                                                 .stride = o.stride,
                                                                 .padding = 1,
                                                                 .bias = false}));
    bn1_ = &this->register_module("bn1", std::make_unique<BatchNorm2d<T, D, A>>(
                                             BatchNorm2dOptions{.num_features = o.planes}));
    conv2_ = &this->register_module(
        "conv2", std::make_unique<Conv2d<T, D, A>>(Conv2dOptions{.in_channels = o.planes,
                                                                 .out_channels = o.planes,
                                                                 .kernel_size = 3,
                                                                 .stride = 1,
                                                                 .padding = 1,
                                                                 .bias = false}));
    bn2_ = &this->register_module("bn2", std::make_unique<BatchNorm2d<T, D, A>>(
                                             BatchNorm2dOptions{.num_features = o.planes}));
    if (o.downsample)
      this->set_downsample(&this->register_module(
          "downsample", detail::make_downsample<T, D, A>(o.inplanes, o.planes, o.stride)));
    this->add_stage(conv1_, bn1_);
    this->add_stage(conv2_, bn2_);
    this->set_recompute_relu(o.recompute_relu);
  }

  // The BatchNorm whose weight zero_init_residual sets to 0.
  BatchNorm2d<T, D, A>& last_bn() noexcept { return *bn2_; }
  std::string describe() const override {
    return ddp::detail::str("BasicBlock(", o_.inplanes, " -> ", o_.planes, ", stride=", o_.stride,
                            o_.downsample ? ", downsample" : "", ")");
  }

 private:
  BlockOptions o_;
  Conv2d<T, D, A>* conv1_ = nullptr;
  BatchNorm2d<T, D, A>* bn1_ = nullptr;
  Conv2d<T, D, A>* conv2_ = nullptr;
  BatchNorm2d<T, D, A>* bn2_ = nullptr;
};

}  // namespace ddp::nn
