// Modules: gradient hooks and accumulation, finite differences through a whole ResNet (double), and the
// errors for bad inputs (messages pinned).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <ddp/nn/conv2d.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/maxpool2d.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/nn/sequential.hpp>
#include <ddp/tensor/random.hpp>

#include "random_tensor.hpp"

using namespace ddp;

namespace {

template <class T>
double loss_of(Exec<Cpu>& exec, nn::ResNet<T, Cpu>& m, const Tensor<T, Cpu>& x, const Tensor<std::int64_t, Cpu>& y) {
  auto logits = m.forward(exec, x.cview());
  nn::CrossEntropyLoss<T, Cpu> ce;
  return ce.forward(exec, logits.cview(), y.cview());
}

}  // namespace

TEST_SUITE("nn") {
  TEST_CASE("every parameter reports its gradient once per backward, last layer first") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    nn::ResNet<float, Cpu> m({.arch = "resnet18", .num_classes = 4, .width = 4});
    std::vector<std::string> order;
    m.set_grad_ready_hook([&](nn::Parameter<float, Cpu>& p) { order.push_back(p.name()); });
    auto x = ddp::test::randn<float>({2, 32, 32, 3}, 1);
    m.zero_grad();
    auto y = m.forward(exec, x.cview());
    m.backward(exec, Tensor<float, Cpu>::full({2, 4}, 0.25f).cview());
    const auto params = m.parameters();
    REQUIRE(order.size() == params.size());
    CHECK(order.front() == "fc.weight");
    CHECK(order.back() == "conv1.weight");
    for (auto* p : params) CHECK(p->grad_ready_count() == 1);
  }

  TEST_CASE("residual blocks report gradients in the fused order on every device: last bn, downsample, main path") {
    // nn/residual.hpp: the last bn's backward_act yields the skip path's gradient, so its parameters come
    // first, then the downsample's, then the main path from the last conv back (DDP's first-step buckets
    // follow this order; the GPU always ran it, the CPU since Kernels<Cpu> has batchnorm_act_*).
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    const nn::BlockOptions o{.inplanes = 4, .planes = 8, .stride = 2, .downsample = true};
    auto order_of = [&](nn::Module<float, Cpu>& m, Shape out) {
      std::vector<std::string> order;
      m.set_grad_ready_hook([&](nn::Parameter<float, Cpu>& p) { order.push_back(p.name()); });
      auto x = ddp::test::randn<float>({2, 6, 6, 4}, 3);
      auto y = m.forward(exec, x.cview());
      REQUIRE(y.shape() == out);
      m.backward(exec, ddp::test::randn<float>(out, 4).cview());
      return order;
    };
    nn::BasicBlock<float, Cpu> basic(o);
    CHECK(order_of(basic, {2, 3, 3, 8}) ==
          std::vector<std::string>{"bn2.weight", "bn2.bias", "downsample.1.weight", "downsample.1.bias",
                                   "downsample.0.weight", "conv2.weight", "bn1.weight", "bn1.bias", "conv1.weight"});
    nn::Bottleneck<float, Cpu> bottleneck(o);
    CHECK(order_of(bottleneck, {2, 3, 3, 32}) ==
          std::vector<std::string>{"bn3.weight", "bn3.bias", "downsample.1.weight", "downsample.1.bias",
                                   "downsample.0.weight", "conv3.weight", "bn2.weight", "bn2.bias", "conv2.weight",
                                   "bn1.weight", "bn1.bias", "conv1.weight"});
  }

  TEST_CASE("gradients accumulate until zero_grad, as in PyTorch") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    nn::ResNet<float, Cpu> m({.arch = "resnet18", .num_classes = 3, .width = 4});
    auto x = ddp::test::randn<float>({2, 32, 32, 3}, 2);
    const auto dy = Tensor<float, Cpu>::full({2, 3}, 0.5f);
    m.zero_grad();
    m.forward(exec, x.cview());
    m.backward(exec, dy.cview());
    auto* p = m.find_parameter("layer2.0.conv1.weight");
    CHECK_FALSE(p->grad_is_zero());
    auto once = p->grad().clone();
    m.forward(exec, x.cview());
    m.backward(exec, dy.cview());
    double max_diff = 0;
    for (std::int64_t i = 0; i < once.numel(); ++i)
      max_diff = std::max(max_diff, std::abs(static_cast<double>(p->grad().data()[i]) - 2.0 * once.data()[i]));
    CHECK(max_diff < 1e-5);
    m.zero_grad();
    CHECK(p->grad_is_zero());
    CHECK_FALSE(p->has_grad());  // torch's .grad is None; grad() keeps stale values (docs/decisions/0062)
    m.forward(exec, x.cview());
    m.backward(exec, dy.cview());
    double again = 0;  // the next backward overwrites: one backward's gradient, not three
    for (std::int64_t i = 0; i < once.numel(); ++i)
      again = std::max(again, std::abs(static_cast<double>(p->grad().data()[i]) - once.data()[i]));
    CHECK(again == 0.0);
  }

  TEST_CASE("finite differences through a whole resnet18 and resnet50 (double)") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    for (const char* arch : {"resnet18", "resnet50"}) {
      nn::ResNet<double, Cpu> m({.arch = arch, .num_classes = 5, .seed = 9, .width = 2});
      auto x = ddp::test::randn<double>({2, 64, 64, 3}, 3);
      auto y = Tensor<std::int64_t, Cpu>::from({2}, {1, 4});
      m.zero_grad();
      {
        auto logits = m.forward(exec, x.cview());
        nn::CrossEntropyLoss<double, Cpu> ce;
        ce.forward(exec, logits.cview(), y.cview());
        m.backward(exec, ce.backward(exec).cview());
      }
      const std::vector<std::pair<std::string, std::int64_t>> probes = {
          {"conv1.weight", 5}, {"bn1.weight", 1}, {"layer1.0.conv2.weight", 3}, {"layer2.0.downsample.0.weight", 1},
          {"layer3.1.bn1.bias", 0}, {"layer4.0.conv1.weight", 7}, {"fc.weight", 2}, {"fc.bias", 3}};
      for (const auto& [name, i] : probes) {
        auto* p = m.find_parameter(name);
        REQUIRE(p != nullptr);
        const double analytic = p->grad().data()[i];
        double& v = p->value().data()[i];
        const double h = 1e-8, saved = v;  // small: a larger step crosses ReLU kinks of near-zero inputs
        v = saved + h;
        const double up = loss_of(exec, m, x, y);
        v = saved - h;
        const double down = loss_of(exec, m, x, y);
        v = saved;
        const double numeric = (up - down) / (2 * h);
        INFO(arch << " " << name << "[" << i << "]: analytic " << analytic << " numeric " << numeric);
        CHECK(std::abs(analytic - numeric) <= 1e-6 + 1e-5 * std::abs(numeric));
      }
    }
  }

  TEST_CASE("Conv2d and MaxPool2d default as torch.nn's: Conv2d has a bias, MaxPool2d's stride is its kernel size") {
    // torch 1.13: nn.Conv2d(3, 8, 3) has weight and bias; nn.MaxPool2d(2) on (1, 3, 8, 8) gives (1, 3, 4, 4) and
    // nn.MaxPool2d(3) gives (1, 3, 2, 2) (stride 3, padding 0); nn.MaxPool2d() is a TypeError (no kernel size).
    nn::Conv2d<float, Cpu> conv(nn::Conv2dOptions{.in_channels = 3, .out_channels = 8});
    CHECK(conv.state_dict_keys() == std::vector<std::string>{"weight", "bias"});
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    auto x = Tensor<float, Cpu>::zeros({1, 8, 8, 3});
    nn::MaxPool2d<float, Cpu> two(nn::MaxPool2dOptions{.kernel_size = 2}), three(nn::MaxPool2dOptions{.kernel_size = 3});
    CHECK(two.forward(exec, x.cview()).shape() == Shape{1, 4, 4, 3});
    CHECK(three.forward(exec, x.cview()).shape() == Shape{1, 2, 2, 3});
    CHECK(three.describe() == "MaxPool2d(kernel_size=3, stride=3, padding=0)");
    using MaxPool = nn::MaxPool2d<float, Cpu>;
    CHECK_THROWS_AS(MaxPool(nn::MaxPool2dOptions{}), ValueError);
  }

  TEST_CASE("bad inputs are ValueErrors naming the module") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    nn::ResNet<float, Cpu> m({.arch = "resnet18", .num_classes = 10});
    auto nchw = Tensor<float, Cpu>::zeros({2, 3, 32, 32});
    CHECK_THROWS_WITH_AS(m.forward(exec, nchw.cview()),
                         "ddp: module '<root>' (ResNet(resnet18, num_classes=10)): input has 32 channels but the model "
                         "takes 3 (input shape (2, 3, 32, 32); images must be NHWC, channels last: is the input NCHW?)",
                         ValueError);
    auto empty = Tensor<float, Cpu>::zeros({0, 32, 32, 3});
    CHECK_THROWS_WITH_AS(m.forward(exec, empty.cview()),
                         "ddp: module '<root>' (ResNet(resnet18, num_classes=10)): batch of zero images (input shape "
                         "(0, 32, 32, 3)); check --batch-size and the loader",
                         ValueError);
    CHECK_THROWS_WITH_AS(m.backward(exec, Tensor<float, Cpu>::zeros({2, 10}).cview()),
                         "ddp: backward of module '<root>' (ResNet(resnet18, num_classes=10)) called without a "
                         "preceding forward (or twice for one forward); call forward(x) before each backward(dy)",
                         ValueError);

    // Two modules whose shapes do not fit: the second conv expects 16 channels, the first makes 8.
    nn::Sequential<float, Cpu> seq;
    seq.push_back(std::make_unique<nn::Conv2d<float, Cpu>>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 8}));
    seq.push_back(std::make_unique<nn::Conv2d<float, Cpu>>(nn::Conv2dOptions{.in_channels = 16, .out_channels = 4}));
    auto x = Tensor<float, Cpu>::zeros({1, 8, 8, 3});
    CHECK_THROWS_WITH_AS(seq.forward(exec, x.cview()),
                         "ddp: module '1' (Conv2d(16, 4, kernel_size=3, stride=1, padding=0)): input has 8 "
                         "channels but the layer expects 16 (input shape (1, 6, 6, 8), NHWC: channels last; is the "
                         "input NCHW, or the previous layer mis-sized?)",
                         ValueError);

    nn::CrossEntropyLoss<float, Cpu> ce;
    auto logits = Tensor<float, Cpu>::zeros({2, 10});
    auto labels = Tensor<std::int64_t, Cpu>::from({2}, {3, 10});
    CHECK_THROWS_WITH_AS(ce.forward(exec, logits.cview(), labels.cview()),
                         "ddp: cross_entropy: label 10 of sample 1 is out of range for 10 classes (labels must be in "
                         "[0, 9]); check the dataset's labels against --num-classes",
                         ValueError);
    auto short_labels = Tensor<std::int64_t, Cpu>::from({1}, {3});
    CHECK_THROWS_WITH_AS(ce.forward(exec, logits.cview(), short_labels.cview()),
                         "ddp: CrossEntropyLoss: 2 rows of logits (2, 10) but 1 labels; the batch and its labels must "
                         "match",
                         ValueError);
    CHECK_THROWS_AS(ce.value(exec, logits.cview(), short_labels.cview()), ValueError);
    // value(): the loss without a gradient (evaluation) -- uniform logits over 10 classes give ln 10.
    auto good = Tensor<std::int64_t, Cpu>::from({2}, {3, 9});
    CHECK(ce.value(exec, logits.cview(), good.cview()) == doctest::Approx(std::log(10.0)));
  }
}
