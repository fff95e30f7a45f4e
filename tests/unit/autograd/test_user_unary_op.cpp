// A user's own element-wise op (the GUIDE's "Your own activation"): one struct of the form of
// kernels/unary_ops.hpp becomes a module (nn::Activation) and an autograd op (autograd::unary);
// both checked against the closed form and central finite differences in float64.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <ddp/autograd/autograd.hpp>
#include <ddp/nn/activation.hpp>

#include "unit/autograd/gradcheck.hpp"

namespace test_user_unary_op {
using namespace ddp;
using namespace ddp::test::gradcheck_support;

// softplus(x) = log(1 + exp(x)); its derivative is sigmoid(x).
template <class T>
struct Softplus {
  static constexpr const char* name = "softplus";
  static constexpr const char* module_name = "Softplus";
  static constexpr kernels::Reads reads = kernels::Reads::Input;
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::exp, std::log1p;
    return log1p(exp(x));
  }
  DDP_HOST_DEVICE T grad(T x, T) const {
    using std::exp;
    return T(1) / (T(1) + exp(-x));
  }
};

// An op with neither name, module_name nor reads: its gradient may read x and y both, which autograd
// keeps anyway (nn::Activation refuses such an op at compile time: it keeps one tensor).
template <class T>
struct Cube {
  DDP_HOST_DEVICE T operator()(T x) const { return x * x * x; }
  DDP_HOST_DEVICE T grad(T x, T) const { return T(3) * x * x; }
};

}  // namespace test_user_unary_op

TEST_SUITE("autograd") {
  TEST_CASE("a user's own element-wise op: nn::Activation and autograd::unary from one struct") {
    using namespace test_user_unary_op;
    std::mt19937_64 rng(21);
    // The autograd op: finite differences on random shapes, for a named op and an unnamed one.
    for (int t = 0; t < 3; ++t) {
      gradcheck("softplus", {rand(rng, rand_shape(rng, 1 + t), -3.0, 3.0)},
                [](std::vector<Vd>& v) { return autograd::unary(v[0], Softplus<double>{}); });
      gradcheck("cube", {rand(rng, rand_shape(rng, 1 + t), -2.0, 2.0)},
                [](std::vector<Vd>& v) { return autograd::unary(v[0], Cube<double>{}); });
    }
    // The module: values against the closed form, backward against the closed-form derivative.
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    nn::Activation<double, Cpu, Softplus<double>> act;
    CHECK(act.describe() == "Softplus()");
    CHECK(act.parameters().empty());
    const Tensor<double, Cpu> x = rand(rng, {2, 3, 5}, -4.0, 4.0);
    const Tensor<double, Cpu> dy = rand(rng, {2, 3, 5});
    const Tensor<double, Cpu> y = act.forward(exec, x.cview());
    const Tensor<double, Cpu> dx = act.backward(exec, dy.cview());
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double v = x.data()[i];
      CHECK(y.data()[i] == doctest::Approx(std::log1p(std::exp(v))).epsilon(1e-14));
      CHECK(dx.data()[i] == doctest::Approx(dy.data()[i] / (1.0 + std::exp(-v))).epsilon(1e-14));
    }
    // Shape errors name the op.
    const Tensor<double, Cpu> wrong = rand(rng, {3, 2});
    act.forward(exec, x.cview());
    try {
      act.backward(exec, wrong.cview());
      FAIL("a wrongly shaped dy was accepted");
    } catch (const ValueError& e) {
      CHECK(std::string(e.what()).find("Softplus.backward") != std::string::npos);
    }
  }
}
