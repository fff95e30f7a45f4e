// Model and optimizer state, and input tensors, on another device: a view when they already live there, else a copy.
// SPDX-License-Identifier: MIT
//
// Snapshots are read and written on the host (train/checkpoint.hpp works on CPU tensors), so a GPU model
// needs a host copy of its state, and a CPU model must not pay for one. state_on<To>() gives either:
//   nn::ResNet<float, D> net(mo);  optim::SGD<float, D> opt(net.parameters(), so);
//   auto host = train::state_on<Cpu>(exec, net, opt, mo);  // D = Cpu: net and opt themselves (no copy);
//                                                          // D = Cuda: a ResNet<float, Cpu>(mo) + SGD, copied
//   load_snapshot_bytes<float>(bytes, host.model(), host.optimizer(), path);  host.push(exec);  // resume
//   host.pull(exec);  save_snapshot(path, host.model(), host.optimizer(), info);                // save
// pull()/push() copy every parameter value, buffer (BatchNorm running statistics and counters) and momentum
// buffer, the learning rate and the step count (copy_state); on a view they do nothing. The exec orders
// the copies (an Exec<Cuda> for CPU <-> CUDA; a copy to the host is complete when the call returns).
// on_device<To>(view, exec) does the same for one tensor: the input batch of a training step is a view of
// the loader's host tensor on the CPU and an uploaded copy on the GPU; keep it alive until backward returns
// (layers keep views of their inputs for the weight gradients).
#pragma once

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::train {

namespace detail {
// dst = src between any two devices. Host to host needs no exec; every other pair is the device layer's
// copy(src, dst, Exec<Cuda>) (tensor/cuda/copy.hpp), found by argument-dependent lookup at instantiation.
template <class T, class E>
void copy_between(TensorView<const T, Cpu> src, TensorView<T, Cpu> dst, const E& /*exec*/) {
  copy(src, dst);
}
template <class T, Device From, Device To, class E>
void copy_between(TensorView<const T, From> src, TensorView<T, To> dst, const E& exec) {
  copy(src, dst, exec);
}
}  // namespace detail

// Copies the state of (src, src_opt) into (dst, dst_opt): models of the same structure, on any devices.
// dst_opt ends with exactly src_opt's momentum buffers (none where src_opt has none), learning rate and
// step count. Throws ValueError when the parameter or buffer lists differ in length or shape.
template <class T, Device From, Device To, class E>
void copy_state(const E& exec, nn::Module<T, From>& src, optim::SGD<T, From>& src_opt, nn::Module<T, To>& dst,
                optim::SGD<T, To>& dst_opt) {
  auto sp = src.parameters();
  auto dp = dst.parameters();
  auto sb = src.buffers();
  auto db = dst.buffers();
  if (sp.size() != dp.size() || sb.size() != db.size())
    throw ValueError(ddp::detail::str("ddp: copy_state: the source model has ", sp.size(), " parameters and ",
                                      sb.size(), " buffers, the destination ", dp.size(), " and ", db.size(),
                                      "; both models must be built with the same options"));
  dst_opt.clear_momentum_buffers();
  for (std::size_t i = 0; i < sp.size(); ++i) {
    detail::copy_between<T>(sp[i]->value().cview(), dp[i]->value().view(), exec);
    if (auto* m = src_opt.momentum_buffer(i))
      detail::copy_between<T>(m->cview(), dst_opt.set_momentum_buffer(i).view(), exec);
  }
  for (std::size_t i = 0; i < sb.size(); ++i) {
    if (sb[i]->is_integer() != db[i]->is_integer())
      throw ValueError(ddp::detail::str("ddp: copy_state: buffer '", sb[i]->name(), "' and '", db[i]->name(),
                                        "' differ in dtype; both models must be built with the same options"));
    if (sb[i]->is_integer())
      detail::copy_between<std::int64_t>(sb[i]->count().cview(), db[i]->count().view(), exec);
    else
      detail::copy_between<T>(sb[i]->real().cview(), db[i]->real().view(), exec);
  }
  dst_opt.set_lr(src_opt.lr());
  dst_opt.set_steps(src_opt.steps());
}

// The state of a model (type Src = M<T, From>) and its SGD on device To, as Dst = M<T, To> (see the file
// comment). The general case owns a copy; the same-device case below is a view. Not copyable; the source
// model and optimizer must outlive it.
template <class Dst, class Src>
class StateOn {
  using T = typename Src::value_type;
  using From = typename Src::device_type;
  using To = typename Dst::device_type;

 public:
  static constexpr bool is_view = false;

  // Builds Dst(model_args...) and an SGD with src_opt's options on To, and pulls the source's state.
  template <class E, class... ModelArgs>
  StateOn(const E& exec, Src& src, optim::SGD<T, From>& src_opt, const ModelArgs&... model_args)
      : src_(&src),
        src_opt_(&src_opt),
        model_(std::make_unique<Dst>(model_args...)),
        opt_(std::make_unique<optim::SGD<T, To>>(model_->parameters(), src_opt.options())) {
    pull(exec);
  }
  StateOn(const StateOn&) = delete;
  StateOn& operator=(const StateOn&) = delete;

  Dst& model() noexcept { return *model_; }
  optim::SGD<T, To>& optimizer() noexcept { return *opt_; }
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
  optim::SGD<T, From>* src_opt_;
  std::unique_ptr<Dst> model_;  // heap: modules are neither copyable nor movable
  std::unique_ptr<optim::SGD<T, To>> opt_;
};

// Same device: refers to the model and optimizer themselves; pull() and push() have nothing to copy.
template <class M>
class StateOn<M, M> {
  using T = typename M::value_type;
  using D = typename M::device_type;

 public:
  static constexpr bool is_view = true;

  template <class E, class... ModelArgs>
  StateOn(const E& /*exec*/, M& model, optim::SGD<T, D>& opt, const ModelArgs&... /*unused: nothing to build*/)
      : model_(&model), opt_(&opt) {}
  StateOn(const StateOn&) = delete;
  StateOn& operator=(const StateOn&) = delete;

  M& model() noexcept { return *model_; }
  optim::SGD<T, D>& optimizer() noexcept { return *opt_; }
  template <class E>
  void pull(const E& /*exec*/) {}
  template <class E>
  void push(const E& /*exec*/) {}

 private:
  M* model_;
  optim::SGD<T, D>* opt_;
};

// The state of (model, opt) on To, current as of this call: a view on the same device, else a copy built
// from model_args (M<T, To>(model_args...), the arguments the model was built with) and pulled with exec.
template <Device To, template <class, Device> class M, class T, Device From, class E, class... ModelArgs>
StateOn<M<T, To>, M<T, From>> state_on(const E& exec, M<T, From>& model, optim::SGD<T, From>& opt,
                                       const ModelArgs&... model_args) {
  return StateOn<M<T, To>, M<T, From>>(exec, model, opt, model_args...);  // not movable: guaranteed elision
}

// A tensor's data on device To: the source itself when it already lives there, else a copy made with exec.
// Keep it alive as long as cview() is in use.
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
