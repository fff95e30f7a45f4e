// Var<T, D>: a differentiable value (a Tensor<T, D> and the op that made it), reverse-mode autodiff
// over a tape.
// SPDX-License-Identifier: MIT
//
//   auto w = Var<double, Cpu>::leaf(Tensor<double, Cpu>::from({2, 2}, {1, 2, 3, 4}),
//                                   /*requires_grad=*/true);
//   auto x = Var<double, Cpu>::leaf(Tensor<double, Cpu>::from({1, 2}, {5, 6}));
//   auto loss = sum(relu(matmul(x, w)) * 2.0);
//   loss.backward();          // w.grad(): d(loss)/d(w), shape (2, 2)
//
// The tape (docs/decisions/0071): every op whose inputs require a gradient records a Node (output
// value, inputs, backward function). Nodes are numbered in creation order, so running the reachable
// ones from the highest number down replays the tape backwards (consumers are created after their
// inputs). Each backward function adds one contribution per input edge, so a value used twice
// (y = x * x + x) gets the sum. A leaf's gradient is final when its last consumer has run (counted
// per edge): a leaf with a GradSink hands it over then, interleaved with the rest of backward,
// which is when DDP wants a parameter marked ready (Var::parameter).
//
// Leaves without a sink keep their gradient and add later backward calls' into it, as torch's
// .grad (zero_grad() drops it). Intermediate gradients are freed as soon as their node has run.
// backward() frees the graph unless retain_graph is asked; a second backward through a freed graph
// throws. Ops run on their first operand's Exec<D> (carried by every Var); no_grad scopes
// (NoGradGuard) record nothing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::autograd {

// ---- grad mode ----
namespace detail {
inline int& no_grad_depth() {
  thread_local int depth = 0;
  return depth;
}
inline std::uint64_t next_seq() {
  static std::atomic<std::uint64_t> seq{0};
  return ++seq;
}
}  // namespace detail

// True unless a NoGradGuard is alive on this thread.
inline bool grad_enabled() noexcept { return detail::no_grad_depth() == 0; }

// torch.no_grad(): while one is alive on this thread, ops record nothing, results need no grad.
class NoGradGuard {
 public:
  NoGradGuard() noexcept { ++detail::no_grad_depth(); }
  ~NoGradGuard() { --detail::no_grad_depth(); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;
};

// Where a leaf's gradient goes once all its uses are accumulated: every element of this backward's
// gradient is written to dest(), then done(exec) runs (nn::Parameter's grad_dest()/grad_done():
// DDP's per-parameter readiness fires from done()).
template <class T, Device D>
struct GradSink {
  std::function<TensorView<T, D>()> dest;
  std::function<void(Exec<D>&)> done;
};

// Anything with nn::Parameter's value()/grad_dest()/grad_done(exec) (duck-typed: no nn/ include).
template <class P, class T, class D>
concept GradParameter = requires(P& p, Exec<D>& e) {
  { p.value() } -> std::same_as<Tensor<T, D>&>;
  { p.grad_dest() } -> std::same_as<TensorView<T, D>>;
  p.grad_done(e);
};

template <class T, Device D>
struct Node {
  Tensor<T, D> value;
  Tensor<T, D> grad;  // meaningful only while has_grad
  bool has_grad = false;
  bool requires_grad = false;
  bool leaf = true;
  bool freed = false;  // backward ran without retain_graph: inputs and backward_fn are gone
  std::uint64_t seq = detail::next_seq();
  const char* op = "leaf";
  Exec<D> exec{};
  std::vector<std::shared_ptr<Node>> inputs;  // one per edge (x * x lists x twice)
  std::function<void(Node&)> backward_fn;     // reads grad, calls accumulate() on inputs
  std::unique_ptr<GradSink<T, D>> sink;       // leaves only

  // grad += g (g's shape must be value's); the first contribution is moved in.
  void accumulate(Tensor<T, D>&& g) {
    if (!(g.shape() == value.shape()))
      throw Error(ddp::detail::str("ddp: autograd: internal error: op ", op,
                                   " received a gradient of shape ", g.shape(),
                                   " for a value of shape ", value.shape()));
    if (!has_grad) {
      grad = std::move(g);
      has_grad = true;
    } else {
      Kernels<D>::axpy(exec, T(1), g.cview(), grad.view());
    }
  }
};

template <class T, Device D>
class Var {
 public:
  using value_type = T;
  using device_type = D;
  using NodePtr = std::shared_ptr<Node<T, D>>;

  Var() = default;

  // A leaf holding `value`; requires_grad: backward computes d(root)/d(value) into grad().
  static Var leaf(Tensor<T, D> value, bool requires_grad = false, Exec<D> exec = {}) {
    auto n = std::make_shared<Node<T, D>>();
    n->value = std::move(value);
    n->requires_grad = requires_grad;
    n->exec = exec;
    return Var(std::move(n));
  }
  // A trainable leaf over a parameter's tensor (borrowed: keep the parameter alive while the graph
  // is); backward writes its gradient through p.grad_dest() and calls p.grad_done(exec) as soon as
  // all its uses are accumulated.
  template <class P>
  requires GradParameter<P, T, D>
  static Var parameter(P& p, Exec<D> exec = {}) {
    Tensor<T, D>& v = p.value();
    Var out = leaf(Tensor<T, D>::borrow(v.data(), v.shape()), true, exec);
    out.set_grad_sink(GradSink<T, D>{.dest = [&p] { return p.grad_dest(); },
                                     .done = [&p](Exec<D>& e) { p.grad_done(e); }});
    return out;
  }
  // On a leaf that requires grad: its gradient is then handed over, not kept.
  void set_grad_sink(GradSink<T, D> sink) {
    if (!node().leaf || !node().requires_grad)
      throw ValueError(ddp::detail::str(
          "ddp: autograd: a gradient sink needs a leaf that requires grad, but this "
          "value ",
          node().leaf ? "does not require grad" : "is the output of op ",
          node().leaf ? "" : node().op, "; create it with Var::leaf(t, true)"));
    node().sink = std::make_unique<GradSink<T, D>>(std::move(sink));
  }

  bool defined() const noexcept { return static_cast<bool>(n_); }
  const Tensor<T, D>& value() const { return node().value; }
  const Shape& shape() const { return node().value.shape(); }
  int rank() const { return shape().rank(); }
  std::int64_t numel() const { return shape().numel(); }
  bool requires_grad() const { return node().requires_grad; }
  bool is_leaf() const { return node().leaf; }
  const char* op() const { return node().op; }
  const Exec<D>& exec() const { return node().exec; }

  // A leaf's accumulated gradient (same shape as value()).
  bool has_grad() const { return node().has_grad; }
  const Tensor<T, D>& grad() const {
    if (!node().has_grad)
      throw ValueError(ddp::detail::str(
          "ddp: autograd: this ", node().leaf ? "leaf" : "intermediate value", " of shape ",
          shape(), " has no gradient: ",
          !node().requires_grad ? "it does not require grad (Var::leaf(t, true) asks for one)"
          : node().leaf
              ? (node().sink ? "its gradient went to its GradSink (the parameter's grad())"
                             : "no backward() has reached it since zero_grad()")
              : "only leaves keep their gradient"));
    return node().grad;
  }
  void zero_grad() noexcept {
    if (n_) n_->has_grad = false;
  }
  // The same value as a leaf that requires no grad (shares nothing it could change).
  Var detach() const {
    auto n = std::make_shared<Node<T, D>>();
    n->value = Tensor<T, D>::borrow(const_cast<T*>(value().data()), shape());
    n->exec = exec();
    n->inputs.clear();
    Var out(std::move(n));
    out.keep_ = n_;  // the borrowed memory's owner
    return out;
  }

  // d(this)/d(leaves) for a one-element value (seed 1).
  void backward(bool retain_graph = false) const {
    if (numel() != 1)
      throw ValueError(
          ddp::detail::str("ddp: autograd: backward() without a seed gradient needs a one-element "
                           "value, but the output of ",
                           op(), " has shape ", shape(),
                           "; reduce it first (sum(), mean()) or pass the seed: backward(dy)"));
    Tensor<T, D> seed(shape());
    Kernels<D>::fill(exec(), seed.view(), T(1));
    run_backward(std::move(seed), retain_graph);
  }
  // Backward with d(root)/d(this) = seed (this value's shape), for a value of any shape.
  void backward(const Tensor<T, D>& seed, bool retain_graph = false) const {
    if (!(seed.shape() == shape()))
      throw ValueError(ddp::detail::str("ddp: autograd: backward: the seed gradient has shape ",
                                        seed.shape(), " but the output of ", op(), " has shape ",
                                        shape()));
    Tensor<T, D> s(shape());
    copy(seed.cview(), s.view(), exec());
    run_backward(std::move(s), retain_graph);
  }

  // For ops: the node, and a new non-leaf result recorded with its inputs and backward.
  Node<T, D>& node() const {
    if (!n_)
      throw ValueError("ddp: autograd: use of an empty Var (default-constructed or moved from)");
    return *n_;
  }
  const NodePtr& node_ptr() const noexcept { return n_; }
  explicit Var(NodePtr n) : n_(std::move(n)) {}

 private:
  void run_backward(Tensor<T, D> seed, bool retain_graph) const {
    Node<T, D>& root = node();
    if (!root.requires_grad)
      throw ValueError(
          ddp::detail::str("ddp: autograd: backward() on a value that does not require grad (the "
                           "output of ",
                           root.op, ", shape ", root.value.shape(),
                           "): no input requires grad, or it was computed inside a NoGradGuard"));
    // Reachable nodes that require grad, and how many edges into each one come from them.
    std::vector<Node<T, D>*> order;
    std::unordered_map<Node<T, D>*, int> pending;
    std::vector<Node<T, D>*> stack{&root};
    std::vector<NodePtr> alive;
    pending[&root] = 0;
    while (!stack.empty()) {
      Node<T, D>* n = stack.back();
      stack.pop_back();
      if (n->freed)
        throw ValueError(
            ddp::detail::str("ddp: autograd: backward through the graph a second time (op ", n->op,
                             ", shape ", n->value.shape(),
                             "): the first backward() freed it; pass retain_graph = true to the "
                             "first call to backward twice"));
      order.push_back(n);
      for (const auto& in : n->inputs) {
        if (!in->requires_grad) continue;
        auto [it, fresh] = pending.try_emplace(in.get(), 0);
        ++it->second;
        if (fresh) {
          stack.push_back(in.get());
          alive.push_back(in);  // freeing a node's inputs below must not free nodes still to run
        }
      }
    }
    std::sort(order.begin(), order.end(),
              [](const Node<T, D>* a, const Node<T, D>* b) { return a->seq > b->seq; });
    root.accumulate(std::move(seed));
    for (Node<T, D>* n : order) {
      if (n->leaf) {
        if (pending[n] == 0) finish_leaf(*n);  // the root itself is a leaf
        continue;
      }
      if (n->has_grad) n->backward_fn(*n);
      n->has_grad = false;
      n->grad = Tensor<T, D>();
      for (const auto& in : n->inputs) {
        if (!in->requires_grad) continue;
        if (--pending[in.get()] == 0 && in->leaf) finish_leaf(*in);
      }
      if (!retain_graph) {
        n->inputs.clear();
        n->backward_fn = nullptr;
        n->freed = true;
      }
    }
  }

  // The leaf's gradient of this backward is final: hand it to the sink (or keep it in grad()).
  static void finish_leaf(Node<T, D>& n) {
    if (!n.sink || !n.has_grad) return;
    TensorView<T, D> dst = n.sink->dest();
    expect_shape(dst, n.value.shape(), "the sink's gradient destination", "autograd backward");
    copy(n.grad.cview(), dst, n.exec);
    n.has_grad = false;
    n.grad = Tensor<T, D>();
    n.sink->done(n.exec);
  }

  NodePtr n_;
  NodePtr keep_;
};

}  // namespace ddp::autograd
