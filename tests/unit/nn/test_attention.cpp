// CausalSelfAttention: finite differences (double) for dx and every parameter, causality, T < block_size, the
// state_dict names and hook order, and the errors (messages pinned). Equality with PyTorch is in
// tests/reference/test_attention_ops.cpp.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <ddp/nn/causal_self_attention.hpp>
#include <ddp/tensor/random.hpp>

#include "random_tensor.hpp"

using namespace ddp;

namespace attn_test {

// A C = 8, 2-head module with torch's default Linear initialisation (non-zero biases).
template <class T>
std::unique_ptr<nn::CausalSelfAttention<T, Cpu>> make(std::int64_t block_size = 8) {
  auto m = std::make_unique<nn::CausalSelfAttention<T, Cpu>>(
      nn::CausalSelfAttentionOptions{.n_embd = 8, .n_head = 2, .block_size = block_size});
  Generator gen(17);
  m->reset_parameters(gen);
  return m;
}

// loss = sum(y * w): its dy is w.
double weighted_sum(Exec<Cpu>& exec, nn::CausalSelfAttention<double, Cpu>& m, const Tensor<double, Cpu>& x,
                    const Tensor<double, Cpu>& w) {
  auto y = m.forward(exec, x.cview());
  double s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += y.data()[i] * w.data()[i];
  return s;
}

// Every element of `v` against the central difference of the loss, step h.
void check_all_elements(Exec<Cpu>& exec, nn::CausalSelfAttention<double, Cpu>& m, Tensor<double, Cpu>& x,
                        const Tensor<double, Cpu>& w, double* v, const double* analytic, std::int64_t n,
                        const std::string& what) {
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double h = 1e-6, saved = v[i];
    v[i] = saved + h;
    const double up = weighted_sum(exec, m, x, w);
    v[i] = saved - h;
    const double down = weighted_sum(exec, m, x, w);
    v[i] = saved;
    const double numeric = (up - down) / (2 * h);
    const double err = std::abs(analytic[i] - numeric) / (1e-6 + std::abs(numeric));
    if (err > worst) worst = err;
    INFO(what << "[" << i << "]: analytic " << analytic[i] << " numeric " << numeric);
    CHECK(std::abs(analytic[i] - numeric) <= 1e-8 + 1e-6 * std::abs(numeric));
  }
  MESSAGE(what << ": worst relative error " << worst << " over " << n << " elements");
}

}  // namespace attn_test

TEST_SUITE("nn") {
  TEST_CASE("causal self-attention: finite differences for dx and every parameter (double, T < block_size)") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    auto m = attn_test::make<double>(8);
    auto x = ddp::test::randn<double>({2, 5, 8}, 3);  // T = 5 < block_size = 8
    const auto w = ddp::test::randn<double>({2, 5, 8}, 4);
    m->zero_grad();
    auto y = m->forward(exec, x.cview());
    REQUIRE(y.shape() == Shape{2, 5, 8});
    auto dx = m->backward(exec, w.cview());
    REQUIRE(dx.shape() == x.shape());
    attn_test::check_all_elements(exec, *m, x, w, x.data(), dx.data(), x.numel(), "dx");
    for (auto* p : m->parameters())
      attn_test::check_all_elements(exec, *m, x, w, p->value().data(), p->grad().data(), p->numel(), p->name());
    // The key bias adds q . b_k to every score of a row, which the softmax cancels: its gradient is 0 (up to
    // rounding), as in torch.
    const auto& db = m->find_parameter("c_attn.bias")->grad();
    for (std::int64_t i = 8; i < 16; ++i) CHECK(std::abs(db.data()[i]) <= 1e-12);
  }

  TEST_CASE("causal self-attention: a position sees only itself and earlier positions") {
    kernels::cpu::ThreadPool pool(2);
    Exec<Cpu> exec{.pool = &pool};
    auto m = attn_test::make<float>(8);
    const std::int64_t b = 2, t = 6, c = 8, changed = 3;
    auto x = ddp::test::randn<float>({b, t, c}, 5);
    auto y = m->forward(exec, x.cview());
    auto x2 = x.clone();
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t ci = 0; ci < c; ++ci) x2(bi, changed, ci) += 1.0f;
    auto y2 = m->forward(exec, x2.cview());
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t ti = 0; ti < t; ++ti) {
        bool same = true;
        for (std::int64_t ci = 0; ci < c; ++ci) same = same && y(bi, ti, ci) == y2(bi, ti, ci);
        CAPTURE(bi);
        CAPTURE(ti);
        CHECK(same == (ti < changed));  // earlier outputs bit for bit the same, later ones changed
      }

    // Backward: a gradient at position `changed` only reaches the inputs at positions <= changed.
    auto dy = Tensor<float, Cpu>::zeros({b, t, c});
    for (std::int64_t ci = 0; ci < c; ++ci) dy(1, changed, ci) = 1.0f;
    auto dx = m->backward(exec, dy.cview());
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t ti = 0; ti < t; ++ti) {
        double norm = 0;
        for (std::int64_t ci = 0; ci < c; ++ci) norm += std::abs(dx(bi, ti, ci));
        CAPTURE(bi);
        CAPTURE(ti);
        CHECK((norm != 0) == (bi == 1 && ti <= changed));
      }
  }

  TEST_CASE("causal self-attention: a prefix gives the first outputs of the longer sequence (T < block_size)") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    auto m = attn_test::make<float>(8);
    auto x = ddp::test::randn<float>({2, 8, 8}, 6);  // T = block_size
    auto y = m->forward(exec, x.cview());
    for (std::int64_t t : {1, 3, 7}) {
      auto xp = Tensor<float, Cpu>::empty({2, t, 8});
      for (std::int64_t bi = 0; bi < 2; ++bi)
        for (std::int64_t ti = 0; ti < t; ++ti)
          for (std::int64_t ci = 0; ci < 8; ++ci) xp(bi, ti, ci) = x(bi, ti, ci);
      auto yp = m->forward(exec, xp.cview());
      REQUIRE(yp.shape() == Shape{2, t, 8});
      double worst = 0;
      for (std::int64_t bi = 0; bi < 2; ++bi)
        for (std::int64_t ti = 0; ti < t; ++ti)
          for (std::int64_t ci = 0; ci < 8; ++ci)
            worst = std::max(worst, static_cast<double>(std::abs(yp(bi, ti, ci) - y(bi, ti, ci))));
      CAPTURE(t);
      CHECK(worst <= 1e-6);  // the GEMMs' blocking may differ with T, so not bit for bit
    }
  }

  TEST_CASE("causal self-attention: minGPT's state_dict names; c_proj's gradients are ready before c_attn's") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    auto m = attn_test::make<float>(4);
    CHECK(m->state_dict_keys() ==
          std::vector<std::string>{"c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"});
    CHECK(m->find_parameter("c_attn.weight")->shape() == Shape{24, 8});
    CHECK(m->find_parameter("c_attn.bias")->shape() == Shape{24});
    CHECK(m->find_parameter("c_proj.weight")->shape() == Shape{8, 8});
    std::vector<std::string> order;
    m->set_grad_ready_hook([&](nn::Parameter<float, Cpu>& p) { order.push_back(p.name()); });
    auto x = ddp::test::randn<float>({1, 4, 8}, 7);
    m->zero_grad();
    m->forward(exec, x.cview());
    m->backward(exec, ddp::test::randn<float>({1, 4, 8}, 8).cview());
    CHECK(order == std::vector<std::string>{"c_proj.weight", "c_proj.bias", "c_attn.weight", "c_attn.bias"});
  }

  TEST_CASE("causal self-attention: bad options and inputs are ValueErrors naming the module") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    using Attn = nn::CausalSelfAttention<float, Cpu>;
    CHECK_THROWS_WITH_AS(Attn({.n_embd = 10, .n_head = 4, .block_size = 8}),
                         "ddp: invalid CausalSelfAttention(n_embd=10, n_head=4, block_size=8, attn_pdrop=0, "
                         "resid_pdrop=0): n_embd = 10 is not divisible by n_head = 4; each head gets n_embd / n_head "
                         "channels",
                         ValueError);
    CHECK_THROWS_WITH_AS(Attn({.n_embd = 8, .n_head = 2, .block_size = 8, .attn_pdrop = 0.1}),
                         "ddp: CausalSelfAttention(n_embd=8, n_head=2, block_size=8, attn_pdrop=0.1, resid_pdrop=0): "
                         "attn_pdrop = 0.1 but dropout in attention is not implemented yet; set it to 0",
                         ValueError);
    CHECK_THROWS_WITH_AS(Attn({.n_embd = 8, .n_head = 2, .block_size = 8, .resid_pdrop = 1.5}),
                         "ddp: invalid CausalSelfAttention(n_embd=8, n_head=2, block_size=8, attn_pdrop=0, "
                         "resid_pdrop=1.5): resid_pdrop = 1.5 must be in [0, 1)",
                         ValueError);

    Attn m({.n_embd = 8, .n_head = 2, .block_size = 4});
    const char* where =
        "ddp: module '<root>' (CausalSelfAttention(n_embd=8, n_head=2, block_size=4, attn_pdrop=0, "
        "resid_pdrop=0)): ";
    auto too_long = Tensor<float, Cpu>::zeros({2, 5, 8});
    CHECK_THROWS_WITH_AS(m.forward(exec, too_long.cview()),
                         (std::string(where) + "sequence length T = 5 exceeds block_size = 4; crop the input to the "
                                               "last block_size positions or raise block_size")
                             .c_str(),
                         ValueError);
    auto wrong_c = Tensor<float, Cpu>::zeros({2, 3, 6});
    CHECK_THROWS_WITH_AS(m.forward(exec, wrong_c.cview()),
                         (std::string(where) + "input (2, 3, 6) has 6 channels but n_embd is 8").c_str(), ValueError);
    auto flat = Tensor<float, Cpu>::zeros({6, 8});
    CHECK_THROWS_WITH_AS(m.forward(exec, flat.cview()),
                         (std::string(where) + "input must be (B, T, C) with B, T >= 1 but has shape (6, 8)").c_str(),
                         ValueError);
    CHECK_THROWS_WITH_AS(m.backward(exec, Tensor<float, Cpu>::zeros({2, 3, 8}).cview()),
                         "ddp: backward of module '<root>' (CausalSelfAttention(n_embd=8, n_head=2, block_size=4, "
                         "attn_pdrop=0, resid_pdrop=0)) called without a preceding forward (or twice for one forward); "
                         "call forward(x) before each backward(dy)",
                         ValueError);
  }
}
