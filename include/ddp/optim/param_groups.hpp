// Parameter groups (torch's optimizer param_groups): per-group weight decay and learning rate, the
// usual split of a model into "decay" and "no decay" groups, and GroupedOptimizer, what SGD and
// AdamW share around them.
// SPDX-License-Identifier: MIT
//
// A group is a list of parameters plus the hyper-parameters it overrides. A group without its own
// lr follows the optimizer's lr() (set_lr); one with its own keeps it (set_group_lr), and
// LrSchedule::apply schedules it from that initial value, as torch's schedulers use initial_lr.
//   torch: AdamW([{"params": decay, "weight_decay": 0.05},
//                 {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
//   ddp:   AdamW<float, D>(weight_decay_groups(model, 0.05), {.lr = 1e-3})
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/linear.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::optim {

template <class T, Device D>
struct ParamGroup {
  std::vector<nn::Parameter<T, D>*> params;
  std::optional<double> weight_decay;  // unset: the optimizer's options().weight_decay
  std::optional<double> lr;            // unset: the optimizer's lr(); set: this group's initial lr
  std::string name;                    // for messages and inspection, e.g. "decay", "no_decay"
};

namespace detail {
// Two groups of `params` (in their order): "decay" (is_decay(p)) with `weight_decay`, "no_decay"
// with 0; a group with no parameter is left out.
template <class T, Device D, class IsDecay>
std::vector<ParamGroup<T, D>> split_decay(const std::vector<nn::Parameter<T, D>*>& params,
                                          double weight_decay, IsDecay is_decay) {
  ParamGroup<T, D> decay{.weight_decay = weight_decay, .name = "decay"};
  ParamGroup<T, D> no_decay{.weight_decay = 0.0, .name = "no_decay"};
  for (auto* p : params) (is_decay(*p) ? decay : no_decay).params.push_back(p);
  std::vector<ParamGroup<T, D>> out;
  if (!decay.params.empty()) out.push_back(std::move(decay));
  if (!no_decay.params.empty()) out.push_back(std::move(no_decay));
  return out;
}
}  // namespace detail

// The common recipe: "decay" (parameters of rank >= 2: conv and linear weights) with
// `weight_decay` and "no_decay" (biases, BatchNorm weights and biases) with 0, each in `params`
// order; an empty group is left out.
template <class T, Device D>
std::vector<ParamGroup<T, D>> weight_decay_groups(const std::vector<nn::Parameter<T, D>*>& params,
                                                  double weight_decay) {
  return detail::split_decay(params, weight_decay,
                             [](const nn::Parameter<T, D>& p) { return p.shape().rank() >= 2; });
}
template <class T, Device D, class A>
std::vector<ParamGroup<T, D>> weight_decay_groups(nn::Module<T, D, A>& model, double weight_decay) {
  return weight_decay_groups(model.parameters(), weight_decay);
}

// minGPT's recipe (the DDP tutorial's create_optimizer): "decay" holds nn::Linear weights only
// (c_attn's included); biases, LayerNorm and Embedding weights and pos_emb are "no_decay". In
// model.parameters() order (the tutorial sorts by name, which only renumbers torch's state).
template <class T, Device D>
std::vector<ParamGroup<T, D>> linear_weight_decay_groups(nn::Module<T, D>& model,
                                                         double weight_decay) {
  std::set<const nn::Parameter<T, D>*> linear_weights;
  model.visit([&](nn::Module<T, D>& m) {
    if (auto* l = dynamic_cast<nn::Linear<T, D>*>(&m)) linear_weights.insert(&l->weight());
  });
  return detail::split_decay(model.parameters(), weight_decay, [&](const nn::Parameter<T, D>& p) {
    return linear_weights.contains(&p);
  });
}

namespace detail {

// The groups flattened: parameter i is params[i], in group group_of[i]. Snapshots and state
// accessors use these indices (groups in order, then each group's list, as torch's state_dict).
template <class T, Device D>
struct FlatGroups {
  std::vector<nn::Parameter<T, D>*> params;
  std::vector<std::size_t> group_of;
  // as given (lr: the initial one), with params cleared (params holds them)
  std::vector<ParamGroup<T, D>> groups;
  std::vector<std::optional<double>> lr;  // each group's current own lr (unset: the optimizer's)

  // Validates (no null, no parameter twice, at least one parameter, lr and weight decay >= 0);
  // `who` names the optimizer in messages.
  FlatGroups(std::vector<ParamGroup<T, D>> gs, const char* who) : groups(std::move(gs)) {
    std::set<const nn::Parameter<T, D>*> seen;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      ParamGroup<T, D>& group = groups[g];
      if ((group.lr && !(*group.lr >= 0.0)) ||
          (group.weight_decay && !(*group.weight_decay >= 0.0)))
        throw ValueError(ddp::detail::str("ddp: ", who, ": parameter group ", g, " ('", group.name,
                                          "') has lr ", group.lr.value_or(0.0),
                                          " and weight_decay ", group.weight_decay.value_or(0.0),
                                          "; both must be >= 0"));
      lr.push_back(group.lr);
      for (auto* p : group.params) {
        if (!p)
          throw ValueError(
              ddp::detail::str("ddp: ", who, ": parameter group ", g, " holds a null parameter"));
        if (!seen.insert(p).second)
          throw ValueError(
              ddp::detail::str("ddp: ", who, ": parameter '", p->name(),
                               "' appears more than once in the parameter groups (group ", g,
                               "); give each parameter to one group"));
        params.push_back(p);
        group_of.push_back(g);
      }
      group.params.clear();
    }
    if (params.empty())
      throw ValueError(
          ddp::detail::str("ddp: ", who, " got an empty parameter list; pass model.parameters()"));
  }
  double weight_decay(std::size_t g, double fallback) const {
    return groups[g].weight_decay.value_or(fallback);
  }
  double group_lr(std::size_t g, double fallback) const { return lr.at(g).value_or(fallback); }
  void set_group_lr(std::size_t g, double v, const char* who) {
    if (!(v >= 0.0))
      throw ValueError(ddp::detail::str("ddp: ", who, ": invalid learning rate ", v,
                                        " for parameter group ", g, " (must be >= 0)"));
    lr.at(g) = v;
  }
};

// Base of SGD and AdamW: the options (lr and weight_decay at least), the flattened groups, the
// step count and the Optimizer concept's accessors. `who` names the optimizer in messages.
template <class T, Device D, class Options>
class GroupedOptimizer {
 public:
  void zero_grad() {
    for (auto* p : flat_.params) p->zero_grad();
  }

  double lr() const noexcept { return o_.lr; }
  void set_lr(double lr) {
    if (!(lr >= 0.0))
      throw ValueError(
          ddp::detail::str("ddp: ", who_, ": invalid learning rate ", lr, " (must be >= 0)"));
    o_.lr = lr;
  }
  const Options& options() const noexcept { return o_; }
  // Calls of step() (the schedule's clock).
  std::int64_t steps() const noexcept { return steps_; }
  void set_steps(std::int64_t n) noexcept { steps_ = n; }
  // Every parameter, group after group; indices into this list name the per-parameter state.
  const std::vector<nn::Parameter<T, D>*>& parameters() const noexcept { return flat_.params; }
  // The groups as given (their params lists are empty: parameters() and group_of() hold them).
  const std::vector<ParamGroup<T, D>>& groups() const noexcept { return flat_.groups; }
  std::size_t group_of(std::size_t i) const { return flat_.group_of.at(i); }
  // Group g's current lr: its own (set_group_lr, or ParamGroup::lr at construction), else lr().
  double group_lr(std::size_t g) const { return flat_.group_lr(g, o_.lr); }
  void set_group_lr(std::size_t g, double lr) { flat_.set_group_lr(g, lr, who_); }

 protected:
  GroupedOptimizer(const Options& o, FlatGroups<T, D> flat, const char* who)
      : o_(o), flat_(std::move(flat)), who_(who) {}

  Options o_;
  FlatGroups<T, D> flat_;
  std::int64_t steps_ = 0;
  const char* who_;
};

}  // namespace detail
}  // namespace ddp::optim
