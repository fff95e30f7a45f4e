// SGD: torch.optim.SGD (momentum, dampening, nesterov, weight decay) over a module's parameters.
// SPDX-License-Identifier: MIT
//
// Update per parameter p with gradient g (PyTorch's rule; the arithmetic is kernels/elementwise.hpp's SgdStep):
//   g = g + weight_decay * p
//   if momentum != 0:  buf = (first step of p) ? g : momentum * buf + (1 - dampening) * g
//                      g   = nesterov ? g + momentum * buf : buf
//   p = p - lr * g
// Worked example: lr 0.1, momentum 0.9, p = 1, g = 0.5 on both steps: step 1 buf = 0.5, p = 0.95;
// step 2 buf = 0.9 * 0.5 + 0.5 = 0.95, p = 0.95 - 0.095 = 0.855.
// The momentum buffers are the optimizer's state: snapshots save them by parameter name
// (train/checkpoint.hpp), under the same names torch's optimizer.state_dict() indexes by position.
// Not thread-safe; step() must not overlap a backward that writes the same gradients.
// A step is one Kernels<D>::sgd_step_multi call over every parameter: one kernel launch on the GPU,
// tensor after tensor on the CPU; the same SgdStep arithmetic as sgd_step on each.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"

namespace ddp::optim {

struct SgdOptions {
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

template <class T, Device D>
class SGD {
 public:
  SGD(std::vector<nn::Parameter<T, D>*> params, const SgdOptions& o) : params_(std::move(params)), o_(o) {
    if (!(o.lr >= 0.0)) throw ValueError(ddp::detail::str("ddp: SGD: invalid learning rate ", o.lr, " (--lr must be >= 0)"));
    if (!(o.momentum >= 0.0)) throw ValueError(ddp::detail::str("ddp: SGD: invalid momentum ", o.momentum, " (must be >= 0)"));
    if (!(o.weight_decay >= 0.0))
      throw ValueError(ddp::detail::str("ddp: SGD: invalid weight_decay ", o.weight_decay, " (must be >= 0)"));
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
      throw ValueError(ddp::detail::str("ddp: SGD: nesterov momentum requires momentum > 0 and dampening 0, got "
                                        "momentum ",
                                        o.momentum, " and dampening ", o.dampening));
    if (params_.empty()) throw ValueError("ddp: SGD got an empty parameter list; pass model.parameters()");
    buffers_.resize(params_.size());
    have_buffer_.assign(params_.size(), false);
  }
  SGD(nn::Module<T, D>& model, const SgdOptions& o) : SGD(model.parameters(), o) {}

  // One update of every parameter from its current grad(): one Kernels<D>::sgd_step_multi call over all
  // of them (one launch on the GPU; on the CPU tensor after tensor, the same bits as one sgd_step each).
  void step(Exec<D>& exec) {
    const bool use_momentum = o_.momentum != 0.0;
    std::vector<kernels::SgdTensor<T>> ts(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      nn::Parameter<T, D>& p = *params_[i];
      if (use_momentum && buffers_[i].shape() != p.shape()) buffers_[i] = Tensor<T, D>(p.shape());
      ts[i] = kernels::SgdTensor<T>{.param = p.value().data(), .grad = p.grad().data(),
                                    .momentum_buffer = use_momentum ? buffers_[i].data() : nullptr,
                                    .numel = p.numel(), .first_step = !have_buffer_[i]};
      if (use_momentum) have_buffer_[i] = true;
    }
    Kernels<D>::sgd_step_multi(exec, kernels::MultiSgdArgs<T, D>{.tensors = ts, .lr = o_.lr, .momentum = o_.momentum,
                                                                 .dampening = o_.dampening,
                                                                 .weight_decay = o_.weight_decay,
                                                                 .nesterov = o_.nesterov});
    ++steps_;
  }

  void zero_grad() {
    for (auto* p : params_) p->zero_grad();
  }

  double lr() const noexcept { return o_.lr; }
  void set_lr(double lr) {
    if (!(lr >= 0.0)) throw ValueError(ddp::detail::str("ddp: SGD: invalid learning rate ", lr, " (must be >= 0)"));
    o_.lr = lr;
  }
  const SgdOptions& options() const noexcept { return o_; }
  std::int64_t steps() const noexcept { return steps_; }
  void set_steps(std::int64_t n) noexcept { steps_ = n; }
  const std::vector<nn::Parameter<T, D>*>& parameters() const noexcept { return params_; }

  // Momentum buffer of parameter i (same shape as it), or nullptr before its first step / without momentum.
  Tensor<T, D>* momentum_buffer(std::size_t i) { return have_buffer_.at(i) ? &buffers_[i] : nullptr; }
  // Installs a buffer (e.g. from a snapshot); the next step continues from it instead of starting afresh.
  Tensor<T, D>& set_momentum_buffer(std::size_t i) {
    if (buffers_.at(i).shape() != params_[i]->shape()) buffers_[i] = Tensor<T, D>(params_[i]->shape());
    have_buffer_[i] = true;
    return buffers_[i];
  }
  void clear_momentum_buffers() { have_buffer_.assign(params_.size(), false); }

 private:
  std::vector<nn::Parameter<T, D>*> params_;
  SgdOptions o_;
  std::vector<Tensor<T, D>> buffers_;  // buffers_[i] has params_[i]'s shape once used
  std::vector<bool> have_buffer_;
  std::int64_t steps_ = 0;
};

}  // namespace ddp::optim
