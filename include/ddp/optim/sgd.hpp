// SGD: torch.optim.SGD (momentum, dampening, nesterov, weight decay, parameter groups).
// SPDX-License-Identifier: MIT
//
// Update per parameter p with gradient g (torch's rule, computed by kernels' SgdStep):
//   g = g + weight_decay * p
//   if momentum != 0:  buf = (first step of p) ? g : momentum * buf + (1 - dampening) * g
//                      g   = nesterov ? g + momentum * buf : buf
//   p = p - lr * g
// Example: lr 0.1, momentum 0.9, p = 1, g = 0.5 on both steps: step 1 buf = 0.5, p = 0.95;
// step 2 buf = 0.9 * 0.5 + 0.5 = 0.95, p = 0.95 - 0.095 = 0.855. A parameter without a gradient
// (has_grad() false: torch's .grad is None, e.g. a layer no rank used since zero_grad()) is
// skipped as torch skips it: no weight decay, its momentum buffer keeps its value and its "first
// step" is still to come. Parameter groups override lr and weight_decay. The momentum buffers are
// the optimizer's state: snapshots save them by parameter name, under the names torch's
// optimizer.state_dict() indexes by position. Not thread-safe; step() must not overlap a backward
// that writes the same gradients.
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

struct SgdOptions {
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

template <class T, Device D>
class SGD : public detail::GroupedOptimizer<T, D, SgdOptions> {
  using Base = detail::GroupedOptimizer<T, D, SgdOptions>;
  using Base::flat_;
  using Base::o_;
  using Base::steps_;

 public:
  using value_type = T;
  using device_type = D;
  static constexpr std::string_view kind = "sgd";
  // The per-parameter state snapshots save: "optimizer.momentum_buffer.<param name>".
  static constexpr std::array<StateTensor, 1> state_tensors{
      StateTensor{"momentum_buffer", "momentum buffer"}};

  SGD(std::vector<ParamGroup<T, D>> groups, const SgdOptions& o)
      : Base(o, validated(std::move(groups), o), "SGD") {
    buffers_.resize(flat_.params.size());
    have_buffer_.assign(flat_.params.size(), false);
  }
  SGD(std::vector<nn::Parameter<T, D>*> params, const SgdOptions& o)
      : SGD(std::vector<ParamGroup<T, D>>{ParamGroup<T, D>{.params = std::move(params)}}, o) {}
  // SGD({&a, &b}, o): without this overload the braces would also match vector<ParamGroup>'s
  // iterator-pair constructor.
  SGD(std::initializer_list<nn::Parameter<T, D>*> params, const SgdOptions& o)
      : SGD(std::vector<nn::Parameter<T, D>*>(params), o) {}
  // A model's parameters, whatever its activation type A (bf16 activations keep float parameters).
  template <class A>
  SGD(nn::Module<T, D, A>& model, const SgdOptions& o) : SGD(model.parameters(), o) {}

  // One update of every parameter with a gradient: one sgd_step_multi call per group (one launch
  // per group on the GPU; on the CPU tensor after tensor, the same bits as one sgd_step each).
  void step(Exec<D>& exec) {
    const bool use_momentum = o_.momentum != 0.0;
    std::vector<kernels::SgdTensor<T>> ts;
    for (std::size_t g = 0; g < flat_.groups.size(); ++g) {
      ts.clear();
      for (std::size_t i = 0; i < flat_.params.size(); ++i) {
        nn::Parameter<T, D>& p = *flat_.params[i];
        if (flat_.group_of[i] != g || !p.has_grad()) continue;
        if (use_momentum && buffers_[i].shape() != p.shape()) buffers_[i] = Tensor<T, D>(p.shape());
        ts.push_back(
            kernels::SgdTensor<T>{.param = p.value().data(),
                                  .grad = p.grad().data(),
                                  .momentum_buffer = use_momentum ? buffers_[i].data() : nullptr,
                                  .numel = p.numel(),
                                  .first_step = !have_buffer_[i]});
        if (use_momentum) have_buffer_[i] = true;
      }
      if (ts.empty()) continue;
      Kernels<D>::sgd_step_multi(
          exec, kernels::MultiSgdArgs<T, D>{.tensors = ts,
                                            .lr = flat_.group_lr(g, o_.lr),
                                            .momentum = o_.momentum,
                                            .dampening = o_.dampening,
                                            .weight_decay = flat_.weight_decay(g, o_.weight_decay),
                                            .nesterov = o_.nesterov});
    }
    ++steps_;
  }

  // Parameter i's momentum buffer (its shape); nullptr before its first step or without momentum.
  Tensor<T, D>* momentum_buffer(std::size_t i) {
    return have_buffer_.at(i) ? &buffers_[i] : nullptr;
  }
  // Installs a buffer (e.g. from a snapshot); the next step continues from it, not afresh.
  Tensor<T, D>& set_momentum_buffer(std::size_t i) {
    if (buffers_.at(i).shape() != flat_.params[i]->shape())
      buffers_[i] = Tensor<T, D>(flat_.params[i]->shape());
    have_buffer_[i] = true;
    return buffers_[i];
  }
  void clear_momentum_buffers() { have_buffer_.assign(flat_.params.size(), false); }

  // The generic state interface (optim/optimizer.hpp) snapshots and copy_state use.
  Tensor<T, D>* state(std::string_view name, std::size_t i) {
    require_state_name(name);
    return momentum_buffer(i);
  }
  Tensor<T, D>& set_state(std::string_view name, std::size_t i) {
    require_state_name(name);
    return set_momentum_buffer(i);
  }
  void clear_state() { clear_momentum_buffers(); }

 private:
  // A name of state_tensors, else a ValueError (as AdamW's).
  static void require_state_name(std::string_view name) {
    if (name != state_tensors[0].name)
      throw ValueError(
          ddp::detail::str("ddp: SGD has no state '", name, "'; it keeps ", state_tensors[0].name));
  }
  static detail::FlatGroups<T, D> validated(std::vector<ParamGroup<T, D>> groups,
                                            const SgdOptions& o) {
    if (!(o.lr >= 0.0))
      throw ValueError(
          ddp::detail::str("ddp: SGD: invalid learning rate ", o.lr, " (--lr must be >= 0)"));
    if (!(o.momentum >= 0.0))
      throw ValueError(
          ddp::detail::str("ddp: SGD: invalid momentum ", o.momentum, " (must be >= 0)"));
    if (!(o.weight_decay >= 0.0))
      throw ValueError(
          ddp::detail::str("ddp: SGD: invalid weight_decay ", o.weight_decay, " (must be >= 0)"));
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
      throw ValueError(
          ddp::detail::str("ddp: SGD: nesterov momentum requires momentum > 0 and dampening 0, got "
                           "momentum ",
                           o.momentum, " and dampening ", o.dampening));
    return detail::FlatGroups<T, D>(std::move(groups), "SGD");
  }

  std::vector<Tensor<T, D>> buffers_;  // buffers_[i] has parameters()[i]'s shape once used
  std::vector<bool> have_buffer_;
};

}  // namespace ddp::optim
