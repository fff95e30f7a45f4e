// Module: the base of every layer; owns named parameters, buffers and child modules in registration
// order.
// SPDX-License-Identifier: MIT
//
// Explicit forward and backward, no autograd (docs/decisions/0006):
//     Tensor<T, D> y  = m.forward(exec, x);    // keeps what backward needs (a VIEW of x)
//     Tensor<T, D> dx = m.backward(exec, dy);  // uses the LAST forward's state; fills grads
// backward must follow a forward of the same module; calling it twice for one forward is an error.
// THE CALLER KEEPS x ALIVE AND UNCHANGED UNTIL backward RETURNS: modules that need their input in
// backward (ReLU and the residual blocks: their output) keep a view, not a copy (copying every
// activation would double a step's memory traffic). Inside a model parents keep their children's
// inputs; at the top the training loop owns the batch. A batch destroyed in between is a use after
// free: on the GPU the caching allocator may hand its memory to a backward tensor (silently wrong
// gradients); on the CPU the ASan build (DDP_CPU_CACHING=0, scripts/sanitize.sh) reports it;
// DDP_CHECK_INPUTS=1 (nn/check_inputs.hpp) makes backward throw naming the module, on both devices.
// So:
//     while (auto batch = loader.next()) {
//       model.forward(exec, batch->images.cview()); ...; model.backward(exec, dy);
//     }
//
// Names: every parameter and buffer carries its full torchvision state_dict key. A module registers
// its tensors and children under local names ("weight", "layer1", "0"); attaching a child prefixes
// its whole subtree, so a tree built bottom-up ends with names like
// "layer1.0.downsample.1.running_var". Order: parameters() and buffers() walk depth-first in
// registration order; state_dict_keys() lists per module its parameters, its buffers, then each
// child (torch's state_dict order: bn1.weight, bn1.bias, bn1.running_mean, bn1.running_var,
// bn1.num_batches_tracked).
//
// Writing a module: models built from Sequential, Residual (nn/residual_wrapper.hpp) and the layers
// need no backward code. Otherwise derive from Module<T, D>, register parameters and children in
// the constructor, implement describe(), forward_impl (keep views, not copies) and backward_impl
// (return dx, write each parameter's gradient into p.grad_dest(), then call p.grad_done(exec),
// which accumulates and tells DDP). E.g. y = x * scale[c] over the last dimension (ChannelScale in
// tests/unit/nn/test_compose.cpp):
//     forward_impl:  y[i] = x[i] * scale[i % C];  x_ = x;
//     backward_impl: dx[i] = dy[i] * scale[i % C];
//                    g = scale_->grad_dest();  g[c] = sum_{i % C == c} dy[i] x_[i];
//                    scale_->grad_done(exec);  return dx;
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/core/trace.hpp"
#include "ddp/nn/check_inputs.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::nn {

// A non-trainable state tensor (BatchNorm's running statistics and step counter). Exactly one of
// real() (dtype T) and count() (int64) is in use, as dtype() says; DDP broadcasts both kinds.
template <class T, Device D>
class Buffer {
 public:
  Buffer(std::string local_name, Shape shape, DType dtype)
      : local_name_(local_name), name_(std::move(local_name)), dtype_(dtype) {
    if (dtype == DType::I64) {
      count_ = Tensor<std::int64_t, D>(shape);
      detail::zero_fill(count_);
    } else {
      real_ = Tensor<T, D>(shape);
      detail::zero_fill(real_);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const std::string& name() const noexcept { return name_; }
  const std::string& local_name() const noexcept { return local_name_; }
  DType dtype() const noexcept { return dtype_; }
  bool is_integer() const noexcept { return dtype_ == DType::I64; }
  Tensor<T, D>& real() noexcept { return real_; }
  Tensor<std::int64_t, D>& count() noexcept { return count_; }
  const Shape& shape() const noexcept { return is_integer() ? count_.shape() : real_.shape(); }
  // Raw bytes (for broadcasting and checkpoints): pointer and size of whichever tensor is in use.
  void* data() noexcept {
    return is_integer() ? static_cast<void*>(count_.data()) : static_cast<void*>(real_.data());
  }
  std::size_t bytes() const noexcept { return is_integer() ? count_.bytes() : real_.bytes(); }

  void set_full_name(std::string prefix) { name_ = std::move(prefix) + local_name_; }

 private:
  std::string local_name_, name_;
  DType dtype_;
  Tensor<T, D> real_;              // (C) running_mean / running_var
  Tensor<std::int64_t, D> count_;  // () num_batches_tracked
};

// T: the element type of parameters, gradients, buffers and optimizer state; A: that of
// activations and their gradients. A = T but for bf16 activation storage (Module<float, D,
// bfloat16>, docs/decisions/0070), which the ResNet layers support.
template <class T, Device D, class A = T>
class Module {
 public:
  using value_type = T;
  using activation_type = A;
  using device_type = D;

  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  // y = f(x). Throws ValueError on inputs of the wrong shape (naming this module by its full name).
  // While a trace recorder is active (core/trace.hpp, --trace) each call is a span named by path().
  Tensor<A, D> forward(Exec<D>& exec, TensorView<const A, D> x) {
    trace::Span span = trace_span("forward");
    remember_input(x.data());
    return forward_impl(exec, x);
  }
  // y = f(ids) for the modules whose input is int64 token ids (Embedding, GPT and its
  // EmbeddingStem); the same trace span. Every other module throws ValueError. Like x, THE CALLER
  // KEEPS ids ALIVE until backward returns.
  Tensor<A, D> forward(Exec<D>& exec, TensorView<const std::int64_t, D> ids) {
    trace::Span span = trace_span("forward");
    remember_input(ids.data());
    return forward_ids_impl(exec, ids);
  }
  // dx = d(loss)/dx from dy = d(loss)/dy of the last forward; accumulates parameter gradients and
  // calls each parameter's grad-ready hook as soon as its gradient is final.
  Tensor<A, D> backward(Exec<D>& exec, TensorView<const A, D> dy) {
    trace::Span span = trace_span("backward");
    check_input_kept();
    return backward_impl(exec, dy);
  }
  // For errors and printing, e.g. "Conv2d(64, 128, kernel=3, stride=2, padding=1)".
  virtual std::string describe() const = 0;

  // Full path of this module ("" for the root, "layer1.0.conv1" inside a ResNet).
  const std::string& path() const noexcept { return path_; }
  // "module 'layer1.0.conv1' (Conv2d(...))": how errors refer to a module.
  std::string where() const {
    return ddp::detail::str("module '", path_.empty() ? std::string("<root>") : path_, "' (",
                            describe(), ")");
  }

  // All parameters of this subtree, depth-first in registration order (torch's parameters()).
  std::vector<Parameter<T, D>*> parameters() {
    std::vector<Parameter<T, D>*> out;
    visit([&](Module& m) {
      for (auto& p : m.params_) out.push_back(p.get());
    });
    return out;
  }
  std::vector<Buffer<T, D>*> buffers() {
    std::vector<Buffer<T, D>*> out;
    visit([&](Module& m) {
      for (auto& b : m.buffers_) out.push_back(b.get());
    });
    return out;
  }
  // torch's state_dict() keys in its order (per module: parameters, buffers, then children).
  std::vector<std::string> state_dict_keys() {
    std::vector<std::string> out;
    visit([&](Module& m) {
      for (auto& p : m.params_) out.push_back(p->name());
      for (auto& b : m.buffers_) out.push_back(b->name());
    });
    return out;
  }
  // Parameter by full name, or nullptr.
  Parameter<T, D>* find_parameter(const std::string& name) {
    for (auto* p : parameters())
      if (p->name() == name) return p;
    return nullptr;
  }
  Buffer<T, D>* find_buffer(const std::string& name) {
    for (auto* b : buffers())
      if (b->name() == name) return b;
    return nullptr;
  }
  std::int64_t num_parameters() {
    std::int64_t n = 0;
    for (auto* p : parameters()) n += p->numel();
    return n;
  }

  // Training (BatchNorm: batch statistics) or evaluation mode (running statistics); recursive.
  void train(bool on = true) {
    visit([&](Module& m) { m.training_ = on; });
  }
  void eval() { train(false); }
  bool is_training() const noexcept { return training_; }

  void zero_grad() {
    for (auto* p : parameters()) p->zero_grad();
  }
  // Installs the same hook on every parameter of the subtree (DDP's entry point).
  void set_grad_ready_hook(const typename Parameter<T, D>::GradReadyHook& hook) {
    for (auto* p : parameters()) p->set_grad_ready_hook(hook);
  }

  // Calls f(module) on this module and then on each descendant, depth-first in registration order.
  template <class F>
  void visit(F&& f) {
    f(*this);
    for (auto& c : children_) c.second->visit(f);
  }
  const std::vector<std::pair<std::string, Module*>>& children() const noexcept {
    return children_view_;
  }

 protected:
  // What forward() and backward() run (the public calls add the trace span).
  virtual Tensor<A, D> forward_impl(Exec<D>& exec, TensorView<const A, D> x) = 0;
  virtual Tensor<A, D> backward_impl(Exec<D>& exec, TensorView<const A, D> dy) = 0;
  // What forward(exec, ids) runs: modules that take token ids override it (and reject T values in
  // forward_impl with reject_values).
  virtual Tensor<A, D> forward_ids_impl(Exec<D>&, TensorView<const std::int64_t, D> ids) {
    throw ValueError(
        ddp::detail::str("ddp: ", where(),
                         ": takes values of the model's floating-point type, got int64 "
                         "token ids (shape ",
                         ids.shape(),
                         "); only modules with an embedding "
                         "(Embedding, GPT) take ids"));
  }
  // forward_impl of a module that takes token ids: the ValueError for T values of shape `shape`.
  [[noreturn]] void reject_values(const Shape& shape) const {
    throw ValueError(ddp::detail::str("ddp: ", where(),
                                      ": takes int64 token ids, got values of the model's "
                                      "floating-point type (shape ",
                                      shape,
                                      "); pass the ids as a "
                                      "TensorView<const std::int64_t, D> to forward(exec, ids)"));
  }
  // The trace span of one call (`phase`: "forward" or "backward"), named by path() ("model" for the
  // root); for entry points other than forward/backward, such as BatchNorm2d's forward_act.
  trace::Span trace_span(std::string_view phase) const {
    return trace::Span(phase, path_.empty() ? std::string_view("model") : std::string_view(path_),
                       "module", [this] { return describe(); });
  }
  // Names a module that a parent owns outside the tree (no state_dict entries, e.g. ResNet's
  // pools): errors and traces then call it `path` instead of "<root>".
  static void set_detached_path(Module& m, std::string path) { m.set_path(std::move(path)); }

  Parameter<T, D>& register_parameter(std::string local_name, Shape shape,
                                      Layout layout = Layout::Plain) {
    params_.push_back(std::make_unique<Parameter<T, D>>(std::move(local_name), shape, layout));
    params_.back()->set_full_name(prefix());
    return *params_.back();
  }
  Buffer<T, D>& register_buffer(std::string local_name, Shape shape, DType dtype) {
    buffers_.push_back(std::make_unique<Buffer<T, D>>(std::move(local_name), shape, dtype));
    buffers_.back()->set_full_name(prefix());
    return *buffers_.back();
  }
  // Takes ownership of `child` under `local_name` and renames its subtree; returns it.
  template <class M>
  M& register_module(std::string local_name, std::unique_ptr<M> child) {
    M& ref = *child;
    child->set_path(path_.empty() ? local_name : path_ + "." + local_name);
    children_view_.emplace_back(local_name, child.get());
    children_.emplace_back(std::move(local_name), std::move(child));
    return ref;
  }

  // DDP_CHECK_INPUTS (nn/check_inputs.hpp): remember_input stamps the pool block holding the input
  // at `p` (forward calls it, as does Conv2d::rebind_input); check_input_kept throws ValueError if
  // that block was freed since, once per stamp (every backward entry point calls it). A forward
  // with the check off drops an earlier stamp. A module whose backward never reads its input
  // (MaxPool2d, Dropout) calls backward_reads_no_input() in its constructor: parents may then free
  // that input early (ResNet's recompute_relu, GPT's blocks) and the check leaves it alone.
  void backward_reads_no_input() noexcept { reads_input_ = false; }
  void remember_input(const void* p) {
    if (check_inputs_enabled() && reads_input_)
      input_stamp_ = {p, p ? Allocator<D>::stamp(p) : std::nullopt};
    else if (input_stamp_.second)
      input_stamp_ = {};
  }
  void check_input_kept() {
    if (!check_inputs_enabled() || !input_stamp_.second) return;
    const std::optional<BlockStamp> now = Allocator<D>::stamp(input_stamp_.first);
    if (now == input_stamp_.second) {
      input_stamp_ = {};  // checked once per forward
      return;
    }
    throw ValueError(ddp::detail::str(
        "ddp: backward of ", where(), ": the input of its forward (at ", input_stamp_.first,
        ") was freed", now ? " and its memory handed to another tensor" : "", " before backward (",
        kCheckInputsVar,
        "=1); keep the batch / input tensor alive until backward returns (modules keep a view of "
        "their input, "
        "not a copy)"));
  }

  // Throws the ValueError backward() raises when no forward state is kept.
  void require_forward_state(bool have, const char* what = "forward") const {
    if (!have)
      throw ValueError(ddp::detail::str(
          "ddp: backward of ", where(), " called without a preceding ", what,
          " (or twice for one forward); call forward(x) before each backward(dy)"));
  }

 private:
  std::string prefix() const { return path_.empty() ? std::string() : path_ + "."; }
  void set_path(std::string path) {
    path_ = std::move(path);
    for (auto& p : params_) p->set_full_name(prefix());
    for (auto& b : buffers_) b->set_full_name(prefix());
    for (auto& c : children_) c.second->set_path(path_ + "." + c.first);
  }

  std::string path_;
  bool training_ = true;
  // DDP_CHECK_INPUTS: the last forward's input
  std::pair<const void*, std::optional<BlockStamp>> input_stamp_;
  bool reads_input_ = true;  // backward reads the forward's input (backward_reads_no_input)
  std::vector<std::unique_ptr<Parameter<T, D>>> params_;
  std::vector<std::unique_ptr<Buffer<T, D>>> buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  std::vector<std::pair<std::string, Module*>> children_view_;
};

}  // namespace ddp::nn
