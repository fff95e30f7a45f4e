// The minGPT forward written with autograd ops (bench/gpt_cpu/gpt_ops.hpp, what bench_gpt_cpu times) against the
// explicit nn::GPT (itself checked against the tutorial's PyTorch model, tests/interop/reference/gpt_torch_model.py) over
// the same float64 parameters, ids, targets and dropout masks: the loss and every parameter's gradient agree to
// |ops - explicit| <= 1e-11 + 1e-9 |explicit| (float64 rounding of two summation orders).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <ddp/nn/gpt.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/tensor/random.hpp>

#include "../../../bench/gpt_cpu/gpt_ops.hpp"

namespace test_gpt_written_with_ops {

using namespace ddp;

struct Run {
  double loss = 0;
  std::vector<std::vector<double>> grads;  // per parameter, in parameters() order
};

std::vector<std::vector<double>> take_grads(nn::GPT<double, Cpu>& model) {
  std::vector<std::vector<double>> out;
  for (auto* p : model.parameters()) {
    const auto& g = p->grad();
    out.emplace_back(g.data(), g.data() + g.numel());
    p->zero_grad();
  }
  return out;
}

void check(double pdrop) {
  const std::int64_t b = 3, t = 6, vocab = 11;  // T < block_size: the position embedding's unused rows get 0
  nn::GPT<double, Cpu> model({.vocab_size = vocab, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8,
                              .embd_pdrop = pdrop, .resid_pdrop = pdrop, .attn_pdrop = 0.0});
  Generator gen(7, 0, kStreamData);
  for (auto* p : model.parameters()) gen.fill_normal(p->value().view(), 0.0, 0.5);  // not the init's 0s and 1s
  Tensor<std::int64_t, Cpu> ids(Shape{b, t}), targets(Shape{b * t});
  for (std::int64_t i = 0; i < b * t; ++i) {
    ids.data()[i] = static_cast<std::int64_t>(gen.uniform_int(vocab));
    targets.data()[i] = static_cast<std::int64_t>(gen.uniform_int(vocab));
  }
  kernels::cpu::ThreadPool pool(1);
  Exec<Cpu> exec{.pool = &pool};

  Run ops;  // first: it reads the dropouts' step 0, which the explicit forward then uses
  {
    auto loss = bench_gpt_ops::gpt_ops_loss(model, exec, ids, targets, model.emb_stem().drop().step());
    ops.loss = loss.value().data()[0];
    loss.backward();
  }
  ops.grads = take_grads(model);

  Run ex;
  nn::CrossEntropyLoss<double, Cpu> ce;
  auto logits = model.forward(exec, ids.cview());
  ex.loss = ce.forward(exec, logits.cview().reshape(Shape{b * t, vocab}), targets.cview());
  Tensor<double, Cpu> dlogits = ce.backward(exec);
  dlogits.reshape(Shape{b, t, vocab});
  model.backward(exec, dlogits.cview());
  ex.grads = take_grads(model);

  auto close = [](double a, double e) { return std::abs(a - e) <= 1e-11 + 1e-9 * std::abs(e); };
  CHECK(close(ops.loss, ex.loss));
  CHECK(ex.loss > 1.0);  // a real loss, not a degenerate 0
  const auto keys = model.state_dict_keys();  // the parameters' names, in order (GPT has no buffers)
  REQUIRE(keys.size() == ex.grads.size());
  REQUIRE(ops.grads.size() == ex.grads.size());
  for (std::size_t i = 0; i < ex.grads.size(); ++i) {
    INFO("parameter ", keys[i]);
    REQUIRE(ops.grads[i].size() == ex.grads[i].size());
    int bad = 0;
    double norm = 0;
    for (std::size_t j = 0; j < ex.grads[i].size(); ++j) {
      bad += close(ops.grads[i][j], ex.grads[i][j]) ? 0 : 1;
      norm += ex.grads[i][j] * ex.grads[i][j];
    }
    CHECK(bad == 0);
    CHECK(norm > 0);  // every parameter takes part (pos_emb's rows t < T)
  }
}

}  // namespace test_gpt_written_with_ops

TEST_CASE("gpt_ops: the minGPT forward with ops gives the explicit GPT's loss and gradients") {
  SUBCASE("no dropout") { test_gpt_written_with_ops::check(0.0); }
  SUBCASE("dropout 0.1 on the embeddings and residual branches, the same masks") { test_gpt_written_with_ops::check(0.1); }
}
