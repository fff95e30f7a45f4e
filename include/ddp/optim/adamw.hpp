// AdamW: torch.optim.AdamW (decoupled weight decay, bias-corrected moments, parameter groups;
// amsgrad and maximize unsupported).
// SPDX-License-Identifier: MIT
//
// Per parameter p, gradient g, own step count t (torch 1.13's _single_tensor_adamw; AdamwStep):
//   t += 1
//   p  = p * (1 - lr * weight_decay)              decay on the weights, not on the gradient
//   m  = beta1 * m + (1 - beta1) * g              exp_avg,    zeros before the first step
//   v  = beta2 * v + (1 - beta2) * g^2            exp_avg_sq, zeros before the first step
//   p  = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Example: lr 0.1, weight_decay 0, p = 1, g = 2 on the first step: m = 0.2, v = 0.004, the
// corrections make m / sqrt(v) = 1, so p = 0.9 (Adam's first step is lr * sign(g)). A parameter
// without a gradient (has_grad() false: torch's .grad is None) is skipped as torch skips it: no
// decay, its moments keep their values and its step count does not move, so its bias corrections
// differ from a parameter stepped every time. Parameter groups override lr and weight_decay.
// Snapshot state per parameter: torch's state[p]['exp_avg'], ['exp_avg_sq'] and ['step'].
// Not thread-safe; step() must not overlap a backward.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/param_groups.hpp"

namespace ddp::optim {

struct AdamwOptions {  // torch.optim.AdamW's defaults
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

template <class T, Device D>
class AdamW : public detail::GroupedOptimizer<T, D, AdamwOptions> {
  using Base = detail::GroupedOptimizer<T, D, AdamwOptions>;
  using Base::flat_;
  using Base::o_;
  using Base::steps_;

 public:
  using value_type = T;
  using device_type = D;
  static constexpr std::string_view kind = "adamw";
  static constexpr std::array<StateTensor, 2> state_tensors{
      StateTensor{"exp_avg", "first moment"}, StateTensor{"exp_avg_sq", "second moment"}};

  AdamW(std::vector<ParamGroup<T, D>> groups, const AdamwOptions& o)
      : Base(o, validated(std::move(groups), o), "AdamW") {
    exp_avg_.resize(flat_.params.size());
    exp_avg_sq_.resize(flat_.params.size());
    param_steps_.assign(flat_.params.size(), 0);
  }
  AdamW(std::vector<nn::Parameter<T, D>*> params, const AdamwOptions& o)
      : AdamW(std::vector<ParamGroup<T, D>>{ParamGroup<T, D>{.params = std::move(params)}}, o) {}
  // AdamW({&a, &b}, o): without this overload the braces would also match vector<ParamGroup>'s
  // iterator-pair constructor.
  AdamW(std::initializer_list<nn::Parameter<T, D>*> params, const AdamwOptions& o)
      : AdamW(std::vector<nn::Parameter<T, D>*>(params), o) {}
  template <class A>  // any activation type: the parameters are T
  AdamW(nn::Module<T, D, A>& model, const AdamwOptions& o) : AdamW(model.parameters(), o) {}

  // One update of every parameter that has a gradient, in one Kernels<D>::adamw_step_multi call.
  void step(Exec<D>& exec) {
    std::vector<kernels::AdamwTensor<T>> ts;
    ts.reserve(flat_.params.size());
    for (std::size_t i = 0; i < flat_.params.size(); ++i) {
      nn::Parameter<T, D>& p = *flat_.params[i];
      if (!p.has_grad()) continue;
      if (param_steps_[i] == 0) init_moments(i);
      ++param_steps_[i];
      const std::size_t g = flat_.group_of[i];
      ts.push_back(kernels::AdamwTensor<T>{.param = p.value().data(),
                                           .grad = p.grad().data(),
                                           .exp_avg = exp_avg_[i].data(),
                                           .exp_avg_sq = exp_avg_sq_[i].data(),
                                           .numel = p.numel(),
                                           .lr = flat_.group_lr(g, o_.lr),
                                           .weight_decay = flat_.weight_decay(g, o_.weight_decay),
                                           .step = param_steps_[i]});
    }
    if (!ts.empty())
      Kernels<D>::adamw_step_multi(
          exec, kernels::MultiAdamwArgs<T, D>{
                    .tensors = ts, .beta1 = o_.beta1, .beta2 = o_.beta2, .eps = o_.eps});
    ++steps_;
  }

  // Steps parameter i has taken (0: no state yet); exp_avg / exp_avg_sq exist exactly when > 0.
  std::int64_t param_step(std::size_t i) const { return param_steps_.at(i); }
  // Sets parameter i's step count (snapshots); n > 0 creates zero moments if none, 0 drops them.
  void set_param_step(std::size_t i, std::int64_t n) {
    if (n < 0)
      throw ValueError(
          ddp::detail::str("ddp: AdamW: step count ", n, " of parameter ", i, " must be >= 0"));
    if (n > 0 && !has_moments(i)) init_moments(i);
    if (n == 0) drop_moments(i);
    param_steps_.at(i) = n;
  }
  // "exp_avg" or "exp_avg_sq" of parameter i, or nullptr before its first step.
  Tensor<T, D>* state(std::string_view name, std::size_t i) {
    if (param_steps_.at(i) == 0) return nullptr;
    return &moment(name, i);
  }
  // Moment `name` of parameter i for the caller to fill; creates both (zeros) if i had none. It
  // counts as state once param_step(i) > 0: a snapshot restores both moments and the step count.
  Tensor<T, D>& set_state(std::string_view name, std::size_t i) {
    if (!has_moments(i)) init_moments(i);
    return moment(name, i);
  }
  void clear_state() {
    for (std::size_t i = 0; i < flat_.params.size(); ++i) drop_moments(i);
    param_steps_.assign(flat_.params.size(), 0);
  }

 private:
  static detail::FlatGroups<T, D> validated(std::vector<ParamGroup<T, D>> groups,
                                            const AdamwOptions& o) {
    if (!(o.lr >= 0.0))
      throw ValueError(
          ddp::detail::str("ddp: AdamW: invalid learning rate ", o.lr, " (--lr must be >= 0)"));
    if (!(o.eps >= 0.0))
      throw ValueError(ddp::detail::str("ddp: AdamW: invalid eps ", o.eps, " (must be >= 0)"));
    if (!(o.beta1 >= 0.0 && o.beta1 < 1.0) || !(o.beta2 >= 0.0 && o.beta2 < 1.0))
      throw ValueError(ddp::detail::str("ddp: AdamW: invalid betas (", o.beta1, ", ", o.beta2,
                                        "); each must be in [0, 1)"));
    if (!(o.weight_decay >= 0.0))
      throw ValueError(
          ddp::detail::str("ddp: AdamW: invalid weight_decay ", o.weight_decay, " (must be >= 0)"));
    return detail::FlatGroups<T, D>(std::move(groups), "AdamW");
  }
  bool has_moments(std::size_t i) const { return !exp_avg_.at(i).empty(); }
  void drop_moments(std::size_t i) {
    exp_avg_.at(i) = Tensor<T, D>();
    exp_avg_sq_.at(i) = Tensor<T, D>();
  }
  void init_moments(std::size_t i) {
    const Shape& s = flat_.params[i]->shape();
    exp_avg_[i] = Tensor<T, D>(s);
    exp_avg_sq_[i] = Tensor<T, D>(s);
    nn::detail::zero_fill(exp_avg_[i]);
    nn::detail::zero_fill(exp_avg_sq_[i]);
  }
  Tensor<T, D>& moment(std::string_view name, std::size_t i) {
    if (name == "exp_avg") return exp_avg_.at(i);
    if (name == "exp_avg_sq") return exp_avg_sq_.at(i);
    throw ValueError(
        ddp::detail::str("ddp: AdamW has no state '", name, "'; it keeps exp_avg and exp_avg_sq"));
  }

  // [i]: parameters()[i]'s shape once it has state, else empty
  std::vector<Tensor<T, D>> exp_avg_, exp_avg_sq_;
  std::vector<std::int64_t> param_steps_;  // torch's state['step'] per parameter
};

}  // namespace ddp::optim
