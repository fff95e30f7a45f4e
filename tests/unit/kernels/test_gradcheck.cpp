// kernels: every op's backward against central finite differences, in double precision.
// SPDX-License-Identifier: MIT
//
// For an op y = f(x, w, ...) we take the scalar L = sum(y * r) with a fixed random r, run backward with
// dy = r, and compare each analytic dL/dv with (L(v + h) - L(v - h)) / 2h, h = 1e-6, for up to 48
// elements of every input (all of them for small tensors). Double precision makes the check tight:
// |numeric - analytic| <= 1e-6 * (1 + |analytic|). Runs with a 2-thread pool so the threaded paths
// (per-image blocks, partial weight gradients, per-block channel sums) are the ones checked.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

using ddp::Cpu;
using ddp::Exec;
using ddp::Shape;
using ddp::Tensor;
using K = ddp::Kernels<Cpu>;
namespace kn = ddp::kernels;
using T64 = Tensor<double, Cpu>;

namespace {

kn::cpu::ThreadPool& pool() {
  static kn::cpu::ThreadPool p(2);
  return p;
}
Exec<Cpu> exec2() { return Exec<Cpu>{.pool = &pool()}; }

T64 randn(Shape s, std::uint64_t seed, double scale = 1.0) {
  auto t = T64::empty(s);
  ddp::Generator(seed, 0, 99).fill_normal(t.view(), 0.0, scale);
  return t;
}

double dot(const T64& a, const T64& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.data()[i] * b.data()[i];
  return s;
}

// Compares grad (analytic) with finite differences of loss() wrt the elements of v.
void check_grad(T64& v, const T64& grad, const std::function<double()>& loss, const std::string& what) {
  CAPTURE(what);
  REQUIRE(grad.shape() == v.shape());
  const std::int64_t n = v.numel();
  const std::int64_t count = std::min<std::int64_t>(n, 48);
  ddp::Generator pick(5);
  int bad = 0;
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t i = n <= 48 ? k : static_cast<std::int64_t>(pick.uniform_int(static_cast<std::uint64_t>(n)));
    const double h = 1e-6, old = v.data()[i];
    v.data()[i] = old + h;
    const double lp = loss();
    v.data()[i] = old - h;
    const double lm = loss();
    v.data()[i] = old;
    const double num = (lp - lm) / (2 * h), ana = grad.data()[i];
    if (std::abs(num - ana) > 1e-6 * (1 + std::abs(ana)) && bad++ < 3)
      FAIL_CHECK(what << "[" << i << "]: numeric " << num << " vs analytic " << ana);
  }
  CHECK(bad == 0);
}

struct ConvCase {
  Shape x, w;
  kn::Size2 stride, padding, dilation;
  bool bias;
};

}  // namespace

TEST_SUITE("kernels") {
  TEST_CASE("conv2d gradients (dx, dw, dbias) match finite differences") {
    const ConvCase cases[] = {
        {{3, 5, 6, 2}, {3, 3, 3, 2}, {1, 1}, {1, 1}, {1, 1}, true},
        {{2, 7, 5, 3}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
        {{2, 6, 6, 4}, {3, 1, 1, 4}, {1, 1}, {0, 0}, {1, 1}, true},   // pointwise GEMM path
        {{1, 7, 7, 2}, {2, 3, 2, 2}, {2, 1}, {2, 0}, {2, 3}, false},  // N < threads: split GEMMs
        {{2, 9, 8, 1}, {2, 7, 7, 1}, {2, 2}, {3, 3}, {1, 1}, false},  // stem-like
    };
    auto exec = exec2();
    int idx = 0;
    for (const auto& c : cases) {
      CAPTURE(idx++);
      auto x = randn(c.x, 1), w = randn(c.w, 2, 0.5), b = c.bias ? randn({c.w[0]}, 3) : T64();
      const auto fwd = [&](T64& y) {
        K::conv2d_forward(exec, kn::Conv2dForwardArgs<double, Cpu>{.x = x.view(),
                                                                   .w = w.view(),
                                                                   .bias = b.view(),
                                                                   .y = y.view(),
                                                                   .stride = c.stride,
                                                                   .padding = c.padding,
                                                                   .dilation = c.dilation});
      };
      const Shape ys = kn::conv2d_output_shape<double, Cpu>(x.view(), w.view(), c.stride, c.padding, c.dilation);
      auto y = T64::empty(ys);
      auto r = randn(ys, 4);
      const auto loss = [&] {
        fwd(y);
        return dot(y, r);
      };
      auto dx = T64::empty(x.shape()), dw = T64::empty(w.shape()), db = c.bias ? T64::empty(b.shape()) : T64();
      K::conv2d_backward(exec, kn::Conv2dBackwardArgs<double, Cpu>{.x = x.view(),
                                                                   .w = w.view(),
                                                                   .dy = r.view(),
                                                                   .dx = dx.view(),
                                                                   .dw = dw.view(),
                                                                   .dbias = db.view(),
                                                                   .stride = c.stride,
                                                                   .padding = c.padding,
                                                                   .dilation = c.dilation});
      check_grad(x, dx, loss, "conv dx");
      check_grad(w, dw, loss, "conv dw");
      if (c.bias) check_grad(b, db, loss, "conv dbias");
    }
  }

  TEST_CASE("batchnorm gradients match finite differences in training and eval mode") {
    auto exec = exec2();
    for (bool training : {true, false}) {
      CAPTURE(training);
      for (Shape s : {Shape{3, 4, 5, 3}, Shape{6, 4}}) {
        auto x = randn(s, 7, 2.0), g = randn({s[-1]}, 8), b = randn({s[-1]}, 9);
        auto rm = randn({s[-1]}, 10), rv = T64::full({s[-1]}, 1.5);
        auto y = T64::empty(s), sm = T64::empty({s[-1]}), si = T64::empty({s[-1]}), r = randn(s, 11);
        const auto fwd = [&] {
          auto rm2 = rm.clone(), rv2 = rv.clone();  // running stats do not feed y in training
          K::batchnorm_forward(exec, kn::BatchNormForwardArgs<double, Cpu>{.x = x.view(),
                                                                           .gamma = g.view(),
                                                                           .beta = b.view(),
                                                                           .running_mean = rm2.view(),
                                                                           .running_var = rv2.view(),
                                                                           .y = y.view(),
                                                                           .save_mean = sm.view(),
                                                                           .save_invstd = si.view(),
                                                                           .training = training});
        };
        const auto loss = [&] {
          fwd();
          return dot(y, r);
        };
        fwd();
        auto dx = T64::empty(s), dg = T64::empty({s[-1]}), db = T64::empty({s[-1]});
        K::batchnorm_backward(exec, kn::BatchNormBackwardArgs<double, Cpu>{.x = x.view(),
                                                                           .dy = r.view(),
                                                                           .gamma = g.view(),
                                                                           .save_mean = sm.view(),
                                                                           .save_invstd = si.view(),
                                                                           .dx = dx.view(),
                                                                           .dgamma = dg.view(),
                                                                           .dbeta = db.view(),
                                                                           .training = training});
        check_grad(x, dx, loss, "bn dx");
        check_grad(g, dg, loss, "bn dgamma");
        check_grad(b, db, loss, "bn dbeta");
      }
    }
  }

  TEST_CASE("max-pool and adaptive average pool gradients match finite differences") {
    auto exec = exec2();
    for (auto [k, s, p] : {std::tuple{kn::Size2{3, 3}, kn::Size2{2, 2}, kn::Size2{1, 1}},
                           std::tuple{kn::Size2{2, 3}, kn::Size2{1, 2}, kn::Size2{1, 0}}}) {
      auto x = randn({2, 7, 6, 3}, 12);
      const Shape ys = kn::maxpool2d_output_shape<double, Cpu>(x.view(), k, s, p);
      auto y = T64::empty(ys), r = randn(ys, 13);
      auto am = Tensor<std::int32_t, Cpu>::empty(ys);
      const auto loss = [&] {
        K::max_pool2d_forward(
            exec, kn::MaxPool2dForwardArgs<double, Cpu>{
                      .x = x.view(), .y = y.view(), .argmax = am.view(), .kernel = k, .stride = s, .padding = p});
        return dot(y, r);
      };
      loss();
      auto dx = T64::empty(x.shape());
      K::max_pool2d_backward(
          exec, kn::MaxPool2dBackwardArgs<double, Cpu>{.dy = r.view(), .argmax = am.view(), .dx = dx.view()});
      check_grad(x, dx, loss, "max-pool dx");
    }
    for (Shape ys : {Shape{2, 1, 1, 3}, Shape{2, 3, 2, 3}, Shape{2, 4, 4, 3}}) {
      auto x = randn({2, 5, 7, 3}, 14);
      auto y = T64::empty(ys), r = randn(ys, 15);
      const auto loss = [&] {
        K::adaptive_avg_pool2d_forward(exec,
                                       kn::AdaptiveAvgPool2dForwardArgs<double, Cpu>{.x = x.view(), .y = y.view()});
        return dot(y, r);
      };
      auto dx = T64::empty(x.shape());
      K::adaptive_avg_pool2d_backward(exec,
                                      kn::AdaptiveAvgPool2dBackwardArgs<double, Cpu>{.dy = r.view(), .dx = dx.view()});
      check_grad(x, dx, loss, "avg-pool dx");
    }
  }

  TEST_CASE("linear, relu and residual-add gradients match finite differences") {
    auto exec = exec2();
    auto x = randn({5, 7}, 16), w = randn({4, 7}, 17), b = randn({4}, 18);
    auto y = T64::empty({5, 4}), r = randn({5, 4}, 19);
    const auto loss = [&] {
      K::linear_forward(
          exec, kn::LinearForwardArgs<double, Cpu>{.x = x.view(), .w = w.view(), .bias = b.view(), .y = y.view()});
      return dot(y, r);
    };
    auto dx = T64::empty(x.shape()), dw = T64::empty(w.shape()), db = T64::empty(b.shape());
    K::linear_backward(
        exec, kn::LinearBackwardArgs<double, Cpu>{
                  .x = x.view(), .w = w.view(), .dy = r.view(), .dx = dx.view(), .dw = dw.view(), .dbias = db.view()});
    check_grad(x, dx, loss, "linear dx");
    check_grad(w, dw, loss, "linear dw");
    check_grad(b, db, loss, "linear dbias");

    // relu(a + b): the residual block's tail.
    auto a = randn({3, 4, 4, 2}, 20), c = randn({3, 4, 4, 2}, 21), s = T64::empty(a.shape()),
         out = T64::empty(a.shape()), r2 = randn(a.shape(), 22);
    const auto loss2 = [&] {
      K::add<double>(exec, a.view(), c.view(), s.view());
      K::relu_forward<double>(exec, s.view(), out.view());
      return dot(out, r2);
    };
    loss2();
    auto ds = T64::empty(a.shape());
    K::relu_backward<double>(exec, out.view(), r2.view(), ds.view());  // d(a + b)/da = d(a + b)/db = 1
    check_grad(a, ds, loss2, "relu(a + b) da");
    check_grad(c, ds, loss2, "relu(a + b) db");
  }

  TEST_CASE("cross-entropy (with label smoothing) and MSE gradients match finite differences") {
    auto exec = exec2();
    auto labels = Tensor<std::int64_t, Cpu>::from({4}, {2, 0, 4, 4});
    for (double smoothing : {0.0, 0.2}) {
      CAPTURE(smoothing);
      auto z = randn({4, 5}, 23, 2.0);
      const auto loss = [&] {
        return K::cross_entropy(exec, kn::CrossEntropyArgs<double, Cpu>{
                                          .logits = z.view(), .labels = labels.view(), .label_smoothing = smoothing});
      };
      auto dz = T64::empty(z.shape());
      K::cross_entropy(
          exec, kn::CrossEntropyArgs<double, Cpu>{
                    .logits = z.view(), .labels = labels.view(), .dlogits = dz.view(), .label_smoothing = smoothing});
      check_grad(z, dz, loss, "cross-entropy dlogits");
    }
    // Hand-computed value: C = 2, z = (0, 0): loss = log 2, dz = (0.5, -0.5) / N.
    auto z0 = T64::zeros({1, 2});
    auto l1 = Tensor<std::int64_t, Cpu>::from({1}, {1});
    auto dz0 = T64::empty({1, 2});
    CHECK(
        K::cross_entropy(
            exec, kn::CrossEntropyArgs<double, Cpu>{.logits = z0.view(), .labels = l1.view(), .dlogits = dz0.view()}) ==
        doctest::Approx(std::log(2.0)));
    CHECK(dz0(0, 0) == doctest::Approx(0.5));
    CHECK(dz0(0, 1) == doctest::Approx(-0.5));

    auto x = randn({3, 4}, 24), t = randn({3, 4}, 25);
    const auto mse = [&] { return K::mse(exec, kn::MseArgs<double, Cpu>{.x = x.view(), .target = t.view()}); };
    auto dx = T64::empty(x.shape());
    K::mse(exec, kn::MseArgs<double, Cpu>{.x = x.view(), .target = t.view(), .dx = dx.view()});
    check_grad(x, dx, mse, "mse dx");
  }
}
