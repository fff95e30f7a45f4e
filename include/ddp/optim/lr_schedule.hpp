// Learning-rate schedules as pure functions of the epoch: step decay and cosine annealing (+ linear warmup).
// SPDX-License-Identifier: MIT
//
// Closed forms of torch.optim.lr_scheduler.StepLR and CosineAnnealingLR (no state, so a resumed run gets
// the same rate for the same epoch without saving the scheduler):
//   step:   lr(e) = base * gamma^floor(e / step_size)              e.g. base 0.1, step 30, gamma 0.1: 0.1, ..., 0.01 at 30
//   cosine: lr(e) = eta_min + (base - eta_min) (1 + cos(pi e / t_max)) / 2,   e in [0, t_max]; e.g. t_max 10: 0.05 at 5
// With warmup_epochs = w > 0 the first w epochs ramp linearly: lr(e) = base (e + 1) / w for e < w, and
// the schedule proper is evaluated at e - w afterwards.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::optim {

enum class LrPolicy { Constant, Step, Cosine };

struct LrScheduleOptions {
  LrPolicy policy = LrPolicy::Constant;
  double base_lr = 0.1;
  std::int64_t step_size = 30;  // Step: epochs between decays
  double gamma = 0.1;           // Step: decay factor
  std::int64_t t_max = 90;      // Cosine: epochs of one half-period
  double eta_min = 0.0;         // Cosine: floor
  std::int64_t warmup_epochs = 0;
};

// "constant" | "step" | "cosine" -> LrPolicy; anything else is a ConfigError listing the choices.
inline LrPolicy parse_lr_policy(const std::string& s) {
  if (s == "constant") return LrPolicy::Constant;
  if (s == "step") return LrPolicy::Step;
  if (s == "cosine") return LrPolicy::Cosine;
  throw ConfigError(ddp::detail::str("ddp: unknown learning-rate schedule ", ddp::detail::quoted(s),
                                     "; valid: constant, step, cosine (--lr-schedule)"));
}

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleOptions& o) : o_(o) {
    if (o.base_lr < 0.0 || o.step_size < 1 || o.t_max < 1 || o.warmup_epochs < 0 || o.gamma <= 0.0)
      throw ValueError(ddp::detail::str("ddp: invalid LR schedule: base_lr ", o.base_lr, " (>= 0), step_size ",
                                        o.step_size, " (>= 1), gamma ", o.gamma, " (> 0), t_max ", o.t_max,
                                        " (>= 1), warmup_epochs ", o.warmup_epochs, " (>= 0)"));
  }

  // The learning rate for `epoch` (0-based). Epochs may also be fractional (e.g. per-step updates).
  double lr_at(double epoch) const {
    if (epoch < 0) epoch = 0;
    const double w = static_cast<double>(o_.warmup_epochs);
    if (epoch < w) return o_.base_lr * (std::floor(epoch) + 1.0) / w;
    const double e = epoch - w;
    switch (o_.policy) {
      case LrPolicy::Step:
        return o_.base_lr * std::pow(o_.gamma, std::floor(e / static_cast<double>(o_.step_size)));
      case LrPolicy::Cosine: {
        const double t = std::min(e, static_cast<double>(o_.t_max));
        return o_.eta_min +
               (o_.base_lr - o_.eta_min) * (1.0 + std::cos(std::numbers::pi * t / static_cast<double>(o_.t_max))) / 2.0;
      }
      case LrPolicy::Constant:
      default:
        return o_.base_lr;
    }
  }
  const LrScheduleOptions& options() const noexcept { return o_; }

 private:
  LrScheduleOptions o_;
};

}  // namespace ddp::optim
