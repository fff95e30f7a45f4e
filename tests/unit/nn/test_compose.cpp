// Layers that compose without backward code (issue 39): SiLU, Tanh, Sigmoid, Identity, Flatten, the generic
// Residual, nested Sequentials, Dropout inside them, and a user module with its own backward among them. Every
// gradient against central finite differences in double; names and train/eval against what torch does.
// Equality with PyTorch on the same inputs (single modules and the residual CNN of compose_model.hpp, its state_dict
// keys included): tests/interop/reference/test_compose_ops.cpp. The GPU against the CPU: test_cuda_compose.cu.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ddp/core/error.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/nn/activation.hpp>
#include <ddp/nn/dropout.hpp>
#include <ddp/nn/flatten.hpp>
#include <ddp/nn/identity.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/relu.hpp>
#include <ddp/nn/residual_wrapper.hpp>
#include <ddp/nn/sequential.hpp>

#include "compose_model.hpp"
#include "random_tensor.hpp"

using namespace ddp;

// Named, not anonymous: unit_nn may be compiled as one translation unit (tests/CMakeLists.txt, DDP_UNITY_TESTS).
namespace test_compose {

// sum(y * r): the scalar whose gradient backward(r) computes.
inline double weighted_sum(const Tensor<double, Cpu>& y, const Tensor<double, Cpu>& r) {
  REQUIRE(y.shape() == r.shape());
  double s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += y.data()[i] * r.data()[i];
  return s;
}

// Compares analytic[i] with the central difference of loss() in v[i], for every i < n; returns the number checked.
inline std::int64_t check_finite_differences(double* v, const double* analytic, std::int64_t n,
                                             const std::function<double()>& loss, const std::string& what) {
  const double h = 1e-6;
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double saved = v[i];
    v[i] = saved + h;
    const double up = loss();
    v[i] = saved - h;
    const double down = loss();
    v[i] = saved;
    const double numeric = (up - down) / (2 * h);
    if (!(std::abs(analytic[i] - numeric) <= 1e-7 + 1e-6 * std::abs(numeric))) {
      ++bad;
      INFO(what << "[" << i << "]: analytic " << analytic[i] << " numeric " << numeric);
      CHECK(std::abs(analytic[i] - numeric) <= 1e-7 + 1e-6 * std::abs(numeric));
    }
  }
  CHECK(bad == 0);
  return n;
}

// Input and parameter gradients of `m` on x against finite differences of sum(m(x) * r). `before` runs before each
// forward (Dropout's set_step, so every forward draws the same mask). Returns the number of values checked.
inline std::int64_t check_module(
    nn::Module<double, Cpu>& m, Exec<Cpu>& exec, Tensor<double, Cpu>& x, std::uint64_t seed,
    const std::function<void()>& before = [] {}) {
  before();
  m.zero_grad();
  auto y = m.forward(exec, x.cview());
  const auto r = ddp::test::randn<double>(y.shape(), seed);
  auto dx = m.backward(exec, r.cview());
  REQUIRE(dx.shape() == x.shape());
  auto loss = [&] {
    before();
    return weighted_sum(m.forward(exec, x.cview()), r);
  };
  std::int64_t checked = check_finite_differences(x.data(), dx.data(), x.numel(), loss, m.describe() + " dx");
  for (auto* p : m.parameters())
    checked += check_finite_differences(p->value().data(), p->grad().data(), p->numel(), loss, p->name());
  return checked;
}

// Every parameter of `m` drawn from N(0, 0.5^2), each from its own seed.
inline void randomise(nn::Module<double, Cpu>& m, std::uint64_t seed) {
  for (auto* p : m.parameters()) {
    const auto v = ddp::test::randn<double>(p->shape(), seed++, 0.0, 0.5);
    std::copy(v.data(), v.data() + v.numel(), p->value().data());
  }
}

template <class M, class... A>
std::unique_ptr<nn::Module<double, Cpu>> make(A&&... a) {
  return std::make_unique<M>(std::forward<A>(a)...);
}
inline std::unique_ptr<nn::Linear<double, Cpu>> linear(std::int64_t in, std::int64_t out) {
  return std::make_unique<nn::Linear<double, Cpu>>(nn::LinearOptions{.in_features = in, .out_features = out});
}

inline std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no ValueError)";
}

// A user's module with its own backward: y = x * scale over the last dimension (C), one learnable scale per channel.
// The pattern nn/module.hpp describes: register parameters, keep what backward needs (a view of x), fill the
// parameters' gradients through grad_dest() and report them with grad_done().
class ChannelScale : public nn::Module<double, Cpu> {
 public:
  explicit ChannelScale(std::int64_t channels) : scale_(&register_parameter("scale", Shape{channels})) {}
  std::string describe() const override { return "ChannelScale()"; }

 protected:
  Tensor<double, Cpu> forward_impl(Exec<Cpu>&, TensorView<const double, Cpu> x) override {
    const std::int64_t c = scale_->numel();
    Tensor<double, Cpu> y(x.shape());
    for (std::int64_t i = 0; i < x.numel(); ++i) y.data()[i] = x.data()[i] * scale_->value().data()[i % c];
    x_ = x;
    have_x_ = true;
    return y;
  }
  Tensor<double, Cpu> backward_impl(Exec<Cpu>& exec, TensorView<const double, Cpu> dy) override {
    require_forward_state(have_x_);
    have_x_ = false;
    const std::int64_t c = scale_->numel();
    Tensor<double, Cpu> dx(dy.shape());
    TensorView<double, Cpu> ds = scale_->grad_dest();
    for (std::int64_t k = 0; k < c; ++k) ds.data()[k] = 0;
    for (std::int64_t i = 0; i < dy.numel(); ++i) {
      dx.data()[i] = dy.data()[i] * scale_->value().data()[i % c];
      ds.data()[i % c] += dy.data()[i] * x_.data()[i];
    }
    scale_->grad_done(exec);
    return dx;
  }

 private:
  nn::Parameter<double, Cpu>* scale_;
  TensorView<const double, Cpu> x_;
  bool have_x_ = false;
};

}  // namespace test_compose

namespace tc = test_compose;

TEST_SUITE("nn") {
  TEST_CASE("compose: SiLU, Tanh, Sigmoid, Mish, Identity and Flatten match finite differences (double); torch's reprs") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    auto x = ddp::test::randn<double>({2, 3, 4, 5}, 70, 0.0, 2.0);
    nn::SiLU<double, Cpu> silu;
    nn::Tanh<double, Cpu> tanh;
    nn::Sigmoid<double, Cpu> sigmoid;
    nn::Mish<double, Cpu> mish;
    nn::Identity<double, Cpu> identity;
    for (nn::Module<double, Cpu>* m :
         std::vector<nn::Module<double, Cpu>*>{&silu, &tanh, &sigmoid, &mish, &identity}) {
      CAPTURE(m->describe());
      CHECK(tc::check_module(*m, exec, x, 71) == x.numel());
      CHECK(m->parameters().empty());
    }
    CHECK(silu.describe() == "SiLU()");
    CHECK(tanh.describe() == "Tanh()");
    CHECK(sigmoid.describe() == "Sigmoid()");
    CHECK(mish.describe() == "Mish()");
    CHECK(identity.describe() == "Identity()");
    for (auto [s, e] : {std::pair{1, -1}, std::pair{2, 3}, std::pair{0, 2}, std::pair{-2, -1}, std::pair{1, 1}}) {
      nn::Flatten<double, Cpu> flatten(s, e);
      CAPTURE(flatten.describe());
      tc::check_module(flatten, exec, x, 72);
    }
    auto seq = ddp::test::randn<double>({2, 3, 4}, 73);
    nn::Flatten<double, Cpu> plain(0, 1);
    tc::check_module(plain, exec, seq, 74);
    CHECK(nn::Flatten<double, Cpu>().describe() == "Flatten(start_dim=1, end_dim=-1)");
    // Backward needs a forward first, once.
    silu.forward(exec, x.cview());
    silu.backward(exec, x.cview());
    CHECK(tc::what_of([&] { silu.backward(exec, x.cview()); }).find("without a preceding forward") !=
          std::string::npos);
  }

  TEST_CASE("compose: Flatten puts an NHWC image batch in torch's NCHW order; bad dims are ValueErrors") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    const std::int64_t n = 2, h = 3, w = 4, c = 5;
    Tensor<float, Cpu> x(Shape{n, h, w, c});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(i);
    nn::Flatten<float, Cpu> flatten;
    auto y = flatten.forward(exec, x.cview());
    REQUIRE(y.shape() == Shape{n, c * h * w});
    // torch.flatten(x_nchw, 1): element (b, ch, row, col) at column (ch * H + row) * W + col.
    std::int64_t wrong = 0;
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t row = 0; row < h; ++row)
        for (std::int64_t col = 0; col < w; ++col)
          for (std::int64_t ch = 0; ch < c; ++ch) wrong += y(b, (ch * h + row) * w + col) != x(b, row, col, ch);
    CHECK(wrong == 0);
    auto dx = flatten.backward(exec, y.cview());  // the inverse permutation
    CHECK(std::equal(dx.data(), dx.data() + dx.numel(), x.data()));
    CHECK(dx.shape() == x.shape());
    CHECK(nn::Flatten<float, Cpu>(2, 3).output_shape(x.shape()) == Shape{n, c, h * w});
    CHECK(nn::Flatten<float, Cpu>(3, 3).output_shape(x.shape()) == x.shape());  // rank 4 out: NHWC, unchanged
    CHECK(nn::Flatten<float, Cpu>(1, 2).output_shape(Shape{2, 3, 4}) == Shape{2, 12});
    CHECK(tc::what_of([&] { nn::Flatten<float, Cpu>(1, 4).forward(exec, x.cview()); }) ==
          "ddp: module '<root>' (Flatten(start_dim=1, end_dim=4)): end_dim 4 is out of range for shape (2, 5, 3, 4) "
          "(valid: -4 to 3)");
    CHECK(tc::what_of([&] { nn::Flatten<float, Cpu>(2, 1).forward(exec, x.cview()); }) ==
          "ddp: module '<root>' (Flatten(start_dim=2, end_dim=1)): start_dim 2 comes after end_dim 1 for an input of "
          "rank 4; construct Flatten(start, end) with start <= end");
  }

  TEST_CASE("compose: Residual adds body(x) to x or to shortcut(x); names, gradient order, errors") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    auto x = ddp::test::randn<double>({3, 4}, 80);
    // Identity shortcut: y = body(x) + x, dx = body'(x)^T dy + dy.
    auto body = std::make_unique<nn::Sequential<double, Cpu>>();
    body->push_back(tc::linear(4, 4));
    body->push_back(std::make_unique<nn::Tanh<double, Cpu>>());
    body->push_back(tc::linear(4, 4));
    nn::Residual<double, Cpu> plain(std::move(body));
    tc::randomise(plain, 81);
    CHECK(plain.state_dict_keys() ==
          std::vector<std::string>{"body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"});
    CHECK(plain.describe() == "Residual(body=Sequential(3 modules), shortcut=identity)");
    CHECK(plain.shortcut() == nullptr);
    CHECK(tc::check_module(plain, exec, x, 82) == x.numel() + 40);
    // Projection shortcut (4 -> 6 features). Gradients become ready shortcut first, then body from its last layer:
    // the reverse of registration, as torch's autograd runs the later branch first.
    nn::Residual<double, Cpu> projected(tc::linear(4, 6), tc::linear(4, 6));
    tc::randomise(projected, 83);
    CHECK(projected.state_dict_keys() ==
          std::vector<std::string>{"body.weight", "body.bias", "shortcut.weight", "shortcut.bias"});
    std::vector<std::string> ready;
    projected.set_grad_ready_hook([&](nn::Parameter<double, Cpu>& p) { ready.push_back(p.name()); });
    CHECK(tc::check_module(projected, exec, x, 84) == x.numel() + 60);
    REQUIRE(ready.size() >= 4);
    CHECK(std::vector<std::string>(ready.begin(), ready.begin() + 4) ==
          std::vector<std::string>{"shortcut.weight", "shortcut.bias", "body.weight", "body.bias"});
    // Shapes that cannot be added, and a null body.
    nn::Residual<double, Cpu> widening(tc::linear(4, 6));
    CHECK(tc::what_of([&] { widening.forward(exec, x.cview()); }) ==
          "ddp: module '<root>' (Residual(body=Linear(in_features=4, out_features=6, bias=True), shortcut=identity)): "
          "body output (3, 6) and input (3, 4) differ, so they cannot be added; give the Residual a shortcut module "
          "that maps the input to the body's output shape (e.g. a 1x1 Conv2d and a BatchNorm2d)");
    CHECK(tc::what_of([] { nn::Residual<double, Cpu> r(nullptr); }).find("body is null") != std::string::npos);
    plain.forward(exec, x.cview());
    plain.backward(exec, x.cview());
    CHECK(tc::what_of([&] { plain.backward(exec, x.cview()); }).find("without a preceding forward") !=
          std::string::npos);
  }

  TEST_CASE("compose: relu(body(x) + x) is Sequential{Residual, ReLU}; a user module with its own backward fits in") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    auto x = ddp::test::randn<double>({3, 5}, 90);
    auto body = std::make_unique<nn::Sequential<double, Cpu>>();
    body->push_back(tc::linear(5, 5));
    body->push_back(std::make_unique<tc::ChannelScale>(5));
    nn::Sequential<double, Cpu> block;
    block.push_back(std::make_unique<nn::Residual<double, Cpu>>(std::move(body)));
    block.push_back(std::make_unique<nn::ReLU<double, Cpu>>());
    tc::randomise(block, 91);
    CHECK(block.state_dict_keys() == std::vector<std::string>{"0.body.0.weight", "0.body.0.bias", "0.body.1.scale"});
    CHECK(tc::check_module(block, exec, x, 92) == x.numel() + 35);
    // The forward value: max(0, scale * (x W^T + b) + x), computed here.
    auto y = block.forward(exec, x.cview());
    const auto& w = block.find_parameter("0.body.0.weight")->value();
    const auto& b = block.find_parameter("0.body.0.bias")->value();
    const auto& s = block.find_parameter("0.body.1.scale")->value();
    double worst = 0;
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 5; ++j) {
        double z = b(j);
        for (std::int64_t k = 0; k < 5; ++k) z += x(i, k) * w(j, k);
        worst = std::max(worst, std::abs(y(i, j) - std::max(0.0, s(j) * z + x(i, j))));
      }
    CHECK(worst < 1e-14);
  }

  TEST_CASE("compose: Sequentials nest; the nested tree computes what the flat one does, with nested names") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    auto inner = std::make_unique<nn::Sequential<double, Cpu>>();
    inner->push_back(tc::linear(4, 6));
    inner->push_back(std::make_unique<nn::SiLU<double, Cpu>>());
    auto deepest = std::make_unique<nn::Sequential<double, Cpu>>();
    auto& deep_linear = deepest->push_back(tc::linear(6, 3));
    auto second = std::make_unique<nn::Sequential<double, Cpu>>();
    second->push_back(std::move(deepest));
    second->push_back(std::make_unique<nn::Sigmoid<double, Cpu>>());
    nn::Sequential<double, Cpu> nested;
    nested.push_back(std::move(inner));
    nested.push_back(std::move(second));
    CHECK(nested.state_dict_keys() == std::vector<std::string>{"0.0.weight", "0.0.bias", "1.0.0.weight", "1.0.0.bias"});
    CHECK(deep_linear.path() == "1.0.0");
    nn::Sequential<double, Cpu> flat;
    flat.push_back(tc::linear(4, 6));
    flat.push_back(std::make_unique<nn::SiLU<double, Cpu>>());
    flat.push_back(tc::linear(6, 3));
    flat.push_back(std::make_unique<nn::Sigmoid<double, Cpu>>());
    tc::randomise(nested, 100);
    tc::randomise(flat, 100);  // the same values, in the same (parameters()) order
    auto x = ddp::test::randn<double>({5, 4}, 101);
    const auto r = ddp::test::randn<double>({5, 3}, 102);
    nested.zero_grad();
    flat.zero_grad();
    auto yn = nested.forward(exec, x.cview());
    auto yf = flat.forward(exec, x.cview());
    CHECK(std::equal(yn.data(), yn.data() + yn.numel(), yf.data()));
    auto dn = nested.backward(exec, r.cview());
    auto df = flat.backward(exec, r.cview());
    CHECK(std::equal(dn.data(), dn.data() + dn.numel(), df.data()));
    const auto pn = nested.parameters(), pf = flat.parameters();
    REQUIRE(pn.size() == pf.size());
    for (std::size_t i = 0; i < pn.size(); ++i)
      CHECK(std::equal(pn[i]->grad().data(), pn[i]->grad().data() + pn[i]->numel(), pf[i]->grad().data()));
    CHECK(tc::check_module(nested, exec, x, 103) == x.numel() + 51);
  }

  TEST_CASE(
      "compose: the residual CNN (Conv2d, BatchNorm2d, ReLU, Residual, Dropout, Flatten, Linear) matches "
      "finite differences end to end, training with a fixed dropout mask") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    auto model = ddp::test::make_compose_model<double, Cpu>(0.5);
    tc::randomise(*model, 110);
    auto& dropout = dynamic_cast<nn::Dropout<double, Cpu>&>((*model)[7]);
    auto x = ddp::test::randn<double>({2, 8, 8, 3}, 111);
    model->train();
    const std::int64_t checked = tc::check_module(*model, exec, x, 112, [&] { dropout.set_step(0); });
    CHECK(checked == x.numel() + model->num_parameters());
    MESSAGE("finite differences checked: " << checked << " values");
  }

  TEST_CASE("compose: train() and eval() reach a Dropout nested in the model; eval is the identity, as in torch") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    auto dropping = ddp::test::make_compose_model<double, Cpu>(0.5);
    auto plain = ddp::test::make_compose_model<double, Cpu>(0.0);
    tc::randomise(*dropping, 120);
    tc::randomise(*plain, 120);
    auto& dropout = dynamic_cast<nn::Dropout<double, Cpu>&>((*dropping)[7]);
    const auto x = ddp::test::randn<double>({2, 8, 8, 3}, 121);
    auto yd = dropping->forward(exec, x.cview());
    auto yp = plain->forward(exec, x.cview());
    CHECK(!std::equal(yd.data(), yd.data() + yd.numel(), yp.data()));  // training: half the features dropped
    CHECK(dropout.step() == 1);
    dropping->eval();
    plain->eval();
    int training = 0;
    dropping->visit([&](nn::Module<double, Cpu>& m) { training += m.is_training(); });
    CHECK(training == 0);
    yd = dropping->forward(exec, x.cview());
    yp = plain->forward(exec, x.cview());
    CHECK(std::equal(yd.data(), yd.data() + yd.numel(), yp.data()));
    CHECK(dropout.step() == 1);  // evaluation forwards draw no mask
  }
}
