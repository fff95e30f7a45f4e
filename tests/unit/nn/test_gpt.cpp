// GPT (issue 19, nn/gpt.hpp): parameter names, shapes and initialisation of a 2-layer model, every parameter
// reporting its gradient once per backward, finite differences in double through the whole model, causality, and
// the errors for bad inputs. Equality with PyTorch: tests/interop/reference/test_gpt_ops.cpp.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ddp/nn/gpt.hpp>
#include <ddp/tensor/random.hpp>

#include "random_tensor.hpp"

using namespace ddp;

// Named, not anonymous: unit_nn may be compiled as one translation unit (tests/CMakeLists.txt, DDP_UNITY_TESTS).
namespace gpt_test {

using Model = nn::GPT<double, Cpu>;

// A small model, dropout off (finite differences need a deterministic function).
inline nn::GPTOptions small_options() {
  return nn::GPTOptions{.vocab_size = 7,
                        .block_size = 6,
                        .n_layer = 2,
                        .n_head = 2,
                        .n_embd = 8,
                        .embd_pdrop = 0.0,
                        .resid_pdrop = 0.0,
                        .seed = 11};
}

// Token ids (B, T) in [0, vocab).
inline Tensor<std::int64_t, Cpu> random_ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint64_t seed) {
  Tensor<std::int64_t, Cpu> ids(Shape{b, t});
  Generator g(seed, 0, kStreamData);
  for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data()[i] = static_cast<std::int64_t>(g.uniform_int(vocab));
  return ids;
}

// sum(logits * r): the scalar whose gradient backward(r) computes.
inline double weighted_sum(Model& m, Exec<Cpu>& exec, const Tensor<std::int64_t, Cpu>& ids,
                           const Tensor<double, Cpu>& r) {
  const auto y = m.forward(exec, ids.cview());
  REQUIRE(y.shape() == r.shape());
  double s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += y.data()[i] * r.data()[i];
  return s;
}

inline double std_dev(const Tensor<float, Cpu>& t) {
  double s = 0, ss = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    s += t.data()[i];
    ss += double(t.data()[i]) * t.data()[i];
  }
  const double n = static_cast<double>(t.numel()), mean = s / n;
  return std::sqrt(ss / n - mean * mean);
}

inline double max_abs(const Tensor<float, Cpu>& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(double(t.data()[i])));
  return m;
}

}  // namespace gpt_test

TEST_SUITE("nn") {
  TEST_CASE("GPT: parameter names and shapes follow the tutorial's minGPT, in its order") {
    nn::GPT<float, Cpu> m({.vocab_size = 17, .block_size = 8, .n_layer = 2, .n_head = 4, .n_embd = 16});
    std::vector<std::pair<std::string, Shape>> want = {{"emb_stem.pos_emb", Shape{1, 8, 16}},
                                                       {"emb_stem.tok_emb.weight", Shape{17, 16}}};
    for (int i = 0; i < 2; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      for (const auto& [name, shape] :
           std::vector<std::pair<std::string, Shape>>{{"ln1.weight", Shape{16}},
                                                      {"ln1.bias", Shape{16}},
                                                      {"ln2.weight", Shape{16}},
                                                      {"ln2.bias", Shape{16}},
                                                      {"attn.c_proj.weight", Shape{16, 16}},
                                                      {"attn.c_proj.bias", Shape{16}},
                                                      {"attn.attn.c_attn.weight", Shape{48, 16}},
                                                      {"attn.attn.c_attn.bias", Shape{48}},
                                                      {"attn.attn.c_proj.weight", Shape{16, 16}},
                                                      {"attn.attn.c_proj.bias", Shape{16}},
                                                      {"mlp.0.weight", Shape{64, 16}},
                                                      {"mlp.0.bias", Shape{64}},
                                                      {"mlp.2.weight", Shape{16, 64}},
                                                      {"mlp.2.bias", Shape{16}}})
        want.emplace_back(b + name, shape);
    }
    want.emplace_back("ln_f.weight", Shape{16});
    want.emplace_back("ln_f.bias", Shape{16});
    want.emplace_back("head.weight", Shape{17, 16});
    const auto params = m.parameters();
    REQUIRE(params.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(params[i]->name() == want[i].first);
      CHECK(params[i]->shape() == want[i].second);
    }
    CHECK(m.buffers().empty());  // no mask buffer: the causal mask is computed
  }

  TEST_CASE("GPT: the tutorial's initialisation, deterministic in the seed") {
    const nn::GPTOptions o{.vocab_size = 50, .block_size = 8, .n_layer = 2, .n_head = 4, .n_embd = 64, .seed = 5};
    nn::GPT<float, Cpu> m(o);
    auto value = [&](const std::string& name) -> Tensor<float, Cpu>& {
      auto* p = m.find_parameter(name);
      REQUIRE(p != nullptr);
      return p->value();
    };
    CHECK(gpt_test::max_abs(value("emb_stem.pos_emb")) == 0.0);
    CHECK(gpt_test::std_dev(value("emb_stem.tok_emb.weight")) == doctest::Approx(0.02).epsilon(0.1));
    CHECK(gpt_test::std_dev(value("head.weight")) == doctest::Approx(0.02).epsilon(0.1));
    CHECK(gpt_test::std_dev(value("blocks.0.mlp.0.weight")) == doctest::Approx(0.02).epsilon(0.1));
    CHECK(gpt_test::std_dev(value("blocks.1.attn.attn.c_proj.weight")) == doctest::Approx(0.02).epsilon(0.1));
    // The residual projection: 0.02 / sqrt(2 n_layer).
    CHECK(gpt_test::std_dev(value("blocks.1.attn.c_proj.weight")) == doctest::Approx(0.01).epsilon(0.1));
    // MultiheadAttention's in_proj: xavier_uniform_, bound sqrt(6 / (C + 3C)), std bound / sqrt(3).
    const double bound = std::sqrt(6.0 / (64 + 3 * 64));
    CHECK(gpt_test::max_abs(value("blocks.0.attn.attn.c_attn.weight")) <= bound);
    CHECK(gpt_test::std_dev(value("blocks.0.attn.attn.c_attn.weight")) ==
          doctest::Approx(bound / std::sqrt(3.0)).epsilon(0.05));
    for (const char* zero : {"blocks.0.attn.attn.c_attn.bias", "blocks.0.attn.attn.c_proj.bias",
                             "blocks.0.attn.c_proj.bias", "blocks.1.mlp.2.bias", "ln_f.bias"})
      CHECK(gpt_test::max_abs(value(zero)) == 0.0);
    CHECK(value("blocks.1.ln2.weight").data()[3] == 1.0f);
    nn::GPT<float, Cpu> same(o);
    for (auto* p : same.parameters()) {
      CAPTURE(p->name());
      const auto& v = value(p->name());
      CHECK(std::equal(v.data(), v.data() + v.numel(), p->value().data()));
    }
  }

  TEST_CASE("GPT: gradients equal finite differences (double), each parameter reports once per backward") {
    gpt_test::Model m(gpt_test::small_options());
    // Random values everywhere (the initialisation leaves pos_emb and the biases 0, LayerNorm weights 1).
    std::uint64_t seed = 100;
    for (auto* p : m.parameters()) {
      const auto v = test::randn<double>(p->shape(), seed++, 0.0, 0.3);
      std::copy(v.data(), v.data() + v.numel(), p->value().data());
    }
    Exec<Cpu> exec;
    const std::int64_t b = 2, t = 5;  // T < block_size = 6
    const auto ids = gpt_test::random_ids(b, t, 7, 3);
    const auto r = test::randn<double>(Shape{b, t, 7}, 4);
    m.zero_grad();
    const auto y = m.forward(exec, ids.cview());
    CHECK(y.shape() == Shape{b, t, 7});
    const auto dids = m.backward(exec, r.cview());
    CHECK(dids.empty());
    for (auto* p : m.parameters()) {
      CAPTURE(p->name());
      CHECK(p->grad_ready_count() == 1);
    }
    // pos_emb's row T (unused by this forward) has a zero gradient.
    auto* pos = m.find_parameter("emb_stem.pos_emb");
    for (std::int64_t k = 0; k < 8; ++k) CHECK(pos->grad().data()[t * 8 + k] == 0.0);
    for (const char* name : {"emb_stem.tok_emb.weight", "emb_stem.pos_emb", "blocks.0.ln1.weight", "blocks.1.ln2.bias",
                             "blocks.1.attn.attn.c_attn.weight", "blocks.0.attn.c_proj.weight", "blocks.0.mlp.0.weight",
                             "blocks.1.mlp.2.bias", "ln_f.weight", "head.weight"}) {
      CAPTURE(name);
      auto* p = m.find_parameter(name);
      REQUIRE(p != nullptr);
      const std::int64_t n = p->numel(), picks = 6;
      for (std::int64_t k = 0; k < picks; ++k) {
        const std::int64_t i = (k * 7919) % n;  // spread over the tensor
        double& v = p->value().data()[i];
        const double saved = v, h = 1e-6;
        v = saved + h;
        const double up = gpt_test::weighted_sum(m, exec, ids, r);
        v = saved - h;
        const double down = gpt_test::weighted_sum(m, exec, ids, r);
        v = saved;
        const double numeric = (up - down) / (2 * h), analytic = p->grad().data()[i];
        INFO(name << "[" << i << "]: analytic " << analytic << " numeric " << numeric);
        CHECK(std::abs(analytic - numeric) <= 1e-7 + 1e-6 * std::abs(numeric));
      }
    }
  }

  TEST_CASE("GPT is causal: logits at t do not depend on ids after t") {
    gpt_test::Model m(gpt_test::small_options());
    Exec<Cpu> exec;
    auto ids = gpt_test::random_ids(1, 6, 7, 9);
    const auto before = m.forward(exec, ids.cview());
    ids.data()[4] = (ids.data()[4] + 1) % 7;
    const auto after = m.forward(exec, ids.cview());
    for (std::int64_t i = 0; i < 4 * 7; ++i) CHECK(after.data()[i] == before.data()[i]);  // positions 0..3
    bool changed = false;
    for (std::int64_t i = 4 * 7; i < 6 * 7; ++i) changed = changed || after.data()[i] != before.data()[i];
    CHECK(changed);
  }

  TEST_CASE(
      "GPT: each dropout, the attention's included, has its own stream in model order; set_dropout_step "
      "replays the masks") {
    nn::GPTOptions o = gpt_test::small_options();
    o.attn_pdrop = 0.3;
    o.rank = 1;
    nn::GPT<float, Cpu> m(o);
    const std::uint32_t s0 = o.dropout_stream;
    CHECK(m.emb_stem().drop().options().stream == s0);
    for (std::uint32_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      CHECK(m.block(i).attn().resid_drop().options().stream == s0 + 1 + 3 * i);
      const nn::CausalSelfAttentionOptions& a = m.block(i).attn().attn().options();
      CHECK(a.stream == s0 + 2 + 3 * i);
      CHECK((a.attn_pdrop == 0.3 && a.seed == 11 && a.rank == 1));
      CHECK(m.block(i).mlp_drop().options().stream == s0 + 3 + 3 * i);
    }
    Exec<Cpu> exec;
    const auto ids = gpt_test::random_ids(2, 6, 7, 3);
    const auto y0 = m.forward(exec, ids.cview());
    const auto y1 = m.forward(exec, ids.cview());
    CHECK(m.block(1).attn().attn().step() == 2);
    bool same = true;
    for (std::int64_t i = 0; i < y0.numel(); ++i) same = same && y0.data()[i] == y1.data()[i];
    CHECK_FALSE(same);      // step 1 drew other attention masks
    m.set_dropout_step(0);  // what a resumed run does
    CHECK(m.block(0).attn().attn().step() == 0);
    const auto again = m.forward(exec, ids.cview());
    same = true;
    for (std::int64_t i = 0; i < y0.numel(); ++i) same = same && y0.data()[i] == again.data()[i];
    CHECK(same);
    // In evaluation the model is the one without attention dropout, bit for bit.
    o.attn_pdrop = 0.0;
    nn::GPT<float, Cpu> plain(o);
    const auto y_plain = plain.forward(exec, ids.cview());
    m.eval();
    const auto y_eval = m.forward(exec, ids.cview());
    same = true;
    for (std::int64_t i = 0; i < y0.numel(); ++i) same = same && y_eval.data()[i] == y_plain.data()[i];
    CHECK(same);
  }

  TEST_CASE("GPT: bad inputs are ValueErrors") {
    gpt_test::Model m(gpt_test::small_options());
    Exec<Cpu> exec;
    const auto too_long = gpt_test::random_ids(2, 7, 7, 1);  // block_size = 6
    CHECK_THROWS_WITH_AS(m.forward(exec, too_long.cview()),
                         doctest::Contains("cannot forward a sequence of length T = 7, block_size is only 6"),
                         ValueError);
    const auto one_row = gpt_test::random_ids(1, 4, 7, 1);
    CHECK_THROWS_AS(m.forward(exec, one_row.cview().reshape(Shape{4})), ValueError);  // ids must be (B, T)
    const Tensor<double, Cpu> x(Shape{2, 4, 8});
    CHECK_THROWS_WITH_AS(m.forward(exec, x.cview()), doctest::Contains("takes int64 token ids"), ValueError);
    const Tensor<double, Cpu> dy(Shape{2, 4, 7});
    CHECK_THROWS_AS(m.backward(exec, dy.cview()), ValueError);  // no forward
    const auto ids = gpt_test::random_ids(2, 4, 7, 1);
    m.forward(exec, ids.cview());
    const Tensor<double, Cpu> wrong(Shape{2, 3, 7});
    CHECK_THROWS_AS(m.backward(exec, wrong.cview()), ValueError);
  }
}
