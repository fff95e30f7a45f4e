// Test support for tests/unit/autograd: random float64 tensors and shapes, and gradcheck, which compares an op's
// backward with central finite differences (torch.autograd.gradcheck's method).
// SPDX-License-Identifier: MIT
//
//   gradcheck("mul", {rand(rng, {3, 1}), rand(rng, {4})}, [](auto& v) { return mul(v[0], v[1]); });
// f's output y may have any shape: the check runs backward(seed) with a random seed R, so each input's analytic
// gradient is d<y, R>/dx, and compares it with (<f(x + eps e_k), R> - <f(x - eps e_k), R>) / (2 eps) for every
// element k, as |analytic - numeric| <= atol + rtol |numeric|. In float64 with eps 1e-6 the truncation error is
// ~1e-12 relative, so atol 1e-7 / rtol 1e-6 leave a wide margin and still catch a wrong factor or a missed term.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ddp/autograd/autograd.hpp>
#include <ddp/tensor/tensor.hpp>

namespace ddp::test::gradcheck_support {

using Vd = autograd::Var<double, Cpu>;
using Td = Tensor<double, Cpu>;

// Uniform in [lo, hi).
inline Td rand(std::mt19937_64& rng, Shape s, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Td t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = u(rng);
  return t;
}

// A random shape of `rank` dims in [1, max_dim].
inline Shape rand_shape(std::mt19937_64& rng, int rank, std::int64_t max_dim = 4) {
  std::uniform_int_distribution<std::int64_t> u(1, max_dim);
  std::vector<std::int64_t> d(static_cast<std::size_t>(rank));
  for (auto& x : d) x = u(rng);
  return Shape(d);
}

// `s` made broadcast-compatible with it: some dims set to 1, and possibly leading dims dropped.
inline Shape rand_broadcast_of(std::mt19937_64& rng, const Shape& s) {
  std::vector<std::int64_t> d(s.begin(), s.end());
  std::uniform_int_distribution<int> coin(0, 2);
  for (auto& x : d)
    if (coin(rng) == 0) x = 1;
  const int drop = std::uniform_int_distribution<int>(0, static_cast<int>(d.size()))(rng);
  d.erase(d.begin(), d.begin() + drop);
  return Shape(d);
}

using Fn = std::function<Vd(std::vector<Vd>&)>;

// One input of gradcheck: lets `{rand(...), rand(...)}` pass move-only tensors through an initializer list.
struct In {
  std::shared_ptr<Td> t;
  In(Td x) : t(std::make_shared<Td>(std::move(x))) {}  // NOLINT: implicit on purpose
};

inline std::vector<Vd> leaves(const std::vector<Td>& xs, bool requires_grad) {
  std::vector<Vd> v;
  for (const auto& x : xs) v.push_back(Vd::leaf(x.clone(), requires_grad));
  return v;
}

inline double dot(const Td& a, const Td& b) {
  double s = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.data()[i] * b.data()[i];
  return s;
}

// Checks every input's gradient of f at xs; returns the largest |analytic - numeric| seen.
inline double gradcheck(const std::string& name, const std::vector<In>& inputs, const Fn& f, double eps = 1e-6,
                        double atol = 1e-7, double rtol = 1e-6) {
  std::vector<Td> xs;
  for (const auto& x : inputs) xs.push_back(x.t->clone());
  std::mt19937_64 rng(std::hash<std::string>{}(name));
  auto in = leaves(xs, true);
  Vd y = f(in);
  const Td seed = rand(rng, y.shape());
  y.backward(seed);
  double worst = 0.0;
  autograd::NoGradGuard no_grad;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    REQUIRE_MESSAGE(in[i].has_grad(), name, ": input ", i, " got no gradient");
    const Td& g = in[i].grad();
    REQUIRE(g.shape() == xs[i].shape());
    for (std::int64_t k = 0; k < xs[i].numel(); ++k) {
      const double x0 = xs[i].data()[k];
      xs[i].data()[k] = x0 + eps;
      auto p = leaves(xs, false);
      const double fp = dot(f(p).value(), seed);
      xs[i].data()[k] = x0 - eps;
      auto m = leaves(xs, false);
      const double fm = dot(f(m).value(), seed);
      xs[i].data()[k] = x0;
      const double numeric = (fp - fm) / (2 * eps), analytic = g.data()[k];
      INFO(name, ": input ", i, " shape ", xs[i].shape(), " element ", k, ": analytic ", analytic, " numeric ",
           numeric);
      CHECK(std::abs(analytic - numeric) <= atol + rtol * std::abs(numeric));
      worst = std::max(worst, std::abs(analytic - numeric));
    }
  }
  return worst;
}

}  // namespace ddp::test::gradcheck_support
