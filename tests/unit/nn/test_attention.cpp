// CausalSelfAttention: finite differences (double) for dx and every parameter, without and with attention dropout
// (the mask held by the step), causality, T < block_size, the state_dict names and hook order, the attention
// dropout's mask against nn::Dropout's kernel (the same counter layout, docs/decisions/0043) and its reproducibility,
// and the errors (messages pinned). Equality with PyTorch is in tests/interop/reference/test_attention_ops.cpp.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/nn/causal_self_attention.hpp>
#include <ddp/tensor/random.hpp>

#include "random_tensor.hpp"

using namespace ddp;

namespace attn_test {

// A C = 8, 2-head module with torch's default Linear initialisation (non-zero biases); the same weights for any
// dropout options.
template <class T>
std::unique_ptr<nn::CausalSelfAttention<T, Cpu>> make(std::int64_t block_size = 8,
                                                      nn::CausalSelfAttentionOptions o = {}) {
  o.n_embd = 8;
  o.n_head = 2;
  o.block_size = block_size;
  auto m = std::make_unique<nn::CausalSelfAttention<T, Cpu>>(o);
  Generator gen(17);
  m->reset_parameters(gen);
  return m;
}

// loss = sum(y * w): its dy is w. Every forward draws the attention dropout's mask of step 3 (training mode).
double weighted_sum(Exec<Cpu>& exec, nn::CausalSelfAttention<double, Cpu>& m, const Tensor<double, Cpu>& x,
                    const Tensor<double, Cpu>& w) {
  m.set_step(3);
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

template <class T>
bool same_values(const Tensor<T, Cpu>& a, const Tensor<T, Cpu>& b) {
  if (!(a.shape() == b.shape())) return false;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    if (a.data()[i] != b.data()[i]) return false;
  return true;
}

// Finite differences of dx and every parameter's gradient of a (2, 5, 8) input (T = 5 < block_size = 8).
void check_finite_differences(nn::CausalSelfAttention<double, Cpu>& m) {
  kernels::cpu::ThreadPool pool(2);
  Exec<Cpu> exec{.pool = &pool};
  auto x = ddp::test::randn<double>({2, 5, 8}, 3);
  const auto w = ddp::test::randn<double>({2, 5, 8}, 4);
  m.zero_grad();
  m.set_step(3);  // weighted_sum's step
  auto y = m.forward(exec, x.cview());
  REQUIRE(y.shape() == Shape{2, 5, 8});
  auto dx = m.backward(exec, w.cview());
  REQUIRE(dx.shape() == x.shape());
  check_all_elements(exec, m, x, w, x.data(), dx.data(), x.numel(), "dx");
  for (auto* p : m.parameters())
    check_all_elements(exec, m, x, w, p->value().data(), p->grad().data(), p->numel(), p->name());
  // The key bias adds q . b_k to every score of a row, which the softmax cancels: its gradient is 0 (up to
  // rounding), as in torch; dropout after the softmax does not change that.
  const auto& db = m.find_parameter("c_attn.bias")->grad();
  for (std::int64_t i = 8; i < 16; ++i) CHECK(std::abs(db.data()[i]) <= 1e-12);
}

}  // namespace attn_test

TEST_SUITE("nn") {
  TEST_CASE("causal self-attention: finite differences for dx and every parameter (double, T < block_size)") {
    auto m = attn_test::make<double>(8);
    attn_test::check_finite_differences(*m);
  }

  TEST_CASE("causal self-attention: finite differences with attention dropout 0.3, the mask held by the step") {
    auto m = attn_test::make<double>(8, {.attn_pdrop = 0.3, .seed = 5, .rank = 1, .stream = 400});
    // The mask of step 3 drops some of the 2 x 2 x 15 causal probabilities (else this would test nothing): the
    // output differs from the undropped one.
    Exec<Cpu> exec;
    const auto x = ddp::test::randn<double>({2, 5, 8}, 3);
    m->set_step(3);
    const auto dropped = m->forward(exec, x.cview());
    m->eval();
    CHECK_FALSE(attn_test::same_values(m->forward(exec, x.cview()), dropped));
    m->train();
    attn_test::check_finite_differences(*m);
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

  TEST_CASE(
      "causal self-attention: attention dropout is nn::Dropout's mask on att, scaled, the same on any thread count") {
    // Kernel level, against the outside reference of nn::Dropout's kernel: attention_forward with dropout writes
    // the undropped att and y = Dropout(att) v, where Dropout(att) is dropout_forward over att with the same (seed,
    // rank, stream, step), i.e. the same counter layout; its mask drops a fraction p of the causal probabilities.
    using K = Kernels<Cpu>;
    kernels::cpu::ThreadPool one(1), two(2);
    Exec<Cpu> e1{.pool = &one}, e2{.pool = &two};
    const std::int64_t b = 4, t = 61, c = 16, nh = 4, hs = c / nh;  // T odd: rows straddle Philox blocks
    const auto qkv = ddp::test::randn<float>({b, t, 3 * c}, 20);
    const auto dy = ddp::test::randn<float>({b, t, c}, 21);
    const kernels::AttentionDropout drop{.p = 0.25, .seed = 99, .rank = 3, .stream = 700, .step = 12};
    Tensor<float, Cpu> att0(Shape{b, nh, t, t}), y0(Shape{b, t, c}), att(Shape{b, nh, t, t}), y(Shape{b, t, c});
    K::attention_forward(e2, kernels::AttentionForwardArgs<float, Cpu>{
                                 .qkv = qkv.cview(), .att = att0.view(), .y = y0.view(), .n_head = nh});
    K::attention_forward(e2, kernels::AttentionForwardArgs<float, Cpu>{
                                 .qkv = qkv.cview(), .att = att.view(), .y = y.view(), .n_head = nh, .dropout = drop});
    CHECK(attn_test::same_values(att, att0));  // att stays the undropped probabilities
    Tensor<float, Cpu> ref_att(att.shape());
    Tensor<std::uint8_t, Cpu> mask(att.shape());
    K::dropout_forward(e1, kernels::DropoutForwardArgs<float, Cpu>{.x = att0.cview(),
                                                                   .y = ref_att.view(),
                                                                   .mask = mask.view(),
                                                                   .p = drop.p,
                                                                   .seed = drop.seed,
                                                                   .rank = drop.rank,
                                                                   .stream = drop.stream,
                                                                   .step = drop.step});
    std::int64_t causal = 0, dropped = 0;
    for (std::int64_t r = 0; r < b * nh * t; ++r)
      for (std::int64_t j = 0; j <= r % t; ++j) {
        ++causal;
        dropped += mask.data()[r * t + j] == 0;
      }
    const double fraction = static_cast<double>(dropped) / static_cast<double>(causal);
    MESSAGE("attention dropout p = 0.25: dropped " << fraction << " of " << causal << " causal probabilities");
    CHECK(std::abs(fraction - drop.p) <= 0.012);  // 5 standard deviations: sqrt(p (1 - p) / 30256) = 0.0025
    // y = Dropout(att) v in double: the kept probabilities scaled by 1 / (1 - p) (Dropout's own tests pin that).
    double worst = 0;
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t h = 0; h < nh; ++h)
        for (std::int64_t i = 0; i < t; ++i)
          for (std::int64_t d = 0; d < hs; ++d) {
            double acc = 0;
            for (std::int64_t j = 0; j < t; ++j)
              acc += double(ref_att(bi, h, i, j)) * double(qkv(bi, j, 2 * c + h * hs + d));
            worst = std::max(worst, std::abs(acc - double(y(bi, i, h * hs + d))) / (1.0 + std::abs(acc)));
          }
    CHECK(worst <= 1e-5);
    // One thread draws and computes the same as two (the mask is per element, the pairs' outputs disjoint);
    // backward too.
    Tensor<float, Cpu> att1(att.shape()), y1(y.shape()), dqkv1(qkv.shape()), dqkv2(qkv.shape());
    K::attention_forward(e1,
                         kernels::AttentionForwardArgs<float, Cpu>{
                             .qkv = qkv.cview(), .att = att1.view(), .y = y1.view(), .n_head = nh, .dropout = drop});
    CHECK(attn_test::same_values(y1, y));
    K::attention_backward(e1, kernels::AttentionBackwardArgs<float, Cpu>{.qkv = qkv.cview(),
                                                                         .att = att.cview(),
                                                                         .dy = dy.cview(),
                                                                         .dqkv = dqkv1.view(),
                                                                         .n_head = nh,
                                                                         .dropout = drop});
    K::attention_backward(e2, kernels::AttentionBackwardArgs<float, Cpu>{.qkv = qkv.cview(),
                                                                         .att = att.cview(),
                                                                         .dy = dy.cview(),
                                                                         .dqkv = dqkv2.view(),
                                                                         .n_head = nh,
                                                                         .dropout = drop});
    CHECK(attn_test::same_values(dqkv1, dqkv2));
    // dv = Dropout(att)^T dy: the backward draws the forward's mask again.
    worst = 0;
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t h = 0; h < nh; ++h)
        for (std::int64_t j = 0; j < t; ++j)
          for (std::int64_t d = 0; d < hs; ++d) {
            double acc = 0;
            for (std::int64_t i = 0; i < t; ++i) acc += double(ref_att(bi, h, i, j)) * double(dy(bi, i, h * hs + d));
            worst = std::max(worst, std::abs(acc - double(dqkv1(bi, j, 2 * c + h * hs + d))) / (1.0 + std::abs(acc)));
          }
    CHECK(worst <= 1e-5);
    // A bad p or step is the kernel's ValueError.
    CHECK_THROWS_WITH_AS(
        K::attention_forward(
            e1,
            kernels::AttentionForwardArgs<float, Cpu>{
                .qkv = qkv.cview(), .att = att1.view(), .y = y1.view(), .n_head = nh, .dropout = {.p = 1.5}}),
        "ddp: attention_forward: p must be in [0, 1], got 1.5", ValueError);
    CHECK_THROWS_WITH_AS(K::attention_backward(
                             e1, kernels::AttentionBackwardArgs<float, Cpu>{.qkv = qkv.cview(),
                                                                            .att = att.cview(),
                                                                            .dy = dy.cview(),
                                                                            .dqkv = dqkv1.view(),
                                                                            .n_head = nh,
                                                                            .dropout = {.p = 0.5, .step = 1ull << 32}}),
                         "ddp: attention_backward: step 4294967296 must be below 2^32", ValueError);
  }

  TEST_CASE(
      "causal self-attention: the dropout mask is a function of (seed, rank, stream, step); eval and p = 0 "
      "are the undropped layer bit for bit") {
    Exec<Cpu> exec;
    const auto x = ddp::test::randn<float>({2, 16, 8}, 30);
    const auto dy = ddp::test::randn<float>({2, 16, 8}, 31);
    const nn::CausalSelfAttentionOptions o{.attn_pdrop = 0.2, .seed = 1234, .rank = 1, .stream = 500};
    auto plain = attn_test::make<float>(16);  // attn_pdrop = 0: the layer without dropout
    const auto y_plain = plain->forward(exec, x.cview());
    const auto dx_plain = plain->backward(exec, dy.cview());
    CHECK(plain->step() == 1);  // a training forward counts even when it draws nothing

    auto a = attn_test::make<float>(16, o);
    auto b = attn_test::make<float>(16, o);
    const auto ya = a->forward(exec, x.cview());
    CHECK(a->step() == 1);
    CHECK_FALSE(attn_test::same_values(ya, y_plain));
    CHECK(attn_test::same_values(b->forward(exec, x.cview()), ya));        // same (seed, rank, stream, step)
    CHECK_FALSE(attn_test::same_values(b->forward(exec, x.cview()), ya));  // step 1: another mask
    b->set_step(0);                                                        // what a resumed run does
    CHECK(attn_test::same_values(b->forward(exec, x.cview()), ya));
    // Another rank, stream (another layer of the model) or seed: another mask.
    for (const nn::CausalSelfAttentionOptions& other :
         {nn::CausalSelfAttentionOptions{.attn_pdrop = 0.2, .seed = 1234, .rank = 0, .stream = 500},
          nn::CausalSelfAttentionOptions{.attn_pdrop = 0.2, .seed = 1234, .rank = 1, .stream = 501},
          nn::CausalSelfAttentionOptions{.attn_pdrop = 0.2, .seed = 1235, .rank = 1, .stream = 500}}) {
      auto c = attn_test::make<float>(16, other);
      CHECK_FALSE(attn_test::same_values(c->forward(exec, x.cview()), ya));
    }
    // Evaluation: no dropout, no step counted, and the undropped layer's forward and backward bit for bit.
    a->eval();
    CHECK(attn_test::same_values(a->forward(exec, x.cview()), y_plain));
    CHECK(attn_test::same_values(a->backward(exec, dy.cview()), dx_plain));
    CHECK(a->step() == 1);
    // p = 1 drops every probability: y is c_proj's bias on every row.
    auto all = attn_test::make<float>(16, {.attn_pdrop = 1.0});
    const auto y_all = all->forward(exec, x.cview());
    const auto& bias = all->c_proj().bias()->value();
    bool bias_only = true;
    for (std::int64_t i = 0; i < y_all.numel(); ++i) bias_only = bias_only && y_all.data()[i] == bias.data()[i % 8];
    CHECK(bias_only);
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
    CHECK_THROWS_WITH_AS(Attn({.n_embd = 8, .n_head = 2, .block_size = 8, .attn_pdrop = 1.5}),
                         "ddp: invalid CausalSelfAttention(n_embd=8, n_head=2, block_size=8, attn_pdrop=1.5, "
                         "resid_pdrop=0): attn_pdrop = 1.5 must be in [0, 1]",
                         ValueError);
    CHECK_THROWS_WITH_AS(Attn({.n_embd = 8, .n_head = 2, .block_size = 8, .attn_pdrop = -0.1}),
                         doctest::Contains("attn_pdrop = -0.1 must be in [0, 1]"), ValueError);
    CHECK_THROWS_WITH_AS(Attn({.n_embd = 8, .n_head = 2, .block_size = 8, .resid_pdrop = 1.5}),
                         "ddp: invalid CausalSelfAttention(n_embd=8, n_head=2, block_size=8, attn_pdrop=0, "
                         "resid_pdrop=1.5): resid_pdrop = 1.5 must be in [0, 1]",
                         ValueError);
    CHECK_THROWS_WITH_AS(Attn({.n_embd = 8, .n_head = 2, .block_size = 8, .resid_pdrop = 0.1}),
                         "ddp: CausalSelfAttention(n_embd=8, n_head=2, block_size=8, attn_pdrop=0, resid_pdrop=0.1): "
                         "resid_pdrop = 0.1 but dropout on the attention's output is not implemented; set it to 0 "
                         "and put an nn::Dropout after the module (as GPT's AttentionLayer does)",
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
