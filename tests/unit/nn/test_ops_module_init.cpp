// A model written with ops whose weight was never initialised: the silent trap (a zero weight passes no gradient,
// the loss never moves) becomes one warning at the first forward naming the parameter and the fix; the fix,
// nn::init_normal / init_uniform from the default generator, draws what Generator(seed) draws after manual_seed.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include <ddp/autograd/autograd.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/nn/init.hpp>
#include <ddp/nn/ops_module.hpp>

#include "support/log_capture.hpp"

namespace test_ops_module_init {

using namespace ddp;
namespace ag = ddp::autograd;

// y = tanh(x W1^T) W1: one weight (16, 8) used twice (tied), left as register_parameter made it unless init.
class Tied : public nn::OpsModule<float, Cpu> {
 public:
  explicit Tied(bool init) : w_(register_parameter("w", Shape{16, 8})), b_(register_parameter("b", Shape{16})) {
    if (init) nn::init_normal(w_, 0.0, 0.5);
  }
  std::string describe() const override { return "Tied()"; }

 protected:
  Var forward_ops(Graph& g, const Var& x) override {
    return ag::matmul(ag::tanh(ag::linear(x, g.param(w_), g.param(b_))), g.param(w_));
  }

 private:
  nn::Parameter<float, Cpu>& w_;
  nn::Parameter<float, Cpu>& b_;
};

// Sum of |grad| over the model's parameters after one forward/backward of y against a target of ones.
double grad_mass(Tied& m) {
  Exec<Cpu> exec;
  auto x = Tensor<float, Cpu>::full({4, 8}, 0.3f);
  auto y = m.forward(exec, x.cview());
  auto dy = Tensor<float, Cpu>::full(y.shape(), -1.0f);  // d/dy of sum(1 - y): every output wants to grow
  for (auto* p : m.parameters()) p->zero_grad();
  m.backward(exec, dy.cview());
  double mass = 0.0;
  for (auto* p : m.parameters())
    for (std::int64_t i = 0; i < p->grad().numel(); ++i) mass += std::abs(static_cast<double>(p->grad().data()[i]));
  return mass;
}

TEST_CASE("ops module: a weight left at zero gets one warning naming it and the fix; an initialised one none") {
  {
    test::LogCapture log;
    Tied m(/*init=*/false);
    CHECK(grad_mass(m) == 0.0);  // the trap: nothing would ever train
    grad_mass(m);                // a second step: still one warning
    REQUIRE(log.lines().size() == 1);
    const std::string line = log.lines().front();
    CHECK(line.find("parameter 'w' (16, 8) is all zeros at the first forward") != std::string::npos);
    CHECK(line.find("nn::init_normal(p, 0.0, 0.02)") != std::string::npos);
    CHECK(line.find("'b'") == std::string::npos);  // a bias (rank 1) at zero is the usual start
  }
  {
    test::LogCapture log;
    manual_seed(1);
    Tied m(/*init=*/true);
    CHECK(grad_mass(m) > 0.0);
    CHECK(log.lines().empty());
  }
}

TEST_CASE("ops module: nn::init_normal and init_uniform without a generator draw from the default one") {
  nn::Parameter<float, Cpu> a("a", Shape{3, 5}, nn::Layout::Plain), b("b", Shape{3, 5}, nn::Layout::Plain);
  manual_seed(11);
  nn::init_normal(a, 0.0, 2.0);
  Generator gen(11);
  nn::init_normal(b, gen, 0.0, 2.0);
  CHECK(std::memcmp(a.value().data(), b.value().data(), a.value().bytes()) == 0);
  nn::init_uniform(a, -0.25, 0.25);  // continues the default generator, as the second draw of gen does
  nn::init_uniform(b, gen, -0.25, 0.25);
  CHECK(std::memcmp(a.value().data(), b.value().data(), a.value().bytes()) == 0);
  for (std::int64_t i = 0; i < a.value().numel(); ++i) CHECK(std::abs(a.value().data()[i]) <= 0.25f);
}

}  // namespace test_ops_module_init
