// nn::OpsModule: an op-written module mixed both ways with explicit layers (Conv2d, BatchNorm2d, ReLU) equals
// the same model built from explicit layers only, also inside nn::Residual; tied weights and a block applied twice
// against central finite differences, each parameter's grad-ready hook counted once per backward; the errors.
// Float64.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ddp/autograd/autograd.hpp>
#include <ddp/nn/batchnorm2d.hpp>
#include <ddp/nn/conv2d.hpp>
#include <ddp/nn/ops_module.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/residual_wrapper.hpp>
#include <ddp/nn/sequential.hpp>

#include "unit/autograd/gradcheck.hpp"

namespace test_ops_module {
using namespace ddp;
namespace ag = ddp::autograd;
using ddp::test::gradcheck_support::rand;
using ddp::test::gradcheck_support::Td;
using Conv = nn::Conv2d<double, Cpu>;
using BN = nn::BatchNorm2d<double, Cpu>;

// relu then a 3x3 convolution (padding 1) with its own weight and bias: an op-written layer.
class ReluConv : public nn::OpsModule<double, Cpu> {
 public:
  ReluConv(std::int64_t cin, std::int64_t cout)
      : w_(register_parameter("weight", Shape{cout, 3, 3, cin}, nn::Layout::Krsc)),
        b_(register_parameter("bias", Shape{cout})) {}
  std::string describe() const override { return "ReluConv"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    return ag::conv2d(ag::relu(x), g.param(w_), g.param(b_), {.padding = {1, 1}});
  }

 private:
  nn::Parameter<double, Cpu>& w_;
  nn::Parameter<double, Cpu>& b_;
};

// The other direction: explicit Conv2d and BatchNorm2d children called from ops, then relu and an op conv.
class ConvBnThenOps : public nn::OpsModule<double, Cpu> {
 public:
  explicit ConvBnThenOps(std::int64_t c)
      : conv_(register_module(
            "conv", std::make_unique<Conv>(nn::Conv2dOptions{.in_channels = 3, .out_channels = c, .padding = 1}))),
        bn_(register_module("bn", std::make_unique<BN>(nn::BatchNorm2dOptions{.num_features = c}))),
        w_(register_parameter("weight", Shape{c, 3, 3, c}, nn::Layout::Krsc)),
        b_(register_parameter("bias", Shape{c})) {}
  std::string describe() const override { return "ConvBnThenOps"; }
  bool call_conv_twice = false;
  bool conv_weight_as_param = false;  // also use conv's weight through g.param

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    Var h = g(bn_, g(conv_, x));
    if (call_conv_twice) h = g(conv_, x);
    if (conv_weight_as_param) h = h + ag::sum(g.param(conv_.weight()));
    return ag::conv2d(ag::relu(h), g.param(w_), g.param(b_), {.padding = {1, 1}});
  }

 private:
  Conv& conv_;
  BN& bn_;
  nn::Parameter<double, Cpu>& w_;
  nn::Parameter<double, Cpu>& b_;
};

// Explicit layers only: conv, bn, relu, conv.
std::unique_ptr<nn::Sequential<double, Cpu>> explicit_model(std::int64_t c) {
  auto s = std::make_unique<nn::Sequential<double, Cpu>>();
  s->push_back(std::make_unique<Conv>(nn::Conv2dOptions{.in_channels = 3, .out_channels = c, .padding = 1}));
  s->push_back(std::make_unique<BN>(nn::BatchNorm2dOptions{.num_features = c}));
  s->push_back(std::make_unique<nn::ReLU<double, Cpu>>());
  s->push_back(std::make_unique<Conv>(nn::Conv2dOptions{.in_channels = c, .out_channels = c, .padding = 1}));
  return s;
}

// Sets every parameter of m, in parameters() order, from a seeded stream (equal orders give equal models).
void fill_params(nn::Module<double, Cpu>& m, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto* p : m.parameters()) {
    Td t = rand(rng, p->shape(), -0.5, 0.5);
    std::copy(t.data(), t.data() + t.numel(), p->value().data());
  }
}

double max_diff(const Tensor<double, Cpu>& a, const Tensor<double, Cpu>& b) {
  REQUIRE(a.shape() == b.shape());
  double d = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::abs(a.data()[i] - b.data()[i]));
  return d;
}

struct Result {
  Td y, dx;
  std::vector<Td> grads;
};
Result run(nn::Module<double, Cpu>& m, const Td& x, const Td& dy) {
  Exec<Cpu> exec;
  m.zero_grad();
  Result r{.y = m.forward(exec, x.cview())};
  r.dx = m.backward(exec, dy.cview());
  for (auto* p : m.parameters()) r.grads.push_back(p->grad().clone());
  return r;
}

void expect_same(const Result& a, const Result& b) {
  CHECK(max_diff(a.y, b.y) < 1e-12);
  CHECK(max_diff(a.dx, b.dx) < 1e-12);
  REQUIRE(a.grads.size() == b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    CAPTURE(i);
    CHECK(max_diff(a.grads[i], b.grads[i]) < 1e-12);
  }
}

// Tied weights and a block used twice. Twice: x + tanh(x A^T). Tied: x -> linear(x, W) -> tanh -> block twice
// -> linear(., W^T): W (H, C) is used by the first and the last op, A by both applications of the block.
class Twice : public nn::OpsModule<double, Cpu> {
 public:
  explicit Twice(std::int64_t h) : a_(register_parameter("a", Shape{h, h})) {}
  std::string describe() const override { return "Twice"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override { return x + ag::tanh(ag::linear(x, g.param(a_))); }

 private:
  nn::Parameter<double, Cpu>& a_;
};
class Tied : public nn::OpsModule<double, Cpu> {
 public:
  Tied(std::int64_t c, std::int64_t h)
      : w_(register_parameter("w", Shape{h, c})), block_(register_module("block", std::make_unique<Twice>(h))) {}
  std::string describe() const override { return "Tied"; }
  nn::Parameter<double, Cpu>* foreign = nullptr;  // set: forward uses a parameter of another module

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    Var w = g.param(foreign ? *foreign : w_);
    Var h = ag::tanh(ag::linear(x, w));
    h = g(block_, g(block_, h));
    return ag::linear(h, ag::transpose(g.param(w_), 0, 1));
  }

 private:
  nn::Parameter<double, Cpu>& w_;
  Twice& block_;
};

// <m(x), R> for the finite differences.
double dot_out(nn::Module<double, Cpu>& m, const Td& x, const Td& r) {
  Exec<Cpu> exec;
  Td y = m.forward(exec, x.cview());
  double s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += y.data()[i] * r.data()[i];
  return s;
}

TEST_CASE(
    "OpsModule inside Sequential with Conv2d/BatchNorm2d, and Conv2d/BatchNorm2d inside an OpsModule, equal "
    "the explicit model") {
  std::mt19937_64 rng(71);
  const Td x = rand(rng, Shape{2, 5, 4, 3}), dy = rand(rng, Shape{2, 5, 4, 4});
  auto ref = explicit_model(4);
  fill_params(*ref, 1);
  const Result want = run(*ref, x, dy);

  nn::Sequential<double, Cpu> ops_inside;  // conv, bn, then the op-written relu + conv
  ops_inside.push_back(std::make_unique<Conv>(nn::Conv2dOptions{.in_channels = 3, .out_channels = 4, .padding = 1}));
  ops_inside.push_back(std::make_unique<BN>(nn::BatchNorm2dOptions{.num_features = 4}));
  ops_inside.push_back(std::make_unique<ReluConv>(4, 4));
  fill_params(ops_inside, 1);
  CHECK(ops_inside.state_dict_keys() == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                                                 "1.running_mean", "1.running_var",
                                                                 "1.num_batches_tracked", "2.weight", "2.bias"});
  expect_same(run(ops_inside, x, dy), want);

  ConvBnThenOps layers_inside(4);  // op-written, calling the explicit conv and bn
  fill_params(layers_inside, 1);
  CHECK(layers_inside.state_dict_keys() == std::vector<std::string>{"weight", "bias", "conv.weight", "conv.bias",
                                                                    "bn.weight", "bn.bias", "bn.running_mean",
                                                                    "bn.running_var", "bn.num_batches_tracked"});
  // parameters() lists its own (the op conv) first, then the children's: parameter i is the reference's from[i].
  const std::vector<std::size_t> from{4, 5, 0, 1, 2, 3};
  auto ps = layers_inside.parameters();
  auto rp = ref->parameters();
  std::vector<Td> reordered;
  for (std::size_t i = 0; i < from.size(); ++i) {
    std::copy(rp[from[i]]->value().data(), rp[from[i]]->value().data() + rp[from[i]]->numel(), ps[i]->value().data());
    reordered.push_back(want.grads[from[i]].clone());
  }
  const Result got = run(layers_inside, x, dy);
  expect_same(got, Result{.y = want.y.clone(), .dx = want.dx.clone(), .grads = std::move(reordered)});
  MESSAGE("mixed models: max |y - y_explicit| ", max_diff(got.y, want.y), ", max |dx - dx_explicit| ",
          max_diff(got.dx, want.dx));
}

TEST_CASE("Residual around an OpsModule equals Residual around the explicit layers") {
  std::mt19937_64 rng(74);
  const Td x = rand(rng, Shape{2, 4, 3, 4}), dy = rand(rng, Shape{2, 4, 3, 4});
  auto body = std::make_unique<nn::Sequential<double, Cpu>>();
  body->push_back(std::make_unique<nn::ReLU<double, Cpu>>());
  body->push_back(std::make_unique<Conv>(nn::Conv2dOptions{.in_channels = 4, .out_channels = 4, .padding = 1}));
  nn::Residual<double, Cpu> ref(std::move(body));
  nn::Residual<double, Cpu> ops(std::make_unique<ReluConv>(4, 4));
  fill_params(ref, 3);
  fill_params(ops, 3);
  expect_same(run(ops, x, dy), run(ref, x, dy));
}

TEST_CASE("tied weights and a block applied twice: gradients match finite differences, each hook fires once") {
  std::mt19937_64 rng(72);
  Tied m(3, 4);
  fill_params(m, 2);
  std::map<std::string, int> fired;
  m.set_grad_ready_hook([&](nn::Parameter<double, Cpu>& p) { ++fired[p.name()]; });
  const Td x = rand(rng, Shape{2, 3}), r = rand(rng, Shape{2, 3});
  Exec<Cpu> exec;
  m.zero_grad();
  m.forward(exec, x.cview());
  m.backward(exec, r.cview());
  CHECK(fired == std::map<std::string, int>{{"w", 1}, {"block.a", 1}});
  // A second backward accumulates (torch's .grad): once more each.
  m.forward(exec, x.cview());
  m.backward(exec, r.cview());
  CHECK(fired == std::map<std::string, int>{{"w", 2}, {"block.a", 2}});

  m.zero_grad();
  m.forward(exec, x.cview());
  const Td dx = m.backward(exec, r.cview());
  const double eps = 1e-6;
  double worst = 0;
  for (auto* p : m.parameters()) {
    for (std::int64_t i = 0; i < p->numel(); ++i) {
      double& v = p->value().data()[i];
      const double keep = v;
      v = keep + eps;
      const double up = dot_out(m, x, r);
      v = keep - eps;
      const double down = dot_out(m, x, r);
      v = keep;
      const double num = (up - down) / (2 * eps), ana = p->grad().data()[i];
      INFO(p->name(), "[", i, "]: analytic ", ana, " numeric ", num);
      CHECK(std::abs(ana - num) <= 1e-7 + 1e-6 * std::abs(num));
      worst = std::max(worst, std::abs(ana - num));
    }
  }
  Td xp = x.clone();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    xp.data()[i] = x.data()[i] + eps;
    const double up = dot_out(m, xp, r);
    xp.data()[i] = x.data()[i] - eps;
    const double down = dot_out(m, xp, r);
    xp.data()[i] = x.data()[i];
    const double num = (up - down) / (2 * eps);
    CHECK(std::abs(dx.data()[i] - num) <= 1e-7 + 1e-6 * std::abs(num));
    worst = std::max(worst, std::abs(dx.data()[i] - num));
  }
  MESSAGE("tied weights, block applied twice: max |analytic - numeric| ", worst);
}

// docs/GUIDE.md section 9's example, verbatim (float).
class Block : public nn::OpsModule<float, Cpu> {
 public:
  explicit Block(std::int64_t c)
      : conv1_(register_module("conv1", std::make_unique<nn::Conv2d<float, Cpu>>(
                                            nn::Conv2dOptions{.in_channels = c, .out_channels = c, .padding = 1}))),
        w_(register_parameter("weight", Shape{c, 3, 3, c}, nn::Layout::Krsc)) {
    const double bound = nn::fan_in_bound(9 * c);  // as Conv2d's default; a registered parameter starts at zero
    nn::init_uniform(w_, -bound, bound);
  }
  std::string describe() const override { return "Block"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    Var h = ag::relu(g(conv1_, x));  // an explicit layer called from ops
    return ag::relu(x + ag::conv2d(h, g.param(w_), {}, {.padding = {1, 1}}));
  }

 private:
  nn::Conv2d<float, Cpu>& conv1_;
  nn::Parameter<float, Cpu>& w_;
};

TEST_CASE("the GUIDE's OpsModule example: in a Sequential, every parameter reported once per backward") {
  nn::Sequential<float, Cpu> model;
  model.push_back(std::make_unique<Block>(2));
  model.push_back(std::make_unique<Block>(2));
  for (auto* p : model.parameters())
    for (std::int64_t i = 0; i < p->numel(); ++i) p->value().data()[i] = 0.1f * float((i * 7) % 5) - 0.2f;
  std::map<std::string, int> fired;
  model.set_grad_ready_hook([&](nn::Parameter<float, Cpu>& p) { ++fired[p.name()]; });
  Exec<Cpu> exec;
  const auto x = Tensor<float, Cpu>::full({1, 3, 3, 2}, 0.5f);
  const Tensor<float, Cpu> y = model.forward(exec, x.cview());
  const Tensor<float, Cpu> dx = model.backward(exec, y.cview());
  CHECK(dx.shape() == x.shape());
  CHECK(fired == std::map<std::string, int>{{"0.weight", 1},
                                            {"0.conv1.weight", 1},
                                            {"0.conv1.bias", 1},
                                            {"1.weight", 1},
                                            {"1.conv1.weight", 1},
                                            {"1.conv1.bias", 1}});
}

TEST_CASE("OpsModule errors name the module and what to do") {
  std::mt19937_64 rng(73);
  Exec<Cpu> exec;
  Tied m(3, 4);
  const Td x = rand(rng, Shape{2, 3});
  CHECK_THROWS_WITH_AS(m.backward(exec, x.cview()),
                       doctest::Contains("backward of module '<root>' (Tied) called without a preceding forward"),
                       ValueError);
  Tied other(3, 4);
  m.foreign = &other.parameters()[0][0];
  CHECK_THROWS_WITH_AS(m.forward(exec, x.cview()),
                       doctest::Contains("forward_ops uses parameter 'w', which is not in this module's subtree"),
                       ValueError);
  ConvBnThenOps twice(4);
  twice.call_conv_twice = true;
  const Td img = rand(rng, Shape{1, 3, 3, 3});
  CHECK_THROWS_WITH_AS(
      twice.forward(exec, img.cview()),
      doctest::Contains("calls module 'conv' (Conv2d(3, 4, kernel_size=3, stride=1, padding=1)) a second "
                        "time in one forward; it is an explicit layer"),
      ValueError);
  ConvBnThenOps both(4);
  both.conv_weight_as_param = true;
  CHECK_THROWS_WITH_AS(both.forward(exec, img.cview()),
                       doctest::Contains("parameter 'conv.weight' is used both through g.param() and by the explicit "
                                         "layer that owns it"),
                       ValueError);
}

}  // namespace test_ops_module
