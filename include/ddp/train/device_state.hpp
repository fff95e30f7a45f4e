// Model and optimizer state, and input tensors, on another device: a view when they already live
// there, else a copy.
// SPDX-License-Identifier: MIT
//
// Snapshots are read and written on the host (train/checkpoint.hpp), so a GPU model needs a host
// copy of its state, and a CPU model must not pay for one. state_on<To>() gives either:
//   nn::ResNet<float, D> net(mo);  optim::SGD<float, D> opt(net.parameters(), so);
//   auto host = train::state_on<Cpu>(exec, net, opt, mo);
//   // D = Cpu: net and opt themselves; D = Cuda: a ResNet<float, Cpu>(mo) + SGD, copied
//   load_snapshot_bytes<float>(bytes, host.model(), host.optimizer(), path);  // resume:
//   host.push(exec);
//   host.pull(exec);                                                          // save:
//   save_snapshot(path, host.model(), host.optimizer(), info);
// pull()/push() copy every parameter, buffer (BatchNorm running statistics and counters) and
// optimizer state tensor (momentum buffers, AdamW's moments and per-parameter step counts), the
// learning rate and the step count (copy_state); on a view they do nothing. Any optim::Optimizer
// works. The exec orders the copies (Exec<Cuda> for CPU <-> CUDA; a copy to the host is complete
// when the call returns). on_device<To>(view, exec) does the same for one tensor (an evaluation
// batch: a view on the CPU, an uploaded copy on the GPU); keep it alive until backward returns
// (layers keep views of their inputs for the weight gradients). Training batches come from
// Prefetcher (tensor/prefetch.hpp) instead: on the GPU from pinned memory, a step ahead.
#pragma once

#include <concepts>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/sgd.hpp"  // the default optimizer of StateOn
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::train {

namespace detail {
// dst = src between any two devices. Host to host needs no exec; every other pair is
// tensor/cuda/copy.hpp's copy(src, dst, Exec<Cuda>), found by ADL at instantiation.
template <class T, class E>
void copy_between(TensorView<const T, Cpu> src, TensorView<T, Cpu> dst, const E& /*exec*/) {
  copy(src, dst);
}
template <class T, Device From, Device To, class E>
void copy_between(TensorView<const T, From> src, TensorView<T, To> dst, const E& exec) {
  copy(src, dst, exec);
}
}  // namespace detail

// (src, src_opt) -> (dst, dst_opt): models of the same structure on any devices, optimizers of the
// same kind over the same parameters in the same groups. dst_opt ends with exactly src_opt's state
// tensors (none where src_opt has none), per-parameter step counts, learning rates and step count.
// Throws ValueError when parameter or buffer lists differ in length or shape, or the optimizers'
// parameter names or group counts differ.
template <class T, Device From, Device To, class E, optim::Optimizer SrcOpt,
          optim::Optimizer DstOpt>
requires(SrcOpt::kind == DstOpt::kind) void copy_state(const E& exec, nn::Module<T, From>& src,
                                                       SrcOpt& src_opt, nn::Module<T, To>& dst,
                                                       DstOpt& dst_opt) {
  auto sp = src.parameters();
  auto dp = dst.parameters();
  auto sb = src.buffers();
  auto db = dst.buffers();
  if (sp.size() != dp.size() || sb.size() != db.size())
    throw ValueError(ddp::detail::str("ddp: copy_state: the source model has ", sp.size(),
                                      " parameters and ", sb.size(), " buffers, the destination ",
                                      dp.size(), " and ", db.size(),
                                      "; both models must be built with the same options"));
  for (std::size_t i = 0; i < sp.size(); ++i)
    detail::copy_between<T>(sp[i]->value().cview(), dp[i]->value().view(), exec);
  // By the optimizers' own parameter order (groups may order parameters unlike the model).
  const auto& sop = src_opt.parameters();
  const auto& dop = dst_opt.parameters();
  bool same = sop.size() == dop.size() && src_opt.groups().size() == dst_opt.groups().size();
  for (std::size_t i = 0; same && i < sop.size(); ++i) same = sop[i]->name() == dop[i]->name();
  if (!same)
    throw ValueError(ddp::detail::str("ddp: copy_state: the optimizers differ: ", sop.size(),
                                      " parameters in ", src_opt.groups().size(), " groups vs ",
                                      dop.size(), " in ", dst_opt.groups().size(),
                                      " (or in parameter order); build both with the same "
                                      "parameter groups"));
  dst_opt.clear_state();
  for (std::size_t i = 0; i < sop.size(); ++i) {
    for (const optim::StateTensor& st : SrcOpt::state_tensors)
      if (auto* m = src_opt.state(st.name, i))
        detail::copy_between<T>(m->cview(), dst_opt.set_state(st.name, i).view(), exec);
    if constexpr (optim::HasParamSteps<SrcOpt>) dst_opt.set_param_step(i, src_opt.param_step(i));
  }
  for (std::size_t i = 0; i < sb.size(); ++i) {
    if (sb[i]->is_integer() != db[i]->is_integer())
      throw ValueError(
          ddp::detail::str("ddp: copy_state: buffer '", sb[i]->name(), "' and '", db[i]->name(),
                           "' differ in dtype; both models must be built with the same options"));
    if (sb[i]->is_integer())
      detail::copy_between<std::int64_t>(sb[i]->count().cview(), db[i]->count().view(), exec);
    else
      detail::copy_between<T>(sb[i]->real().cview(), db[i]->real().view(), exec);
  }
  dst_opt.set_lr(src_opt.lr());
  for (std::size_t g = 0; g < src_opt.groups().size(); ++g)
    if (optim::has_own_group_lr(src_opt, g)) dst_opt.set_group_lr(g, src_opt.group_lr(g));
  dst_opt.set_steps(src_opt.steps());
}

// A model Src = M<T, From> and its optimizer SrcOpt on device To, as Dst = M<T, To> and the same
// optimizer on To. This general case owns a copy; the same-device case below is a view. Not
// copyable; the source model and optimizer must outlive it.
template <class Dst, class Src,
          optim::Optimizer SrcOpt = optim::SGD<typename Src::value_type, typename Src::device_type>>
class StateOn {
  using T = typename Src::value_type;
  using From = typename Src::device_type;
  using To = typename Dst::device_type;
  using DstOpt = optim::on_device_t<SrcOpt, To>;

 public:
  static constexpr bool is_view = false;

  // Dst(model_args...) and an optimizer with src_opt's options and groups; pulls the state.
  template <class E, class... ModelArgs>
  StateOn(const E& exec, Src& src, SrcOpt& src_opt, const ModelArgs&... model_args)
      : src_(&src),
        src_opt_(&src_opt),
        model_(std::make_unique<Dst>(model_args...)),
        opt_(std::make_unique<DstOpt>(same_groups(src_opt, *model_), src_opt.options())) {
    pull(exec);
  }
  StateOn(const StateOn&) = delete;
  StateOn& operator=(const StateOn&) = delete;

  Dst& model() noexcept { return *model_; }
  DstOpt& optimizer() noexcept { return *opt_; }
  // src_opt's groups over model's parameters (matched by name).
  static std::vector<optim::ParamGroup<T, To>> same_groups(const SrcOpt& src_opt, Dst& model) {
    std::map<std::string, nn::Parameter<T, To>*, std::less<>> by_name;
    for (auto* p : model.parameters()) by_name[p->name()] = p;
    std::vector<optim::ParamGroup<T, To>> groups;
    for (const auto& g : src_opt.groups())
      groups.push_back(
          optim::ParamGroup<T, To>{.weight_decay = g.weight_decay, .lr = g.lr, .name = g.name});
    const auto& sp = src_opt.parameters();
    for (std::size_t i = 0; i < sp.size(); ++i) {
      auto it = by_name.find(sp[i]->name());
      if (it == by_name.end())
        throw ValueError(ddp::detail::str(
            "ddp: state_on: the optimizer's parameter '", sp[i]->name(),
            "' is not in the copy of the model; build both with the same options"));
      groups[src_opt.group_of(i)].params.push_back(it->second);
    }
    return groups;
  }
  // Source -> this copy.
  template <class E>
  void pull(const E& exec) {
    copy_state(exec, *src_, *src_opt_, *model_, *opt_);
  }
  // This copy -> source.
  template <class E>
  void push(const E& exec) {
    copy_state(exec, *model_, *opt_, *src_, *src_opt_);
  }

 private:
  Src* src_;
  SrcOpt* src_opt_;
  std::unique_ptr<Dst> model_;  // heap: modules are neither copyable nor movable
  std::unique_ptr<DstOpt> opt_;
};

// Same device: the model and optimizer themselves; pull() and push() do nothing.
template <class M, optim::Optimizer Opt>
class StateOn<M, M, Opt> {
 public:
  static constexpr bool is_view = true;

  template <class E, class... ModelArgs>
  StateOn(const E& /*exec*/, M& model, Opt& opt, const ModelArgs&... /*unused: nothing to build*/)
      : model_(&model), opt_(&opt) {}
  StateOn(const StateOn&) = delete;
  StateOn& operator=(const StateOn&) = delete;

  M& model() noexcept { return *model_; }
  Opt& optimizer() noexcept { return *opt_; }
  template <class E>
  void pull(const E& /*exec*/) {}
  template <class E>
  void push(const E& /*exec*/) {}

 private:
  M* model_;
  Opt* opt_;
};

// (model, opt) on To as of this call: a view on the same device, else M<T, To>(model_args...) (the
// model's own constructor arguments) pulled with exec. A: the model's activation type, if any,
// kept on To.
template <Device To, template <class, Device, class...> class M, class T, Device From, class... A,
          class E, optim::Optimizer Opt, class... ModelArgs>
StateOn<M<T, To, A...>, M<T, From, A...>, Opt> state_on(const E& exec, M<T, From, A...>& model,
                                                        Opt& opt, const ModelArgs&... model_args) {
  // guaranteed elision
  return StateOn<M<T, To, A...>, M<T, From, A...>, Opt>(exec, model, opt, model_args...);
}

// The source itself on To, else a copy made with exec. Keep it alive while cview() is in use.
template <class T, Device To>
class OnDevice {
 public:
  explicit OnDevice(TensorView<const T, To> same_device) : view_(same_device) {}
  explicit OnDevice(Tensor<T, To> copy) : copy_(std::move(copy)), view_(copy_.cview()) {}
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

  TensorView<const T, To> cview() const noexcept { return view_; }

 private:
  Tensor<T, To> copy_;  // empty for a view
  TensorView<const T, To> view_;
};

template <Device To, class T, Device From, class E>
OnDevice<std::remove_const_t<T>, To> on_device(TensorView<T, From> src, E& exec) {
  using V = std::remove_const_t<T>;
  if constexpr (std::same_as<To, From>)
    return OnDevice<V, To>(TensorView<const V, To>(src));
  else
    return OnDevice<V, To>(to<To>(src, exec));
}

}  // namespace ddp::train
