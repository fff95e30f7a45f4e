// nn::GPT against the DDP tutorial's minGPT in PyTorch, made causal (make_gpt_reference.py), with 1 and 2 threads.
// The weights are torch's, loaded from safetensors files of its state_dict (the tutorial's names, its mask buffers
// included) through train::load_state_dict with nn::mingpt_state_dict_key. Float32, one batch: logits, the mean
// cross-entropy loss and every parameter gradient. Float64, three batches: three training steps as the tutorial's
// trainer takes them (clip_grad_norm to max_norm, AdamW over minGPT's decay / no-decay groups): the gradient norm
// before each clip and every parameter after the last step (why float64: make_gpt_reference.py).
// SPDX-License-Identifier: MIT
//
// Tolerance: |ddp - torch| <= 1e-5 * (|torch| + rms(torch)) per element (test_torch_ops.cpp's measure; for the
// scalar loss and gradient norms the RMS is the value itself).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <ddp/nn/gpt.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/clip.hpp>
#include <ddp/optim/param_groups.hpp>
#include <ddp/tensor/tensor.hpp>
#include <ddp/train/checkpoint.hpp>

#include "reference_file.hpp"

namespace gpt_ref_test {

using ddp::Cpu;
using ddp::Tensor;

// The script's outputs: the records and the initial weights as float32 and float64 safetensors files (removed at
// exit).
struct Reference {
  std::string init_path(const char* dtype) const {
    return std::string(DDP_REFERENCE_OUT) + "/make_gpt_reference." + std::to_string(::getpid()) + "." + dtype +
           ".safetensors";
  }
  std::string init_f32 = init_path("f32"), init_f64 = init_path("f64");
  ddp::test::RefFile records = ddp::test::RefFile::generate("make_gpt_reference.py", init_f32 + " " + init_f64);
  ~Reference() {
    std::remove(init_f32.c_str());
    std::remove(init_f64.c_str());
  }
};

const Reference& ref() {
  static const Reference r;
  return r;
}

template <class T = float>
Tensor<T, Cpu> get(const std::string& name) {
  return ddp::test::to_ddp_layout<T>(ref().records.at("gpt/" + name));
}

Tensor<std::int64_t, Cpu> get_ids(const std::string& name) {
  const auto& r = ref().records.at("gpt/" + name);
  REQUIRE(r.dims.size() == 2);
  auto t = Tensor<std::int64_t, Cpu>::empty(ddp::Shape{r.dims[0], r.dims[1]});
  std::copy(r.i.begin(), r.i.end(), t.data());
  return t;
}

// The largest |got - want| / (|want| + rms(want)) over the tensor.
template <class T>
double worst_error(const T* got, const Tensor<T, Cpu>& want) {
  double ss = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) ss += double(want.data()[i]) * double(want.data()[i]);
  const double rms = std::sqrt(ss / double(want.numel()));
  double worst = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.data()[i], g = got[i];
    worst = std::max(worst, std::abs(g - w) / (std::abs(w) + rms + 1e-30));
  }
  return worst;
}

// The largest worst_error over every parameter's gradient (kind "grad") or value ("trained") against the
// reference's "gpt/<kind>/<name>".
template <class T>
double worst_over_params(ddp::nn::GPT<T, Cpu>& m, const std::string& kind) {
  double worst = 0;
  for (auto* p : m.parameters()) {
    CAPTURE(p->name());
    const auto want = get<T>(kind + "/" + p->name());
    REQUIRE(want.shape() == p->shape());
    const double e = worst_error(kind == "grad" ? p->grad().data() : p->value().data(), want);
    CHECK(e <= 1e-5);
    worst = std::max(worst, e);
  }
  return worst;
}

ddp::nn::GPTOptions options() {
  const auto& r = ref().records;
  return {.vocab_size = r.int_at("gpt/vocab_size"),
          .block_size = r.int_at("gpt/block_size"),
          .n_layer = r.int_at("gpt/n_layer"),
          .n_head = r.int_at("gpt/n_head"),
          .n_embd = r.int_at("gpt/n_embd"),
          .embd_pdrop = 0.0,
          .resid_pdrop = 0.0};
}

// A GPT with the weights of the tutorial's state_dict file at `path` (strict: every tensor but the masks is used).
template <class T>
std::unique_ptr<ddp::nn::GPT<T, Cpu>> load_gpt(const std::string& path) {
  const ddp::nn::GPTOptions o = options();
  auto m = std::make_unique<ddp::nn::GPT<T, Cpu>>(o);
  REQUIRE(static_cast<std::int64_t>(m->parameters().size()) == ref().records.int_at("gpt/num_params"));
  ddp::train::load_state_dict(
      path, *m, /*strict=*/true,
      {.file_key = ddp::nn::mingpt_state_dict_key, .ignore = ddp::nn::mingpt_ignored_keys(o.n_layer)});
  return m;
}

// zero_grad, forward, mean cross-entropy, backward on the batch "gpt/<batch>ids", "gpt/<batch>targets": every
// parameter's gradient; returns the loss and the logits (B, T, vocab_size).
template <class T>
std::pair<double, Tensor<T, Cpu>> forward_backward(ddp::Exec<Cpu>& exec, ddp::nn::GPT<T, Cpu>& m,
                                                   const std::string& batch) {
  const auto ids = get_ids(batch + "ids"), targets = get_ids(batch + "targets");
  const std::int64_t n = ids.numel(), vocab = m.options().vocab_size;
  m.zero_grad();
  auto logits = m.forward(exec, ids.cview());
  ddp::nn::CrossEntropyLoss<T, Cpu> ce;
  const double loss =
      ce.forward(exec, logits.cview().reshape(ddp::Shape{n, vocab}), targets.cview().reshape(ddp::Shape{n}));
  auto dlogits = ce.backward(exec);
  dlogits.reshape(logits.shape());
  CHECK(m.backward(exec, dlogits.cview()).empty());
  return {loss, std::move(logits)};
}

}  // namespace gpt_ref_test

TEST_SUITE("nn") {
  TEST_CASE(
      "GPT equals the tutorial's minGPT (causal) in PyTorch, loaded from its state_dict: logits, loss and "
      "every parameter gradient (float32)") {
    namespace grt = gpt_ref_test;  // qualified: the unity build also sees the other files' get() and ref()
    const auto want_logits = grt::get("logits");
    const double want_loss = grt::ref().records.float_at("gpt/loss");
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      auto pool = std::make_unique<ddp::kernels::cpu::ThreadPool>(threads);
      ddp::Exec<ddp::Cpu> exec{.pool = pool.get()};
      auto m = grt::load_gpt<float>(grt::ref().init_f32);
      const auto [loss, logits] = grt::forward_backward(exec, *m, "step0/");
      REQUIRE(logits.shape() == want_logits.shape());
      const double logits_err = grt::worst_error(logits.data(), want_logits);
      CHECK(logits_err <= 1e-5);
      const double loss_err = std::abs(loss - want_loss) / (2 * std::abs(want_loss));
      CHECK(loss_err <= 1e-5);
      const double grad_err = grt::worst_over_params(*m, "grad");
      MESSAGE("threads " << threads << ": loss " << loss << " (torch " << want_loss << "), max relative error: logits "
                         << logits_err << ", loss " << loss_err << ", gradients " << grad_err);
    }
  }

  TEST_CASE(
      "GPT trains as the tutorial's trainer in PyTorch: three steps of clip_grad_norm and AdamW over minGPT's "
      "parameter groups, parameters after them (float64)") {
    namespace grt = gpt_ref_test;
    const auto& r = grt::ref().records;
    const std::int64_t steps = r.int_at("gpt/steps");
    const double max_norm = r.float_at("gpt/max_norm");
    const ddp::optim::AdamwOptions adamw{.lr = r.float_at("gpt/lr"),
                                         .beta1 = r.float_at("gpt/beta1"),
                                         .beta2 = r.float_at("gpt/beta2"),
                                         .eps = 1e-8,  // torch's default, which the tutorial keeps
                                         .weight_decay = r.float_at("gpt/weight_decay")};
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      auto pool = std::make_unique<ddp::kernels::cpu::ThreadPool>(threads);
      ddp::Exec<ddp::Cpu> exec{.pool = pool.get()};
      auto m = grt::load_gpt<double>(grt::ref().init_f64);
      ddp::optim::AdamW<double, Cpu> opt(ddp::optim::linear_weight_decay_groups(*m, adamw.weight_decay), adamw);
      double norm_err = 0;
      int clipped = 0;
      for (std::int64_t k = 0; k < steps; ++k) {
        CAPTURE(k);
        grt::forward_backward(exec, *m, "step" + std::to_string(k) + "/");
        const double norm = ddp::optim::clip_grad_norm(exec, m->parameters(), max_norm);
        const double want = r.float_at("gpt/grad_norms", static_cast<std::size_t>(k));
        const double e = std::abs(norm - want) / (2 * std::abs(want));
        CHECK(e <= 1e-5);
        norm_err = std::max(norm_err, e);
        clipped += norm > max_norm;
        opt.step(exec);
      }
      CHECK(clipped > 0);  // else the clipping would be untested
      const double trained_err = grt::worst_over_params(*m, "trained");
      MESSAGE("threads " << threads << ": " << clipped << " of " << steps << " steps clipped (max_norm " << max_norm
                         << ", lr " << adamw.lr << "); max relative error: gradient norms " << norm_err
                         << ", parameters after the steps " << trained_err);
    }
  }
}
