// nn::GPT against the DDP tutorial's minGPT in PyTorch, made causal (make_gpt_reference.py), float32, the same
// weights and batch, with 1 and 2 threads: logits, the mean cross-entropy loss and every parameter gradient.
// SPDX-License-Identifier: MIT
//
// Tolerance: |ddp - torch| <= 1e-5 * (|torch| + rms(torch)) per element (test_torch_ops.cpp's measure; for the
// scalar loss the RMS is |loss|).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include <ddp/nn/gpt.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/tensor/tensor.hpp>

#include "reference_file.hpp"

namespace gpt_ref_test {

using ddp::Cpu;
using ddp::Tensor;

const ddp::test::RefFile& ref() {
  static const ddp::test::RefFile r = ddp::test::RefFile::generate("make_gpt_reference.py");
  return r;
}

Tensor<float, Cpu> get(const std::string& name) { return ddp::test::to_ddp_layout(ref().at("gpt/" + name)); }

Tensor<std::int64_t, Cpu> get_ids(const std::string& name) {
  const auto& r = ref().at("gpt/" + name);
  REQUIRE(r.dims.size() == 2);
  auto t = Tensor<std::int64_t, Cpu>::empty(ddp::Shape{r.dims[0], r.dims[1]});
  std::copy(r.i.begin(), r.i.end(), t.data());
  return t;
}

// The largest |got - want| / (|want| + rms(want)) over the tensor.
double worst_error(const float* got, const Tensor<float, Cpu>& want) {
  double ss = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) ss += double(want.data()[i]) * want.data()[i];
  const double rms = std::sqrt(ss / double(want.numel()));
  double worst = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.data()[i], g = got[i];
    worst = std::max(worst, std::abs(g - w) / (std::abs(w) + rms + 1e-30));
  }
  return worst;
}

}  // namespace gpt_ref_test

TEST_SUITE("nn") {
  TEST_CASE("GPT equals the tutorial's minGPT (causal) in PyTorch: logits, loss and every parameter gradient") {
    namespace grt = gpt_ref_test;  // qualified: the unity build also sees the other files' get() and ref()
    const auto& r = grt::ref();
    const ddp::nn::GPTOptions o{.vocab_size = r.int_at("gpt/vocab_size"),
                                .block_size = r.int_at("gpt/block_size"),
                                .n_layer = r.int_at("gpt/n_layer"),
                                .n_head = r.int_at("gpt/n_head"),
                                .n_embd = r.int_at("gpt/n_embd"),
                                .embd_pdrop = 0.0,
                                .resid_pdrop = 0.0};
    const auto ids = grt::get_ids("ids"), targets = grt::get_ids("targets");
    const auto want_logits = grt::get("logits");
    const double want_loss = r.float_at("gpt/loss");
    const std::int64_t n = ids.numel();
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      auto pool = std::make_unique<ddp::kernels::cpu::ThreadPool>(threads);
      ddp::Exec<ddp::Cpu> exec{.pool = pool.get()};
      ddp::nn::GPT<float, ddp::Cpu> m(o);
      const auto params = m.parameters();
      REQUIRE(static_cast<std::int64_t>(params.size()) == r.int_at("gpt/num_params"));
      for (auto* p : params) {
        CAPTURE(p->name());
        const auto v = grt::get("param/" + p->name());
        REQUIRE(v.shape() == p->shape());
        std::copy(v.data(), v.data() + v.numel(), p->value().data());
      }
      m.zero_grad();
      auto logits = m.forward(exec, ids.cview());
      REQUIRE(logits.shape() == want_logits.shape());
      double worst_grad = 0;
      const double logits_err = grt::worst_error(logits.data(), want_logits);
      CHECK(logits_err <= 1e-5);
      ddp::nn::CrossEntropyLoss<float, ddp::Cpu> ce;
      const double loss =
          ce.forward(exec, logits.cview().reshape(ddp::Shape{n, o.vocab_size}), targets.cview().reshape(ddp::Shape{n}));
      const double loss_err = std::abs(loss - want_loss) / (2 * std::abs(want_loss));
      CHECK(loss_err <= 1e-5);
      auto dlogits = ce.backward(exec);
      dlogits.reshape(logits.shape());
      CHECK(m.backward(exec, dlogits.cview()).empty());
      for (auto* p : params) {
        CAPTURE(p->name());
        const double e = grt::worst_error(p->grad().data(), grt::get("grad/" + p->name()));
        CHECK(e <= 1e-5);
        worst_grad = std::max(worst_grad, e);
      }
      MESSAGE("threads " << threads << ": loss " << loss << " (torch " << want_loss << "), max relative error: logits "
                         << logits_err << ", loss " << loss_err << ", gradients " << worst_grad);
    }
  }
}
