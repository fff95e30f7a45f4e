// OpsModule: a Module whose forward is written with autograd ops; backward comes from the tape.
// SPDX-License-Identifier: MIT
//
// One model concept (docs/decisions/0076): an OpsModule is an nn::Module like any layer. It
// registers parameters and children in its constructor (parameters(), state_dict, optimizers,
// checkpoints and DDP see ordinary parameters) and implements one function from Vars to a Var:
//     class SwiGlu : public nn::OpsModule<float, Cpu> {
//       nn::Parameter<float, Cpu>& w1_ = register_parameter("w1", {16, 8});  // (out, in)
//       ...
//       Var forward_ops(OpsGraph<float, Cpu>& g, const Var& x) override {
//         return autograd::linear(autograd::silu(autograd::linear(x, g.param(w1_))) * ...,
//                                 g.param(w2_));
//       }
//     };
// forward(exec, x) / backward(exec, dy) work as for every module, so it sits in a Sequential or
// Residual next to explicit layers, and DDP wraps it. Inside forward_ops:
// - g.param(p): the leaf of parameter p for this forward. Every use of p in one forward (tied
//   weights, a block applied twice, loops) gets the SAME leaf, so backward sums the uses and
//   p.grad_done() (DDP's ready hook) runs once, after the last use was accumulated.
// - g(child, x): runs a child. An OpsModule child runs its forward_ops in this graph (any number of
//   times); any other module runs its explicit forward and backward (same speed as outside). Such a
//   layer keeps the state of one forward, so it may be called once per forward of the graph's root.
// Outside the module interface, an OpsGraph on a model gives its output as a Var for a loss op:
//     nn::OpsGraph<double, Cpu> g(exec, model);
//     auto loss = autograd::cross_entropy(g(model, x), labels);
//     loss.backward();  // every parameter's grad(), each reported once
// Cost: the tape's bookkeeping and one copy per op output (docs/decisions/0071); a hot layer can
// still be written as an explicit Module and called from ops with g(layer, x).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ddp/autograd/var.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::nn {

template <class T, Device D>
class OpsModule;

// The state of one forward through an op-written model: its root module (whose subtree holds every
// parameter and child the forward may use), one leaf per parameter, and the explicit layers already
// run. Create one per forward (OpsModule::forward does); the Vars it hands out outlive it.
template <class T, Device D>
class OpsGraph {
 public:
  using Var = autograd::Var<T, D>;

  OpsGraph(Exec<D>& exec, Module<T, D>& root) : exec_(&exec), root_(&root) {
    root.visit([&](Module<T, D>& m) { modules_.insert(&m); });
    for (auto* p : root.parameters()) params_.insert(p);
  }
  OpsGraph(const OpsGraph&) = delete;
  OpsGraph& operator=(const OpsGraph&) = delete;

  Exec<D>& exec() noexcept { return *exec_; }
  Module<T, D>& root() noexcept { return *root_; }

  // The leaf of parameter p in this forward (created on first use, the same Var afterwards).
  Var param(Parameter<T, D>& p) {
    if (!params_.count(&p))
      throw ValueError(ddp::detail::str("ddp: ", root_->where(), ": forward_ops uses parameter '",
                                        p.name(),
                                        "', which is not in this module's subtree; an op-written "
                                        "forward may use only the parameters of its "
                                        "own module and children (register_parameter / "
                                        "register_module it there), or DDP, optimizers and "
                                        "checkpoints would not see its gradient"));
    if (explicit_params_.count(&p)) throw used_both_ways(p);
    auto it = leaves_.find(&p);
    if (it == leaves_.end()) it = leaves_.emplace(&p, Var::parameter(p, *exec_)).first;
    return it->second;
  }
  // A value of this forward that requires no gradient (masks, constants), on this graph's Exec.
  Var constant(Tensor<T, D> value) { return Var::leaf(std::move(value), false, *exec_); }

  // child(x) as part of this graph (see the header comment); child must be in the root's subtree.
  Var operator()(Module<T, D>& child, const Var& x) {
    if (!modules_.count(&child))
      throw ValueError(
          ddp::detail::str("ddp: ", root_->where(), ": forward_ops calls ", child.where(),
                           ", which is not in this module's subtree; register it as a child "
                           "(register_module) so that its parameters are this model's"));
    if (auto* ops = dynamic_cast<OpsModule<T, D>*>(&child)) return ops->run_in(*this, x);
    return run_explicit(child, x);
  }
  // child(ids) for an OpsModule that takes int64 token ids (forward_ops_ids), e.g. the model.
  Var operator()(OpsModule<T, D>& child, const Tensor<std::int64_t, D>& ids) {
    if (!modules_.count(&child))
      throw ValueError(
          ddp::detail::str("ddp: ", root_->where(), ": an OpsGraph calls ", child.where(),
                           ", which is not in its root's subtree; register it as a child "
                           "(register_module) so that its parameters are this model's"));
    return child.run_ids_in(*this, ids);
  }

 private:
  // An explicit layer as one node: its forward now, its backward when the tape reaches the node,
  // which requires a gradient when x does or the layer has parameters.
  Var run_explicit(Module<T, D>& layer, const Var& x) {
    if (!explicit_run_.insert(&layer).second)
      throw ValueError(ddp::detail::str("ddp: ", root_->where(), ": forward_ops calls ",
                                        layer.where(),
                                        " a second time in one forward; it is an explicit layer "
                                        "(hand-written backward) that keeps the state "
                                        "of ONE forward for its backward, so it may run once per "
                                        "forward. Use a second instance, or write the "
                                        "shared part with ops (an OpsModule child, or "
                                        "autograd::conv2d / linear on g.param(...) weights), which "
                                        "may run any number of times"));
    for (auto* p : layer.parameters()) {
      if (leaves_.count(p)) throw used_both_ways(*p);
      explicit_params_.insert(p);
    }
    Tensor<T, D> y = layer.forward(*exec_, x.value().cview());
    auto n = std::make_shared<autograd::Node<T, D>>();
    n->value = std::move(y);
    n->op = "explicit module";
    n->exec = *exec_;
    const bool needs =
        autograd::grad_enabled() && (x.requires_grad() || !layer.parameters().empty());
    // a constant (inference): the layer's backward is never called
    if (!needs) return Var(std::move(n));
    n->leaf = false;
    n->requires_grad = true;
    n->inputs = {x.node_ptr()};  // keeps x's value alive: the layer's backward reads a view of it
    Module<T, D>* m = &layer;
    n->backward_fn = [m](autograd::Node<T, D>& node) {
      Tensor<T, D> dx = m->backward(node.exec, node.grad.cview());
      auto& in = *node.inputs[0];
      if (in.requires_grad) in.accumulate(std::move(dx));
    };
    return Var(std::move(n));
  }

  // A parameter both behind g.param and inside an explicit layer of one forward would report its
  // gradient twice.
  ValueError used_both_ways(const Parameter<T, D>& p) const {
    return ValueError(ddp::detail::str(
        "ddp: ", root_->where(), ": parameter '", p.name(),
        "' is used both through g.param() and by the explicit "
        "layer that owns it in one forward; each would report its gradient separately. Use it one "
        "way: call the "
        "layer with g(layer, x) only, or write that layer's use with ops on g.param()"));
  }

  Exec<D>* exec_;
  Module<T, D>* root_;
  std::unordered_set<const Module<T, D>*> modules_;
  std::unordered_set<const Parameter<T, D>*> params_;
  std::unordered_map<const Parameter<T, D>*, Var> leaves_;
  std::unordered_set<const Module<T, D>*> explicit_run_;
  // parameters of the explicit layers run
  std::unordered_set<const Parameter<T, D>*> explicit_params_;
};

template <class T, Device D>
class OpsModule : public Module<T, D> {
 public:
  using Var = autograd::Var<T, D>;
  using Graph = OpsGraph<T, D>;

 protected:
  // x -> y with ops; parameters through g.param(p), children through g(child, x).
  virtual Var forward_ops(Graph& g, const Var& x) = 0;
  // The forward of a model that takes int64 token ids; others leave it (ValueError).
  virtual Var forward_ops_ids(Graph&, const Tensor<std::int64_t, D>& ids) {
    throw ValueError(ddp::detail::str("ddp: ", this->where(),
                                      ": takes values of the model's floating-point type, "
                                      "got int64 token ids (shape ",
                                      ids.shape(),
                                      "); an OpsModule that takes ids "
                                      "overrides forward_ops_ids"));
  }

  // x becomes a leaf (its gradient is backward's dx); the output Var is kept for backward.
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    reset();
    warn_zero_weights_once(exec);
    Graph g(exec, *this);
    in_ = Var::leaf(Tensor<T, D>::borrow(const_cast<T*>(x.data()), x.shape()), true, exec);
    return keep_output(exec, forward_ops(g, in_));
  }
  Tensor<T, D> forward_ids_impl(Exec<D>& exec, TensorView<const std::int64_t, D> ids) override {
    reset();
    warn_zero_weights_once(exec);
    Graph g(exec, *this);
    const auto t =
        Tensor<std::int64_t, D>::borrow(const_cast<std::int64_t*>(ids.data()), ids.shape());
    return keep_output(exec, forward_ops_ids(g, t));
  }
  // dx from dy: runs the tape from the kept output; every parameter's grad_done() fires as its
  // gradient is final. A model that took ids returns an empty tensor (as nn::GPT).
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(out_.defined());
    Var out = std::move(out_), in = std::move(in_);
    out_ = Var();
    in_ = Var();
    expect_shape(dy, out.shape(), "output gradient dy", "OpsModule.backward");
    if (out.requires_grad())
      out.backward(Tensor<T, D>::borrow(const_cast<T*>(dy.data()), dy.shape()));
    if (!in.defined()) return Tensor<T, D>();
    if (in.has_grad()) return std::move(in.node().grad);
    Tensor<T, D> dx(in.shape());  // the output does not depend on x
    Kernels<D>::fill(exec, dx.view(), T(0));
    return dx;
  }

 private:
  friend class OpsGraph<T, D>;

  void reset() {
    out_ = Var();
    in_ = Var();
  }
  // Once, at the first forward: a weight (rank >= 2) still all zeros was most likely never
  // initialised (register_parameter starts at zero, and a zero weight often passes no gradient). A
  // warning, not an error: some weights start at zero on purpose (LoRA's B).
  void warn_zero_weights_once(Exec<D>& exec) {
    if (zero_weights_checked_) return;
    zero_weights_checked_ = true;
    for (Parameter<T, D>* p : this->parameters()) {
      if (p->value().rank() < 2 || p->value().numel() == 0) continue;
      const Tensor<T, Cpu> host = to<Cpu>(p->value().cview(), exec);
      if (std::all_of(host.data(), host.data() + host.numel(), [](T v) { return v == T(0); }))
        DDP_LOG_WARN(
            "ddp: ", this->where(), ": parameter '", p->name(), "' ", p->value().shape(),
            " is all zeros at the first forward: a parameter made with register_parameter starts "
            "at zero. "
            "Initialise it in the constructor, e.g. nn::init_normal(p, 0.0, 0.02) or "
            "nn::init_uniform(p, "
            "-b, b) with b = nn::fan_in_bound(fan_in) (<ddp/nn/init.hpp>), unless zeros are meant");
    }
  }
  Tensor<T, D> keep_output(Exec<D>& exec, Var out) {
    if (!out.defined())
      throw ValueError(
          ddp::detail::str("ddp: ", this->where(), ": forward_ops returned an empty Var"));
    out_ = std::move(out);
    // the caller owns y; out_'s value stays with the tape (ops' backward read it)
    Tensor<T, D> y(out_.shape());
    copy(out_.value().cview(), y.view(), exec);
    return y;
  }
  // This module's forward inside an enclosing graph (OpsGraph::operator()), with its trace span.
  Var run_in(Graph& g, const Var& x) {
    trace::Span span = this->trace_span("forward");
    return forward_ops(g, x);
  }
  Var run_ids_in(Graph& g, const Tensor<std::int64_t, D>& ids) {
    trace::Span span = this->trace_span("forward");
    return forward_ops_ids(g, ids);
  }

  Var in_, out_;  // the last forward's input leaf and output, until backward
  bool zero_weights_checked_ = false;
};

}  // namespace ddp::nn
