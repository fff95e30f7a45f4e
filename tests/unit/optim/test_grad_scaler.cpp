// GradScaler (optim/grad_scaler.hpp): torch.cuda.amp.GradScaler's rule on a written-out sequence, skipped steps
// leaving parameters and AdamW state untouched, and the exactness of power-of-two scaling on a real GPT step
// (scaled training ends bit-identical to unscaled training).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <ddp/nn/gpt.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/parameter.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/clip.hpp>
#include <ddp/optim/grad_scaler.hpp>
#include <ddp/optim/param_groups.hpp>

#include "set_grad.hpp"

using namespace ddp;
using ddp::test::set_grad;

namespace {
using Param = nn::Parameter<float, Cpu>;
using Scaler = optim::GradScaler<float, Cpu>;


// `steps` AdamW steps of a small GPT on fixed ids, clipped to 0.5, through a scaler with these options; returns
// the parameters' bytes afterwards. The scaler's state is left in *out.
std::vector<float> train_gpt(const optim::GradScalerOptions& so, int steps, Scaler* out = nullptr) {
  Exec<Cpu> exec;
  nn::GPT<float, Cpu> net({.vocab_size = 11, .block_size = 6, .n_layer = 1, .n_head = 2, .n_embd = 8,
                           .embd_pdrop = 0.0, .resid_pdrop = 0.0, .seed = 5});
  optim::AdamW<float, Cpu> opt(optim::linear_weight_decay_groups(net, 0.1),
                               {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1});
  Scaler scaler(so);
  nn::CrossEntropyLoss<float, Cpu> ce;
  Tensor<std::int64_t, Cpu> ids(Shape{2, 6}), targets(Shape{12});
  for (std::int64_t i = 0; i < 12; ++i) {
    ids.data()[i] = (i * 7 + 3) % 11;
    targets.data()[i] = (i * 5 + 1) % 11;
  }
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    const Tensor<float, Cpu> logits = net.forward(exec, ids.cview());
    ce.forward(exec, logits.cview().reshape(Shape{12, 11}), targets.cview());
    Tensor<float, Cpu> dlogits = ce.backward(exec);
    scaler.scale_grad(exec, dlogits.view());
    dlogits.reshape(logits.shape());
    net.backward(exec, dlogits.cview());
    const optim::UnscaleResult u = scaler.unscale(exec, net.parameters());
    REQUIRE_FALSE(u.found_inf);
    optim::clip_to_norm(exec, net.parameters(), 0.5, u.norm);
    CHECK(scaler.step(exec, opt));
    scaler.update();
  }
  std::vector<float> flat;
  for (auto* p : net.parameters()) flat.insert(flat.end(), p->value().data(), p->value().data() + p->numel());
  if (out) *out = scaler;
  return flat;
}
}  // namespace

TEST_SUITE("optim") {
  TEST_CASE("GradScaler: torch's rule, step by step (growth_interval 3, factors 2 and 0.5)") {
    Exec<Cpu> exec;
    Param p("w", Shape{2});
    p.value().data()[0] = p.value().data()[1] = 1.0f;
    optim::AdamW<float, Cpu> opt({&p}, {.lr = 0.1, .weight_decay = 0.0});
    Scaler scaler({.init_scale = 8.0, .growth_interval = 3});
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    // Gradients as backward would leave them (already multiplied by the scale), the expected scale after update()
    // and whether the optimizer steps. Written out from torch.cuda.amp.GradScaler's documentation: three finite
    // steps in a row double the scale, any inf/NaN halves it and restarts the count.
    struct Row {
      std::vector<float> grad;
      bool steps;
      double scale_after;
    };
    const std::vector<Row> rows = {
        {{8.0f, 16.0f}, true, 8.0},    // finite 1
        {{8.0f, 16.0f}, true, 8.0},    // finite 2
        {{8.0f, 16.0f}, true, 16.0},   // finite 3: grows
        {{inf, 16.0f}, false, 8.0},    // overflow: backs off, skipped
        {{16.0f, 8.0f}, true, 8.0},    // finite 1 (the count restarted)
        {{nan, 1.0f}, false, 4.0},     // NaN counts as an overflow
        {{4.0f, 4.0f}, true, 4.0},     // finite 1
        {{4.0f, 4.0f}, true, 4.0},     // finite 2
        {{4.0f, 4.0f}, true, 8.0},     // finite 3: grows
    };
    long steps = 0, skipped = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      CAPTURE(i);
      const double s = scaler.scale();
      set_grad(p, rows[i].grad);
      const float before = p.value().data()[0];
      const optim::UnscaleResult u = scaler.unscale(exec, {&p});
      CHECK(u.found_inf == !rows[i].steps);
      if (rows[i].steps) {
        // Divided by the scale, exactly (powers of two); the norm is the unscaled one.
        CHECK(p.grad().data()[0] == rows[i].grad[0] / static_cast<float>(s));
        CHECK(u.norm == doctest::Approx(std::hypot(rows[i].grad[0], rows[i].grad[1]) / s));
      }
      CHECK(scaler.step(exec, opt) == rows[i].steps);
      scaler.update();
      (rows[i].steps ? steps : skipped) += 1;
      CHECK(scaler.scale() == rows[i].scale_after);
      CHECK(opt.steps() == steps);
      CHECK(scaler.skipped_steps() == skipped);
      if (!rows[i].steps) CHECK(p.value().data()[0] == before);  // a skipped step moves nothing
    }
    CHECK(opt.param_step(0) == 7);  // AdamW's own count only advanced on the 7 finite steps
  }

  TEST_CASE("GradScaler: power-of-two scaling is exact -- a scaled GPT run ends bit-identical to an unscaled one") {
    const std::vector<float> plain = train_gpt({.enabled = false}, 5);
    Scaler end;
    // init 2^20, growing every 2 steps: the scale moves during the run (2^20 -> 2^22 after 4 steps).
    const std::vector<float> scaled = train_gpt({.init_scale = 1048576.0, .growth_interval = 2}, 5, &end);
    CHECK(end.scale() == 4194304.0);
    REQUIRE(plain.size() == scaled.size());
    CHECK(std::memcmp(plain.data(), scaled.data(), plain.size() * sizeof(float)) == 0);
    // The control: a scale that is not a power of two rounds, so the runs differ (the equality above can fail).
    const std::vector<float> odd = train_gpt({.init_scale = 1000.0, .growth_interval = 100}, 5);
    CHECK(std::memcmp(plain.data(), odd.data(), plain.size() * sizeof(float)) != 0);
  }

  TEST_CASE("GradScaler: disabled is the identity; misuse and bad options are errors") {
    Exec<Cpu> exec;
    Param p("w", Shape{2});
    optim::SGD<float, Cpu> opt({&p}, {.lr = 0.1});
    Scaler off({.init_scale = 1024.0, .enabled = false});
    CHECK(off.scale() == 1.0);
    set_grad(p, {3.0f, 4.0f});
    const auto u = off.unscale(exec, {&p});
    CHECK(u.norm == 5.0);
    CHECK(p.grad().data()[0] == 3.0f);
    CHECK_THROWS_WITH_AS(off.unscale(exec, {&p}),
                         "ddp: GradScaler::unscale called twice in one step; call update() after each step",
                         ValueError);
    CHECK(off.step(exec, opt));
    off.update();
    CHECK_THROWS_WITH_AS(off.update(), "ddp: GradScaler::update called without unscale or step in this step",
                         ValueError);
    CHECK_THROWS_WITH_AS(Scaler({.init_scale = 0.0}), "ddp: GradScaler's init_scale must be finite and > 0, got 0",
                         ValueError);
    CHECK_THROWS_WITH_AS(Scaler({.growth_factor = 1.0}), "ddp: GradScaler's growth_factor must be finite and > 1, got 1",
                         ValueError);
    CHECK_THROWS_WITH_AS(Scaler({.backoff_factor = 1.0}), "ddp: GradScaler's backoff_factor must be in (0, 1), got 1",
                         ValueError);
    CHECK_THROWS_WITH_AS(Scaler({.growth_interval = 0}), "ddp: GradScaler's growth_interval must be >= 1, got 0",
                         ValueError);
  }

  TEST_CASE("GradScaler: state() and load_state() round-trip a snapshot's metadata") {
    Exec<Cpu> exec;
    Param p("w", Shape{1});
    optim::SGD<float, Cpu> opt({&p}, {.lr = 0.1});
    Scaler a({.init_scale = 3.0, .growth_interval = 5});  // not a power of two: the text must keep every bit
    for (float g : {1.0f, std::numeric_limits<float>::infinity(), 1.0f, 1.0f}) {
      set_grad(p, {g});
      a.step(exec, opt);
      a.update();
    }
    const auto meta = a.state();
    CHECK(meta.at("grad_scaler.scale") == "1.5");
    Scaler b({.growth_interval = 5});
    b.load_state(meta, "s.safetensors");
    CHECK(b.scale() == 1.5);
    CHECK(b.finite_run() == 2);
    CHECK(b.skipped_steps() == 1);
    Scaler c;
    c.load_state({}, "old.safetensors");  // a snapshot without a scaler: the defaults stay
    CHECK(c.scale() == 65536.0);
    CHECK_THROWS_WITH_AS(c.load_state({{"grad_scaler.scale", "big"}}, "s.safetensors"),
                         "ddp: snapshot 's.safetensors': metadata grad_scaler.scale = 'big' is not a number",
                         ValueError);
    CHECK_THROWS_WITH_AS(c.load_state({{"grad_scaler.scale", "-2"}}, "s.safetensors"),
                         "ddp: snapshot 's.safetensors': invalid grad_scaler state (scale -2, finite_run 0, "
                         "skipped_steps 0)",
                         ValueError);
  }
}
