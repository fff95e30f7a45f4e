// The tape's bookkeeping: gradients summed over every use of a value, parameters reported once their gradient is
// final (in the order backward finishes with them), backward twice, no_grad, and the errors' messages.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <ddp/autograd/autograd.hpp>
#include <ddp/nn/parameter.hpp>

#include "unit/autograd/gradcheck.hpp"

namespace test_tape {
using namespace ddp;
using namespace ddp::autograd;
using namespace ddp::test::gradcheck_support;

// The message of the ValueError that f throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("autograd: a value used twice gets the summed gradient (y = x*x + x: dy/dx = 2x + 1)") {
  auto x = Vd::leaf(Td::from({3}, {-1.5, 0.25, 2.0}), true);
  auto y = sum(x * x + x);
  y.backward();
  for (std::int64_t i = 0; i < 3; ++i) CHECK(x.grad().data()[i] == doctest::Approx(2 * x.value().data()[i] + 1));
  CHECK(y.value().data()[0] == doctest::Approx(2.25 - 1.5 + 0.0625 + 0.25 + 4.0 + 2.0));
}

TEST_CASE("autograd: a weight used in two matmuls gets both contributions") {
  std::mt19937_64 rng(21);
  const Td x1 = rand(rng, {2, 3}), x2 = rand(rng, {4, 3}), w0 = rand(rng, {3, 2});
  auto w = Vd::leaf(w0.clone(), true);
  auto loss = sum(matmul(Vd::leaf(x1.clone()), w)) + sum(matmul(Vd::leaf(x2.clone()), w));
  loss.backward();
  // d/dW sum(X W) = X^T 1: column sums of x1 and x2, the same for every output column.
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 2; ++j) {
      double want = 0;
      for (int i = 0; i < 2; ++i) want += x1(i, k);
      for (int i = 0; i < 4; ++i) want += x2(i, k);
      CHECK(w.grad()(k, j) == doctest::Approx(want));
    }
  // And the same through gradcheck with a random seed (the weight is input 2, used twice).
  gradcheck("weight twice", {x1.clone(), x2.clone(), w0.clone()},
            [](std::vector<Vd>& v) {
              return sum(matmul(v[0], v[2]) * matmul(v[0], v[2])) + sum(autograd::tanh(matmul(v[1], v[2])));
            });
}

TEST_CASE("autograd: leaves accumulate over backward calls until zero_grad; retain_graph allows a second call") {
  auto x = Vd::leaf(Td::from({2}, {1.0, 3.0}), true);
  auto y = sum(x * 3.0);
  y.backward(true);
  y.backward();  // allowed: the first call retained the graph
  CHECK(x.grad()(0) == doctest::Approx(6.0));
  const std::string msg = error_of([&] { y.backward(); });
  CHECK(msg.find("second time") != std::string::npos);
  CHECK(msg.find("retain_graph") != std::string::npos);
  x.zero_grad();
  CHECK_FALSE(x.has_grad());
  sum(x * 3.0).backward();
  CHECK(x.grad()(1) == doctest::Approx(3.0));
}

TEST_CASE("autograd: backward twice without retain_graph throws") {
  auto x = Vd::leaf(Td::from({2}, {1.0, 3.0}), true);
  auto y = mean(exp(x));
  y.backward();
  const std::string msg = error_of([&] { y.backward(); });
  INFO(msg);
  CHECK(msg.find("backward through the graph a second time") != std::string::npos);
}

TEST_CASE("autograd: no_grad records nothing") {
  auto x = Vd::leaf(Td::from({2}, {1.0, 3.0}), true);
  Vd y;
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_enabled());
    y = sum(x * x);
  }
  CHECK(grad_enabled());
  CHECK_FALSE(y.requires_grad());
  CHECK(y.is_leaf());
  CHECK(y.node().inputs.empty());
  CHECK(y.value()() == doctest::Approx(10.0));
  CHECK(error_of([&] { y.backward(); }).find("does not require grad") != std::string::npos);
  CHECK_FALSE(x.has_grad());
}

TEST_CASE("autograd: errors name the op and both shapes") {
  auto a = Vd::leaf(Td::full({2, 3}, 1.0), true);
  auto b = Vd::leaf(Td::full({4}, 1.0), true);
  std::string msg = error_of([&] { (void)(a + b); });
  INFO(msg);
  CHECK(msg.find("add") != std::string::npos);
  CHECK(msg.find("(2, 3)") != std::string::npos);
  CHECK(msg.find("(4)") != std::string::npos);
  msg = error_of([&] { (void)matmul(a, Vd::leaf(Td::full({2, 2}, 1.0))); });
  CHECK(msg.find("matmul") != std::string::npos);
  CHECK(msg.find("(2, 2)") != std::string::npos);
  msg = error_of([&] { (a * 2.0).backward(); });
  CHECK(msg.find("one-element") != std::string::npos);
  CHECK(msg.find("mul") != std::string::npos);
  msg = error_of([&] { (a * 2.0).backward(Td::full({3, 2}, 1.0)); });
  CHECK(msg.find("(3, 2)") != std::string::npos);
  // A non-scalar output with a seed gradient is fine.
  auto y = a * 2.0;
  y.backward(Td::full({2, 3}, 0.5));
  CHECK(a.grad()(1, 2) == doctest::Approx(1.0));
}

TEST_CASE("autograd: Var::parameter writes nn::Parameter's gradient and reports it ready once, when final") {
  nn::Parameter<double, Cpu> first("first", {3, 2}), last("last", {2});
  std::mt19937_64 rng(5);
  const Td w0 = rand(rng, {3, 2}), b0 = rand(rng, {2}), x0 = rand(rng, {4, 3});
  for (int i = 0; i < 6; ++i) first.value().data()[i] = w0.data()[i];
  for (int i = 0; i < 2; ++i) last.value().data()[i] = b0.data()[i];
  std::vector<std::string> ready;
  first.set_grad_ready_hook([&](auto& p) { ready.push_back(p.name()); });
  last.set_grad_ready_hook([&](auto& p) { ready.push_back(p.name()); });
  // Reference gradients from plain leaves over copies of the same values.
  auto rw = Vd::leaf(w0.clone(), true), rb = Vd::leaf(b0.clone(), true);
  const auto model = [&x0](const Vd& w, const Vd& b) {
    auto h = tanh(matmul(Vd::leaf(x0.clone()), w));  // w used twice: here and below
    return mean((h + b) * (h + b)) + sum(w * w) * 0.1;
  };
  model(rw, rb).backward();

  Exec<Cpu> exec;
  auto pw = Vd::parameter(first, exec), pb = Vd::parameter(last, exec);
  CHECK(pw.value().data() == first.value().data());  // borrowed, not copied
  first.zero_grad();
  last.zero_grad();
  model(pw, pb).backward();
  CHECK(first.grad_ready_count() == 1);
  CHECK(last.grad_ready_count() == 1);
  // `last` is used only near the loss, so backward finishes with it before `first` (used at the start).
  REQUIRE(ready.size() == 2);
  CHECK(ready[0] == "last");
  CHECK(ready[1] == "first");
  for (int i = 0; i < 6; ++i) CHECK(first.grad().data()[i] == doctest::Approx(rw.grad().data()[i]));
  for (int i = 0; i < 2; ++i) CHECK(last.grad().data()[i] == doctest::Approx(rb.grad().data()[i]));
  CHECK_FALSE(pw.has_grad());  // handed over, not kept
  // A second backward adds into the parameter's gradient (no zero_grad in between), as torch's .grad.
  model(pw, pb).backward();
  for (int i = 0; i < 6; ++i) CHECK(first.grad().data()[i] == doctest::Approx(2 * rw.grad().data()[i]));
  CHECK(first.grad_ready_count() == 2);
}

TEST_CASE("autograd: detach cuts the graph; a GradSink on a plain leaf receives the final gradient once") {
  auto x = Vd::leaf(Td::from({2}, {2.0, -1.0}), true);
  auto y = sum(x * x.detach());  // d/dx = x.detach() only, not 2x
  y.backward();
  CHECK(x.grad()(0) == doctest::Approx(2.0));
  CHECK(x.grad()(1) == doctest::Approx(-1.0));
  Td dest(Shape{2});
  int done = 0;
  auto w = Vd::leaf(Td::from({2}, {0.5, 3.0}), true);
  w.set_grad_sink({.dest = [&dest] { return dest.view(); }, .done = [&done](Exec<Cpu>&) { ++done; }});
  sum(w * w + w * 3.0).backward();  // three uses of w: 2w + 3
  CHECK(done == 1);
  CHECK(dest(0) == doctest::Approx(4.0));
  CHECK(dest(1) == doctest::Approx(9.0));
  CHECK(error_of([&] { (w * 2.0).set_grad_sink({}); }).find("output of op mul") != std::string::npos);
}

}  // namespace test_tape
