// Learning-rate schedules as pure functions of the optimizer step: linear warmup, then constant,
// step, multi-step or cosine decay.
// SPDX-License-Identifier: MIT
//
// lr_at(t) is the rate of optimizer step t (0-based), the closed form of what torch's schedulers
// give after t calls of scheduler.step(), one per optimizer step:
//   constant:  base                                       (torch: no scheduler)
//   step:      base * gamma^floor(t / step_size)          StepLR(step_size, gamma)
//   multistep: base * gamma^(number of milestones <= t)   MultiStepLR(milestones, gamma)
//   cosine:    eta_min + (base - eta_min) * (1 + cos(pi t / t_max)) / 2
//                                                         CosineAnnealingLR(t_max, eta_min)
// The cosine is not clamped: like torch's, it rises again after t_max (period 2 t_max); choose
// t_max = the steps after warmup to end at eta_min. Example: base 0.1, t_max 10: 0.05 at t = 5, 0
// at 10, 0.05 at 15, 0.1 at 20. With warmup_steps = W > 0 the first W steps ramp linearly and the
// schedule X starts at step W from its own step 0, torch's
// SequentialLR([LinearLR(start_factor, 1.0, total_iters=W), X], milestones=[W]):
//   t < W:   base * (warmup_start_factor + (1 - warmup_start_factor) * t / W)
//   t >= W:  X(t - W)
// Example: base 0.4, W 4, start factor 0.25: 0.1, 0.175, 0.25, 0.325, then X(0) = 0.4 at t = 4.
// All counts are optimizer steps (the caller converts epochs: epochs * steps per epoch). The only
// state is the step, which the optimizer counts (steps(), in snapshots): apply(opt) resumes it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::optim {

enum class LrPolicy { Constant, Step, MultiStep, Cosine };

struct LrScheduleOptions {
  LrPolicy policy = LrPolicy::Constant;
  double base_lr = 0.1;
  std::int64_t step_size = 30;  // Step: steps between decays
  double gamma = 0.1;           // Step, MultiStep: decay factor
  // MultiStep: steps (after warmup) at which lr *= gamma, increasing
  std::vector<std::int64_t> milestones;
  std::int64_t t_max = 90;        // Cosine: steps of one half-period
  double eta_min = 0.0;           // Cosine: the minimum
  std::int64_t warmup_steps = 0;  // W: linear warmup steps before the schedule (0: none)
  // the first step's lr is base * this (torch LinearLR's default)
  double warmup_start_factor = 1.0 / 3;
};

// "constant" | "step" | "multistep" | "cosine"; anything else is a ConfigError listing them.
inline LrPolicy parse_lr_policy(const std::string& s) {
  if (s == "constant") return LrPolicy::Constant;
  if (s == "step") return LrPolicy::Step;
  if (s == "multistep") return LrPolicy::MultiStep;
  if (s == "cosine") return LrPolicy::Cosine;
  throw ConfigError(ddp::detail::str("ddp: unknown learning-rate schedule ", ddp::detail::quoted(s),
                                     "; valid: constant, step, multistep, cosine (--lr-schedule)"));
}

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleOptions& o) : o_(o) {
    if (!(o.base_lr >= 0.0) || o.step_size < 1 || o.t_max < 1 || o.warmup_steps < 0 ||
        !(o.gamma > 0.0) || !(o.eta_min >= 0.0) ||
        !(o.warmup_start_factor > 0.0 && o.warmup_start_factor <= 1.0))
      throw ValueError(
          ddp::detail::str("ddp: invalid LR schedule: base_lr ", o.base_lr, " (>= 0), step_size ",
                           o.step_size, " (>= 1), gamma ", o.gamma, " (> 0), t_max ", o.t_max,
                           " (>= 1), eta_min ", o.eta_min, " (>= 0), warmup_steps ", o.warmup_steps,
                           " (>= 0), warmup_start_factor ", o.warmup_start_factor, " (in (0, 1])"));
    for (std::size_t i = 0; i < o.milestones.size(); ++i)
      if (o.milestones[i] < 1 || (i > 0 && o.milestones[i] <= o.milestones[i - 1]))
        throw ValueError(ddp::detail::str(
            "ddp: invalid LR schedule: milestones [", ddp::detail::join(o.milestones, ", "),
            "] must be positive and strictly increasing (steps after warmup)"));
    if (o.policy == LrPolicy::MultiStep && o.milestones.empty())
      throw ValueError(
          "ddp: invalid LR schedule: multistep needs at least one milestone (--lr-milestones)");
  }

  // The learning rate of optimizer step `step` (0-based; negative counts as 0).
  double lr_at(std::int64_t step) const { return lr_at(step, o_.base_lr); }
  // The same schedule from `base_lr` (a group's own initial lr); eta_min stays absolute (torch).
  double lr_at(std::int64_t step, double base_lr) const {
    if (step < 0) step = 0;
    const std::int64_t w = o_.warmup_steps;
    if (step < w)
      return base_lr *
             (o_.warmup_start_factor +
              (1.0 - o_.warmup_start_factor) * static_cast<double>(step) / static_cast<double>(w));
    const std::int64_t t = step - w;
    switch (o_.policy) {
      case LrPolicy::Step:
        return base_lr * std::pow(o_.gamma, static_cast<double>(t / o_.step_size));
      case LrPolicy::MultiStep: {
        std::int64_t passed = 0;
        for (std::int64_t m : o_.milestones) passed += m <= t ? 1 : 0;
        return base_lr * std::pow(o_.gamma, static_cast<double>(passed));
      }
      case LrPolicy::Cosine:
        return o_.eta_min + (base_lr - o_.eta_min) *
                                (1.0 + std::cos(std::numbers::pi * static_cast<double>(t) /
                                                static_cast<double>(o_.t_max))) /
                                2.0;
      case LrPolicy::Constant:
      default: return base_lr;
    }
  }

  // Sets opt's learning rates for its next step, opt.steps(); call before each opt.step() and after
  // a resume. A group with its own lr follows the schedule from that initial lr.
  template <class Opt>
  void apply(Opt& opt) const {
    const std::int64_t step = opt.steps();
    opt.set_lr(lr_at(step));
    for (std::size_t g = 0; g < opt.groups().size(); ++g)
      if (const auto& initial = opt.groups()[g].lr) opt.set_group_lr(g, lr_at(step, *initial));
  }

  const LrScheduleOptions& options() const noexcept { return o_; }

 private:
  LrScheduleOptions o_;
};

}  // namespace ddp::optim
