// Parameter: a trainable tensor with its gradient, its torchvision name, and the on_grad_ready hook
// DDP uses.
// SPDX-License-Identifier: MIT
//
// Gradient protocol (docs/decisions/0006): a module's backward computes each of its parameters'
// gradients and hands every one over as soon as it is final:
//     auto dw = p.grad_dest(exec);  // grad() itself, or scratch when accumulating
//     Kernels<D>::conv2d_backward(exec, {..., .dw = dw, ...});
//     p.grad_done(exec);            // grad += scratch if needed, then the on_grad_ready hook
// Gradients accumulate across backward calls until zero_grad(), like PyTorch's .grad (no_sync()
// accumulation relies on it). The first backward after zero_grad() writes grad() directly (no
// extra pass), and zero_grad() runs no kernel (docs/decisions/0062). The hook runs on the thread
// that runs backward; DDP uses it to mark the parameter ready in its bucket and to launch the
// bucket's all-reduce while backward carries on with earlier layers.
//
// Layout: value() is in ddp's layout: conv weights are KRSC (C_out, kH, kW, C_in), everything else
// has PyTorch's shape. torch_shape() is the shape in torchvision's state_dict (OIHW for convs),
// which checkpoints write (train/checkpoint.hpp converts).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::nn {

// How value() relates to the state_dict tensor of the same name.
enum class Layout : std::uint8_t {
  Plain,  // same shape and element order as PyTorch (BN weight/bias, Linear weight/bias)
  Krsc,   // conv weight: ours (C_out, kH, kW, C_in), PyTorch's (C_out, C_in, kH, kW)
};

namespace detail {
// Sets every element of t to v with Kernels<D>::fill on the default Exec: the calling thread on
// the CPU; for CUDA the legacy default stream, which orders with every blocking stream.
template <class T, Device D>
void fill_value(Tensor<T, D>& t, T v) {
  Kernels<D>::fill(Exec<D>{}, t.view(), v);
}
template <class T, Device D>
void zero_fill(Tensor<T, D>& t) {
  fill_value(t, T(0));
}
// Fills t with fill_host(view) run on a host tensor, then copies that into t on the default Exec:
// the random initialisers run on the CPU, so a GPU model gets exactly the CPU model's initial
// weights. The upload's copy() overload (tensor/cuda/copy.hpp) is found by argument-dependent
// lookup when this is instantiated.
template <class T, Device D, class F>
void fill_via_host(Tensor<T, D>& t, F&& fill_host) {
  Tensor<T, Cpu> host(t.shape());
  fill_host(host.view());
  copy(host.cview(), t.view(), Exec<D>{});  // pageable source: read before the call returns
}
// a += b elementwise (same shape), on any device.
template <class T, Device D>
void add_into(Exec<D>& exec, TensorView<T, D> a, TensorView<const T, D> b) {
  Kernels<D>::axpy(exec, T(1), b, a);
}
}  // namespace detail

template <class T, Device D>
class Parameter {
 public:
  using GradReadyHook = std::function<void(Parameter&)>;

  // `local_name` is the name inside its module ("weight"); the owning module sets the full name.
  Parameter(std::string local_name, Shape shape, Layout layout = Layout::Plain)
      : local_name_(local_name),
        name_(std::move(local_name)),
        layout_(layout),
        value_(shape),
        grad_(shape) {
    detail::zero_fill(value_);
    detail::zero_fill(grad_);
  }
  Parameter(const Parameter&) = delete;
  Parameter& operator=(const Parameter&) = delete;

  // Full torchvision state_dict name, e.g. "layer1.0.conv1.weight".
  const std::string& name() const noexcept { return name_; }
  const std::string& local_name() const noexcept { return local_name_; }
  Layout layout() const noexcept { return layout_; }

  Tensor<T, D>& value() noexcept { return value_; }
  const Tensor<T, D>& value() const noexcept { return value_; }
  Tensor<T, D>& grad() noexcept { return grad_; }
  const Tensor<T, D>& grad() const noexcept { return grad_; }
  const Shape& shape() const noexcept { return value_.shape(); }
  std::int64_t numel() const noexcept { return value_.numel(); }

  // The shape of this tensor in torchvision's state_dict (OIHW for a KRSC conv weight).
  Shape torch_shape() const {
    const Shape& s = value_.shape();
    if (layout_ == Layout::Krsc) return Shape{s[0], s[3], s[1], s[2]};
    return s;
  }

  // Drops the gradient; the next backward overwrites grad() instead of accumulating. Until then
  // has_grad() is false and grad() holds stale values, read by no one: torch's
  // zero_grad(set_to_none=True), the default since torch 2.0. No kernel runs. Whoever writes
  // grad() by hand and then calls set_grad_written() writes all of it.
  void zero_grad() noexcept { fresh_ = true; }
  // True between zero_grad() and the first grad_done() (or set_grad_written()): the gradient counts
  // as zero, whatever grad() holds.
  bool grad_is_zero() const noexcept { return fresh_; }
  // False while the gradient is "None" in torch's terms: nothing wrote it since zero_grad() (or
  // construction). Optimizers skip such parameters (no weight decay, no momentum), and DDP leaves
  // them so when no rank used them (find_unused_parameters, docs/decisions/0025).
  bool has_grad() const noexcept { return !fresh_; }
  // Someone other than backward wrote all of grad() (DDP's reduced gradient for a parameter this
  // rank did not use): the gradient now exists, and the next backward accumulates into it.
  void set_grad_written() noexcept { fresh_ = false; }

  // gradient_as_bucket_view (DDP): grad() becomes a view of numel() elements at `slot` (D's memory,
  // owned by the caller and alive until own_grad()), holding the current gradient (copied there on
  // exec); backward then writes and accumulates straight into the slot.
  void set_grad_view(T* slot, const Exec<D>& exec) {
    Tensor<T, D> v = Tensor<T, D>::borrow(slot, value_.shape());
    copy(grad_.cview(), v.view(), exec);
    grad_ = std::move(v);
  }
  // grad() owns its memory again, with the current values (copied on exec); no-op if it does.
  void own_grad(const Exec<D>& exec) {
    if (grad_.owns_memory()) return;
    Tensor<T, D> g(value_.shape());
    copy(grad_.cview(), g.view(), exec);
    grad_ = std::move(g);
  }
  bool grad_is_view() const noexcept { return !grad_.owns_memory(); }

  // Where backward must write d(loss)/d(value), every element (its old values are not zeros):
  // grad() after zero_grad(), else a scratch buffer that grad_done() adds into grad().
  TensorView<T, D> grad_dest() {
    if (fresh_) return grad_.view();
    if (scratch_.shape() != value_.shape()) scratch_ = Tensor<T, D>(value_.shape());
    return scratch_.view();
  }
  // Finishes this backward's contribution and reports the gradient as final (calls the hook).
  void grad_done(Exec<D>& exec) {
    if (!fresh_) detail::add_into<T, D>(exec, grad_.view(), scratch_.cview());
    fresh_ = false;
    ++grad_ready_count_;
    if (hook_) hook_(*this);
  }

  // Called with this parameter each time its gradient is final during backward. One hook per
  // parameter (setting a new one replaces the old; an empty function removes it). Not thread-safe
  // against a concurrent backward.
  void set_grad_ready_hook(GradReadyHook hook) { hook_ = std::move(hook); }
  bool has_grad_ready_hook() const noexcept { return static_cast<bool>(hook_); }
  // How many times grad_done() ran (tests check one report per parameter and backward).
  std::int64_t grad_ready_count() const noexcept { return grad_ready_count_; }

  // Used by Module when the parameter's module is attached under a prefix.
  void set_full_name(std::string prefix) { name_ = std::move(prefix) + local_name_; }

 private:
  std::string local_name_;
  std::string name_;
  Layout layout_;
  Tensor<T, D> value_;    // ddp layout (see Layout)
  Tensor<T, D> grad_;     // same shape as value_
  Tensor<T, D> scratch_;  // backward output while accumulating; allocated on first need
  bool fresh_ = true;
  std::int64_t grad_ready_count_ = 0;
  GradReadyHook hook_;
};

}  // namespace ddp::nn
