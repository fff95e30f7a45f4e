// SGD against torch.optim.SGD's rule computed by hand (values from PyTorch 1.13 noted), and LR schedules.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <ddp/nn/parameter.hpp>
#include <ddp/optim/lr_schedule.hpp>
#include <ddp/optim/sgd.hpp>

using namespace ddp;

namespace {

// Runs `steps` SGD steps on one scalar parameter p0 with a constant gradient g; returns p after each.
std::vector<double> run(const optim::SgdOptions& o, float p0, float g, int steps) {
  kernels::cpu::ThreadPool pool(1);
  Exec<Cpu> exec{.pool = &pool};
  nn::Parameter<float, Cpu> p("w", Shape{1});
  p.value().data()[0] = p0;
  optim::SGD<float, Cpu> opt({&p}, o);
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    p.grad().data()[0] = g;
    p.set_grad_written();  // a gradient written by hand exists (has_grad()); optimizers skip parameters without
    opt.step(exec);
    out.push_back(p.value().data()[0]);
  }
  return out;
}

// PyTorch's rule in double, as the reference.
std::vector<double> torch_rule(const optim::SgdOptions& o, double p, double g0, int steps) {
  std::vector<double> out;
  double buf = 0;
  for (int i = 0; i < steps; ++i) {
    double g = g0 + o.weight_decay * p;
    if (o.momentum != 0) {
      buf = i == 0 ? g : o.momentum * buf + (1 - o.dampening) * g;
      g = o.nesterov ? g + o.momentum * buf : buf;
    }
    p -= o.lr * g;
    out.push_back(p);
  }
  return out;
}

}  // namespace

TEST_SUITE("optim") {
  TEST_CASE("the worked example of sgd.hpp") {
    const auto p = run({.lr = 0.1, .momentum = 0.9}, 1.0f, 0.5f, 2);
    CHECK(p[0] == doctest::Approx(0.95));
    CHECK(p[1] == doctest::Approx(0.855));
  }

  TEST_CASE("momentum, dampening, nesterov and weight decay follow torch.optim.SGD") {
    const std::vector<optim::SgdOptions> cases = {
        {.lr = 0.1},
        {.lr = 0.05, .momentum = 0.9},
        {.lr = 0.05, .momentum = 0.9, .dampening = 0.3},
        {.lr = 0.05, .momentum = 0.9, .nesterov = true},
        {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-2},
        {.lr = 0.2, .momentum = 0.5, .dampening = 0.1, .weight_decay = 5e-2},
        {.lr = 0.2, .momentum = 0.5, .weight_decay = 5e-2, .nesterov = true}};
    for (const auto& o : cases) {
      const auto ours = run(o, 1.5f, -0.25f, 5);
      const auto ref = torch_rule(o, 1.5, -0.25, 5);
      for (std::size_t i = 0; i < ours.size(); ++i) CHECK(ours[i] == doctest::Approx(ref[i]).epsilon(1e-6));
    }
  }

  TEST_CASE("momentum buffers are exposed for snapshots and restored") {
    kernels::cpu::ThreadPool pool(1);
    Exec<Cpu> exec{.pool = &pool};
    nn::Parameter<float, Cpu> p("w", Shape{2});
    optim::SGD<float, Cpu> opt({&p}, {.lr = 0.1, .momentum = 0.9});
    CHECK(opt.momentum_buffer(0) == nullptr);
    p.grad().data()[0] = 1.0f;
    p.grad().data()[1] = 2.0f;
    p.set_grad_written();
    opt.step(exec);
    REQUIRE(opt.momentum_buffer(0) != nullptr);
    CHECK(opt.momentum_buffer(0)->data()[1] == 2.0f);
    CHECK(opt.steps() == 1);
    // The generic state interface (snapshots) names it; another name is refused, as AdamW does.
    CHECK(opt.state("momentum_buffer", 0) == opt.momentum_buffer(0));
    CHECK_THROWS_WITH_AS(opt.state("exp_avg", 0), "ddp: SGD has no state 'exp_avg'; it keeps momentum_buffer",
                         ValueError);
    CHECK_THROWS_AS(opt.set_state("momentum", 0), ValueError);
  }

  TEST_CASE("invalid options are ValueErrors") {
    nn::Parameter<float, Cpu> p("w", Shape{1});
    auto make = [&](const optim::SgdOptions& o) { return optim::SGD<float, Cpu>({&p}, o); };
    auto make_empty = [] { return optim::SGD<float, Cpu>(std::vector<nn::Parameter<float, Cpu>*>{}, {}); };
    CHECK_THROWS_WITH_AS(make({.lr = -1}), "ddp: SGD: invalid learning rate -1 (--lr must be >= 0)", ValueError);
    CHECK_THROWS_WITH_AS(make({.lr = 0.1, .momentum = 0.0, .nesterov = true}),
                         "ddp: SGD: nesterov momentum requires momentum > 0 and dampening 0, got momentum 0 and "
                         "dampening 0",
                         ValueError);
    CHECK_THROWS_WITH_AS(make_empty(),
                         "ddp: SGD got an empty parameter list; pass model.parameters()", ValueError);
  }

  // The per-step schedules against torch itself are in tests/interop/torch_optim; these pin the closed forms.
  TEST_CASE("step, multistep and cosine schedules with per-step linear warmup") {
    const optim::LrSchedule step({.policy = optim::LrPolicy::Step, .base_lr = 0.1, .step_size = 30, .gamma = 0.1});
    CHECK(step.lr_at(0) == doctest::Approx(0.1));
    CHECK(step.lr_at(29) == doctest::Approx(0.1));
    CHECK(step.lr_at(30) == doctest::Approx(0.01));
    CHECK(step.lr_at(65) == doctest::Approx(0.001));
    const optim::LrSchedule cos({.policy = optim::LrPolicy::Cosine, .base_lr = 0.1, .t_max = 10});
    CHECK(cos.lr_at(0) == doctest::Approx(0.1));
    CHECK(cos.lr_at(5) == doctest::Approx(0.05));
    CHECK(cos.lr_at(10) == doctest::Approx(0.0));
    // torch's CosineAnnealingLR is not clamped at t_max: it rises again (the old per-epoch code clamped).
    CHECK(cos.lr_at(15) == doctest::Approx(0.05));
    CHECK(cos.lr_at(20) == doctest::Approx(0.1));
    const optim::LrSchedule multi(
        {.policy = optim::LrPolicy::MultiStep, .base_lr = 1.0, .gamma = 0.5, .milestones = {3, 5}});
    CHECK(multi.lr_at(2) == 1.0);
    CHECK(multi.lr_at(3) == 0.5);
    CHECK(multi.lr_at(5) == 0.25);
    CHECK(multi.lr_at(100) == 0.25);
    // The worked example of lr_schedule.hpp: warmup is per step, then the schedule from its own step 0.
    const optim::LrSchedule warm({.policy = optim::LrPolicy::Cosine, .base_lr = 0.4, .t_max = 10, .warmup_steps = 4,
                                  .warmup_start_factor = 0.25});
    CHECK(warm.lr_at(0) == doctest::Approx(0.1));
    CHECK(warm.lr_at(1) == doctest::Approx(0.175));
    CHECK(warm.lr_at(3) == doctest::Approx(0.325));
    CHECK(warm.lr_at(4) == doctest::Approx(0.4));
    CHECK(warm.lr_at(9) == doctest::Approx(0.2));
    CHECK_THROWS_WITH_AS(optim::parse_lr_policy("linear"),
                         "ddp: unknown learning-rate schedule 'linear'; valid: constant, step, multistep, cosine "
                         "(--lr-schedule)",
                         ConfigError);
    CHECK(optim::parse_lr_policy("multistep") == optim::LrPolicy::MultiStep);
    CHECK_THROWS_WITH_AS(optim::LrSchedule({.policy = optim::LrPolicy::MultiStep, .milestones = {5, 5}}),
                         "ddp: invalid LR schedule: milestones [5, 5] must be positive and strictly increasing "
                         "(steps after warmup)",
                         ValueError);
    CHECK_THROWS_WITH_AS(optim::LrSchedule({.policy = optim::LrPolicy::MultiStep}),
                         "ddp: invalid LR schedule: multistep needs at least one milestone (--lr-milestones)",
                         ValueError);
  }
}
