// kernels: bad inputs are ValueErrors whose messages name the op, the tensor, the shapes and the fix.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/tensor.hpp>

using ddp::Cpu;
using ddp::Exec;
using ddp::Tensor;
using K = ddp::Kernels<Cpu>;
namespace kn = ddp::kernels;
using F = Tensor<float, Cpu>;

TEST_SUITE("kernels") {
  TEST_CASE("conv2d: wrong input channels, empty batch, wrong output shape, window too large") {
    Exec<Cpu> e;
    auto w = F::zeros({8, 3, 3, 3});
    auto x = F::zeros({2, 5, 5, 4}), y = F::zeros({2, 3, 3, 8});
    CHECK_THROWS_WITH_AS(
        K::conv2d_forward(e, kn::Conv2dForwardArgs<float, Cpu>{.x = x.view(), .w = w.view(), .y = y.view()}),
        "ddp: conv2d_forward: input has 4 channels but the weight (8, 3, 3, 3) expects 3 (x is NHWC (2, 5, 5, 4); is "
        "the input NCHW?)",
        ddp::ValueError);
    auto x0 = F::zeros({0, 5, 5, 3});
    CHECK_THROWS_WITH_AS(
        K::conv2d_forward(e, kn::Conv2dForwardArgs<float, Cpu>{.x = x0.view(), .w = w.view(), .y = y.view()}),
        "ddp: conv2d_forward: batch of zero images (x has shape (0, 5, 5, 3))", ddp::ValueError);
    auto x3 = F::zeros({2, 5, 5, 3}), y5 = F::zeros({2, 5, 5, 8});
    CHECK_THROWS_WITH_AS(
        K::conv2d_forward(e, kn::Conv2dForwardArgs<float, Cpu>{.x = x3.view(), .w = w.view(), .y = y5.view()}),
        "ddp: conv2d_forward: output y has shape (2, 5, 5, 8) but must be (2, 3, 3, 8)", ddp::ValueError);
    auto tiny = F::zeros({1, 2, 2, 3});
    CHECK_THROWS_WITH_AS(
        K::conv2d_forward(e, kn::Conv2dForwardArgs<float, Cpu>{.x = tiny.view(), .w = w.view(), .y = y.view()}),
        "ddp: conv2d_forward: a 3x3 kernel (dilation 1x1, padding 0x0) does not fit the 2x2 input", ddp::ValueError);
    auto nchw = F::zeros({2, 3, 5});
    CHECK_THROWS_WITH_AS(
        K::conv2d_forward(e, kn::Conv2dForwardArgs<float, Cpu>{.x = nchw.view(), .w = w.view(), .y = y.view()}),
        "ddp: conv2d_forward: input x must be NHWC (N, H, W, C_in), got shape (2, 3, 5)", ddp::ValueError);
    auto dy = F::zeros({2, 3, 3, 8}), dw = F::zeros({8, 3, 3, 2});
    CHECK_THROWS_WITH_AS(
        K::conv2d_backward(
            e, kn::Conv2dBackwardArgs<float, Cpu>{.x = x3.view(), .w = w.view(), .dy = dy.view(), .dw = dw.view()}),
        "ddp: conv2d_backward: weight gradient dw has shape (8, 3, 3, 2) but must be (8, 3, 3, 3)", ddp::ValueError);
  }

  TEST_CASE("batchnorm: channel mismatch and a single value per channel in training") {
    Exec<Cpu> e;
    auto x = F::zeros({1, 1, 1, 4}), y = F::zeros({1, 1, 1, 4});
    auto c4 = F::zeros({4}), c4b = F::zeros({4}), rm = F::zeros({4}), rv = F::zeros({4}), sm = F::zeros({4}),
         si = F::zeros({4}), c3 = F::zeros({3});
    kn::BatchNormForwardArgs<float, Cpu> a{.x = x.view(),
                                           .gamma = c4.view(),
                                           .beta = c4b.view(),
                                           .running_mean = rm.view(),
                                           .running_var = rv.view(),
                                           .y = y.view(),
                                           .save_mean = sm.view(),
                                           .save_invstd = si.view()};
    CHECK_THROWS_WITH_AS(K::batchnorm_forward(e, a),
                         "ddp: batchnorm_forward: training needs more than 1 value per channel, got x of shape (1, 1, "
                         "1, 4); use a batch larger than 1 or eval mode",
                         ddp::ValueError);
    a.training = false;
    CHECK_NOTHROW(K::batchnorm_forward(e, a));
    a.gamma = c3.view();
    CHECK_THROWS_WITH_AS(K::batchnorm_forward(e, a),
                         "ddp: batchnorm_forward: gamma (weight) has shape (3) but must be (4)", ddp::ValueError);
  }

  TEST_CASE("cross-entropy: labels out of range name the label, the sample and the class count") {
    Exec<Cpu> e;
    auto z = F::zeros({3, 5});
    auto labels = Tensor<std::int64_t, Cpu>::from({3}, {0, 5, 1});
    CHECK_THROWS_WITH_AS(
        K::cross_entropy(e, kn::CrossEntropyArgs<float, Cpu>{.logits = z.view(), .labels = labels.view()}),
        "ddp: cross_entropy: label 5 of sample 1 is out of range for 5 classes (labels must be in [0, 4]); check the "
        "dataset's labels against --num-classes",
        ddp::ValueError);
    labels(1) = -1;
    CHECK_THROWS_WITH_AS(
        K::cross_entropy(e, kn::CrossEntropyArgs<float, Cpu>{.logits = z.view(), .labels = labels.view()}),
        doctest::Contains("label -1 of sample 1 is out of range for 5 classes"), ddp::ValueError);
    auto short_labels = Tensor<std::int64_t, Cpu>::from({2}, {0, 1});
    CHECK_THROWS_WITH_AS(
        K::cross_entropy(e, kn::CrossEntropyArgs<float, Cpu>{.logits = z.view(), .labels = short_labels.view()}),
        "ddp: cross_entropy: labels has shape (2) but must be (3)", ddp::ValueError);
    auto ok = Tensor<std::int64_t, Cpu>::from({3}, {0, 1, 2});
    CHECK_THROWS_WITH_AS(
        K::cross_entropy(
            e, kn::CrossEntropyArgs<float, Cpu>{.logits = z.view(), .labels = ok.view(), .label_smoothing = 1.5}),
        "ddp: cross_entropy: label_smoothing must be in [0, 1], got 1.5", ddp::ValueError);
    auto x = F::zeros({2, 2}), t = F::zeros({2, 3});
    CHECK_THROWS_WITH_AS(K::mse(e, kn::MseArgs<float, Cpu>{.x = x.view(), .target = t.view()}),
                         "ddp: mse: target has shape (2, 3) but must be (2, 2)", ddp::ValueError);
  }

  TEST_CASE("linear, pooling, element-wise and SGD argument errors") {
    Exec<Cpu> e;
    auto x = F::zeros({4, 6}), w = F::zeros({3, 5}), y = F::zeros({4, 3});
    CHECK_THROWS_WITH_AS(
        K::linear_forward(e, kn::LinearForwardArgs<float, Cpu>{.x = x.view(), .w = w.view(), .y = y.view()}),
        "ddp: linear_forward: input has 6 features but the weight (3, 5) expects 5", ddp::ValueError);
    auto img = F::zeros({1, 4, 4, 2}), out = F::zeros({1, 2, 2, 2});
    CHECK_THROWS_WITH_AS(
        K::max_pool2d_forward(
            e,
            kn::MaxPool2dForwardArgs<float, Cpu>{
                .x = img.view(), .y = out.view(), .kernel = {2, 2}, .stride = {2, 2}, .padding = {2, 2}}),
        "ddp: max_pool2d: kernel (2, 2) and stride (2, 2) must be >= 1 and padding (2, 2) at most "
        "half the kernel",
        ddp::ValueError);
    auto wrong = F::zeros({2, 1, 1, 2});
    CHECK_THROWS_WITH_AS(K::adaptive_avg_pool2d_forward(
                             e, kn::AdaptiveAvgPool2dForwardArgs<float, Cpu>{.x = img.view(), .y = wrong.view()}),
                         "ddp: adaptive_avg_pool2d_forward: output (2, 1, 1, 2) must have the input's N and C (input "
                         "(1, 4, 4, 2)) and H_out, W_out >= 1",
                         ddp::ValueError);
    auto a = F::zeros({2, 3}), b = F::zeros({3, 2});
    CHECK_THROWS_WITH_AS(K::add<float>(e, a.view(), b.view(), a.view()),
                         "ddp: add: second operand has shape (3, 2) but must be (2, 3)", ddp::ValueError);
    auto p = F::zeros({4}), g = F::zeros({4}), buf = F::zeros({4});
    CHECK_THROWS_WITH_AS(
        K::sgd_step(
            e,
            kn::SgdArgs<float, Cpu>{
                .param = p.view(), .grad = g.view(), .momentum_buffer = buf.view(), .momentum = 0.0, .nesterov = true}),
        "ddp: sgd_step: nesterov momentum requires momentum > 0 and dampening 0, got momentum 0 and dampening 0",
        ddp::ValueError);
    CHECK_THROWS_WITH_AS(K::sgd_step(e, kn::SgdArgs<float, Cpu>{.param = p.view(), .grad = g.view(), .momentum = 0.9}),
                         "ddp: sgd_step: momentum_buffer has shape (0) but must be (4)", ddp::ValueError);
  }
}

TEST_SUITE("kernels") {
  TEST_CASE("max-pool ties go to the first maximum in row-major window order, as in PyTorch") {
    Exec<Cpu> e;
    auto x = F::full({1, 2, 2, 1}, 1.f);
    auto y = F::empty({1, 1, 1, 1}), dy = F::full({1, 1, 1, 1}, 3.f), dx = F::empty({1, 2, 2, 1});
    auto am = Tensor<std::int32_t, Cpu>::empty({1, 1, 1, 1});
    K::max_pool2d_forward(
        e,
        kn::MaxPool2dForwardArgs<float, Cpu>{
            .x = x.view(), .y = y.view(), .argmax = am.view(), .kernel = {2, 2}, .stride = {2, 2}, .padding = {0, 0}});
    CHECK(am(0, 0, 0, 0) == 0);
    K::max_pool2d_backward(
        e, kn::MaxPool2dBackwardArgs<float, Cpu>{.dy = dy.view(), .argmax = am.view(), .dx = dx.view()});
    CHECK(dx(0, 0, 0, 0) == 3.f);
    CHECK(dx(0, 1, 1, 0) == 0.f);
  }
}

TEST_SUITE("kernels") {
  TEST_CASE("NaN propagates through relu and max-pool, as in PyTorch") {
    Exec<Cpu> e;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto x = F::from({1, 2, 2, 1}, {1.f, nan, -2.f, 5.f});
    auto r = F::empty(x.shape());
    K::relu_forward<float>(e, x.view(), r.view());
    CHECK(r(0, 0, 0, 0) == 1.f);
    CHECK(std::isnan(r(0, 0, 1, 0)));
    CHECK(r(0, 1, 0, 0) == 0.f);
    auto y = F::empty({1, 1, 1, 1});
    auto am = Tensor<std::int32_t, Cpu>::empty({1, 1, 1, 1});
    K::max_pool2d_forward(e,
                          kn::MaxPool2dForwardArgs<float, Cpu>{
                              .x = x.view(), .y = y.view(), .argmax = am.view(), .kernel = {2, 2}, .padding = {0, 0}});
    CHECK(std::isnan(y(0, 0, 0, 0)));
    CHECK(am(0, 0, 0, 0) == 1);
  }
}
