// The Optimizer concept: what snapshots (train/checkpoint.hpp) and device copies
// (train/device_state.hpp) need from an optimizer, so both work with SGD and AdamW alike
// (docs/decisions/0026).
// SPDX-License-Identifier: MIT
//
// An optimizer's state is its learning rate, its step count, and per parameter i (an index into
// parameters()) a few tensors of the parameter's shape, named by state_tensors: SGD's
// "momentum_buffer", AdamW's "exp_avg" and "exp_avg_sq". state(name, i) is the tensor, or nullptr
// while parameter i has none (before its first step); set_state(name, i) creates it (zeros on first
// creation) and returns it for the caller to fill; clear_state() drops all of it. An optimizer
// whose parameters count their own steps (AdamW's bias corrections: torch's state['step']) also has
// param_step(i) / set_param_step(i, n) (HasParamSteps). Snapshots store each state tensor as
// "optimizer.<name>.<parameter name>" in the parameter's torch layout, and the per-parameter step
// as the int64 scalar "optimizer.step.<parameter name>". Parameter groups: group_lr(g) is group g's
// current lr; a group "has its own lr" when it was built with one (groups()[g].lr) or set_group_lr
// changed it away from lr(): snapshots and copies carry those.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "ddp/nn/parameter.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::optim {

// One kind of per-parameter state tensor: its key in snapshots and how messages call it.
struct StateTensor {
  // "momentum_buffer": the snapshot tensor is "optimizer.momentum_buffer.<param>"
  std::string_view name;
  std::string_view label;  // "momentum buffer"
};

template <class O>
concept Optimizer = requires(O& o, const O& co, Exec<typename O::device_type>& exec, std::size_t i,
                             double lr, std::int64_t n, std::string_view name) {
  typename O::value_type;
  typename O::device_type;
  // "sgd", "adamw": written to snapshots and checked
  { O::kind } -> std::convertible_to<std::string_view>;
  O::state_tensors.size();
  { O::state_tensors[0] } -> std::convertible_to<StateTensor>;
  o.step(exec);
  o.zero_grad();
  { co.lr() } -> std::same_as<double>;
  o.set_lr(lr);
  // parameter groups (optim/param_groups.hpp): group_of(i), group_lr(g), set_group_lr(g, lr)
  co.groups().size();
  { co.group_of(i) } -> std::same_as<std::size_t>;
  { co.group_lr(i) } -> std::same_as<double>;
  o.set_group_lr(i, lr);
  { co.steps() } -> std::same_as<std::int64_t>;
  o.set_steps(n);
  {
    co.parameters()
    } -> std::convertible_to<
        const std::vector<nn::Parameter<typename O::value_type, typename O::device_type>*>&>;
  { o.state(name, i) } -> std::same_as<Tensor<typename O::value_type, typename O::device_type>*>;
  {
    o.set_state(name, i)
    } -> std::same_as<Tensor<typename O::value_type, typename O::device_type>&>;
  o.clear_state();
  {co.options()};
};

// Optimizers whose parameters count their own steps (a parameter skipped while it had no gradient
// lags).
template <class O>
concept HasParamSteps = Optimizer<O> && requires(O& o, const O& co, std::size_t i, std::int64_t n) {
  { co.param_step(i) } -> std::same_as<std::int64_t>;
  o.set_param_step(i, n);
};

// Whether group g of opt runs at an lr of its own rather than following opt.lr().
template <Optimizer O>
bool has_own_group_lr(const O& opt, std::size_t g) {
  return opt.groups()[g].lr.has_value() || opt.group_lr(g) != opt.lr();
}

// The same optimizer type on another device (SGD<T, Cuda> -> SGD<T, Cpu>), for host copies of the
// state.
template <class O, Device To>
struct OnDevice;
template <template <class, Device> class O, class T, Device D, Device To>
struct OnDevice<O<T, D>, To> {
  using type = O<T, To>;
};
template <class O, Device To>
using on_device_t = typename OnDevice<O, To>::type;

}  // namespace ddp::optim
