// Residual: a residual connection around any module, y = body(x) + (shortcut ? shortcut(x) : x).
// SPDX-License-Identifier: MIT
//
// The generic block for models of one's own: any body (a Sequential of convolutions, norms and
// activations, an MLP, another Residual) and an optional shortcut module (a projection where body
// changes the shape). ResNet's blocks are ResidualBlock (nn/residual.hpp), which fuses its
// BatchNorms, ReLUs and the add for speed and keeps torchvision's names; this one runs its children
// as they are. An activation after the add, relu(body(x) + x), is Sequential{Residual, ReLU}.
//   Residual<float, Cpu> r(std::move(body));                       // y = body(x) + x
//   Residual<float, Cpu> p(std::move(body), std::move(projection)); // y = body(x) + projection(x)
// Names: the children are "body" and "shortcut" (state_dict keys "body.0.weight",
// "shortcut.1.running_mean"), what the twin torch module's attributes `self.body` and
// `self.shortcut` give (docs/decisions/0065). Forward runs body then shortcut and keeps both
// outputs (their last modules may keep views of them); backward runs the shortcut's backward first,
// then the body's (torch's autograd order: the later branch first), and returns dx =
// body.backward(dy) + (shortcut ? shortcut.backward(dy) : dy).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

template <class T, Device D>
class Residual : public Module<T, D> {
 public:
  explicit Residual(std::unique_ptr<Module<T, D>> body,
                    std::unique_ptr<Module<T, D>> shortcut = nullptr) {
    if (!body)
      throw ValueError(
          "ddp: Residual(body, shortcut): body is null; pass the module the residual wraps (for y "
          "= x "
          "use Identity)");
    body_ = &this->register_module("body", std::move(body));
    if (shortcut) shortcut_ = &this->register_module("shortcut", std::move(shortcut));
  }

  Module<T, D>& body() noexcept { return *body_; }
  Module<T, D>* shortcut() noexcept { return shortcut_; }  // nullptr: the identity

  std::string describe() const override {
    return ddp::detail::str("Residual(body=", body_->describe(), ", shortcut=",
                            shortcut_ ? shortcut_->describe() : std::string("identity"), ")");
  }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    body_out_ = body_->forward(exec, x);
    TensorView<const T, D> skip = x;
    if (shortcut_) {
      shortcut_out_ = shortcut_->forward(exec, x);
      skip = shortcut_out_.cview();
    }
    if (!(skip.shape() == body_out_.shape()))
      throw ValueError(ddp::detail::str(
          "ddp: ", this->where(), ": body output ", body_out_.shape(), " and ",
          shortcut_ ? "shortcut output " : "input ", skip.shape(),
          " differ, so they cannot be added; ",
          shortcut_ ? "make the shortcut produce the body's output shape"
                    : "give the Residual a shortcut module that maps the input to the "
                      "body's output shape (e.g. a 1x1 Conv2d and a BatchNorm2d)"));
    Tensor<T, D> y(body_out_.shape());
    Kernels<D>::add(exec, body_out_.cview(), skip, y.view());
    have_forward_ = true;
    return y;
  }

  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_forward_);
    have_forward_ = false;
    expect_shape(dy, body_out_.shape(), "output gradient dy", "Residual.backward");
    Tensor<T, D> dskip = shortcut_ ? shortcut_->backward(exec, dy) : Tensor<T, D>();
    Tensor<T, D> dx = body_->backward(exec, dy);
    Kernels<D>::add(exec, dx.cview(), shortcut_ ? dskip.cview() : dy, dx.view());
    body_out_ = {};
    shortcut_out_ = {};
    return dx;
  }

 private:
  Module<T, D>* body_ = nullptr;
  Module<T, D>* shortcut_ = nullptr;
  // body(x), kept until backward (body's last module may keep a view of it)
  Tensor<T, D> body_out_;
  Tensor<T, D> shortcut_out_;  // shortcut(x), likewise
  bool have_forward_ = false;
};

}  // namespace ddp::nn
