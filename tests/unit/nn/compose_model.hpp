// The residual CNN of the composition tests (issue 39), built only from modules without backward code of its own:
// the twin of the torch model in tests/interop/reference/make_compose_reference.py, module for module and name for name.
// SPDX-License-Identifier: MIT
//
//   0 Conv2d(3, 4, 3, padding=1)  1 BatchNorm2d(4)  2 ReLU
//   3 Residual(body=Sequential(Conv2d(4, 4, 3), BatchNorm2d, ReLU, Conv2d(4, 4, 3), BatchNorm2d))   identity shortcut
//   4 ReLU                                                                                            relu(body(x) + x)
//   5 Residual(body=Sequential(Conv2d(4, 6, 3, stride 2, bias), BatchNorm2d, SiLU, Conv2d(6, 6, 3), BatchNorm2d),
//              shortcut=Sequential(Conv2d(4, 6, 1, stride 2), BatchNorm2d(6)))
//   6 Tanh  7 Dropout(p)  8 Flatten  9 Linear(6 * 4 * 4, 5)  10 Sigmoid  11 Sequential(Identity, Linear(5, 3))
// Input (N, 8, 8, 3) NHWC, output (N, 3). Tests set every parameter themselves (from torch or a seeded draw).
#pragma once

#include <cstdint>
#include <memory>

#include <ddp/nn/activation.hpp>
#include <ddp/nn/batchnorm2d.hpp>
#include <ddp/nn/conv2d.hpp>
#include <ddp/nn/dropout.hpp>
#include <ddp/nn/flatten.hpp>
#include <ddp/nn/identity.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/residual_wrapper.hpp>
#include <ddp/nn/sequential.hpp>

namespace ddp::test {

template <class T, Device D>
std::unique_ptr<nn::Sequential<T, D>> make_compose_model(double dropout_p) {
  using nn::Sequential;
  auto conv = [](std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride = 1, bool bias = false) {
    return std::make_unique<nn::Conv2d<T, D>>(nn::Conv2dOptions{
        .in_channels = in, .out_channels = out, .kernel_size = k, .stride = stride, .padding = k / 2, .bias = bias});
  };
  auto bn = [](std::int64_t c) {
    return std::make_unique<nn::BatchNorm2d<T, D>>(nn::BatchNorm2dOptions{.num_features = c});
  };
  auto linear = [](std::int64_t in, std::int64_t out) {
    return std::make_unique<nn::Linear<T, D>>(nn::LinearOptions{.in_features = in, .out_features = out});
  };
  auto m = std::make_unique<Sequential<T, D>>();
  m->push_back(conv(3, 4, 3));
  m->push_back(bn(4));
  m->push_back(std::make_unique<nn::ReLU<T, D>>());
  auto body = std::make_unique<Sequential<T, D>>();
  body->push_back(conv(4, 4, 3));
  body->push_back(bn(4));
  body->push_back(std::make_unique<nn::ReLU<T, D>>());
  body->push_back(conv(4, 4, 3));
  body->push_back(bn(4));
  m->push_back(std::make_unique<nn::Residual<T, D>>(std::move(body)));
  m->push_back(std::make_unique<nn::ReLU<T, D>>());
  auto down = std::make_unique<Sequential<T, D>>();
  down->push_back(conv(4, 6, 3, 2, true));
  down->push_back(bn(6));
  down->push_back(std::make_unique<nn::SiLU<T, D>>());
  down->push_back(conv(6, 6, 3));
  down->push_back(bn(6));
  auto shortcut = std::make_unique<Sequential<T, D>>();
  shortcut->push_back(conv(4, 6, 1, 2));
  shortcut->push_back(bn(6));
  m->push_back(std::make_unique<nn::Residual<T, D>>(std::move(down), std::move(shortcut)));
  m->push_back(std::make_unique<nn::Tanh<T, D>>());
  m->push_back(std::make_unique<nn::Dropout<T, D>>(nn::DropoutOptions{.p = dropout_p}));
  m->push_back(std::make_unique<nn::Flatten<T, D>>());
  m->push_back(linear(6 * 4 * 4, 5));
  m->push_back(std::make_unique<nn::Sigmoid<T, D>>());
  auto head = std::make_unique<Sequential<T, D>>();
  head->push_back(std::make_unique<nn::Identity<T, D>>());
  head->push_back(linear(5, 3));
  m->push_back(std::move(head));
  return m;
}

}  // namespace ddp::test
