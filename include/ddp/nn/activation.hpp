// Activations as modules, one template over the ops of kernels/unary_ops.hpp: nn::SiLU, nn::Tanh,
// nn::Sigmoid, nn::Mish (torch.nn's classes of those names); any shape.
// SPDX-License-Identifier: MIT
//
// Forward keeps a view of what the op's gradient reads (kernels::reads_of): the input x (SiLU,
// Mish) or its own output y (Tanh, Sigmoid, as ReLU). THE CALLER KEEPS x, or y, ALIVE until
// backward returns (nn/module.hpp). Runs on any device through Kernels<D>::unary_forward /
// unary_backward. A new activation is an op struct in kernels/unary_ops.hpp and an alias below.
#pragma once

#include <string>

#include "ddp/core/error.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/kernels/unary_ops.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

template <class T, Device D, class F>
class Activation : public Module<T, D> {
 public:
  std::string describe() const override { return std::string(F::module_name) + "()"; }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    Tensor<T, D> y(x.shape());
    Kernels<D>::unary_forward(exec, x, y.view(), F{});
    kept_ = kReadsInput ? x : y.cview();
    have_kept_ = true;
    return y;
  }
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_kept_);
    have_kept_ = false;
    static const std::string op = std::string(F::module_name) + ".backward";
    expect_shape(dy, kept_.shape(), "output gradient dy", op.c_str());
    Tensor<T, D> dx(dy.shape());
    const TensorView<const T, D> none;
    Kernels<D>::unary_backward(exec, kReadsInput ? kept_ : none, kReadsInput ? none : kept_, dy,
                               dx.view(), F{});
    return dx;
  }

 private:
  static_assert(kernels::reads_of<F>() != kernels::Reads::Both,
                "ddp: an activation module keeps one tensor: its op must read x or y, not both");
  static constexpr bool kReadsInput = kernels::reads_of<F>() == kernels::Reads::Input;
  TensorView<const T, D> kept_;  // the last forward's x or y (kReadsInput), owned by the caller
  bool have_kept_ = false;
};

template <class T, Device D>
using SiLU = Activation<T, D, kernels::SiluOp<T>>;
template <class T, Device D>
using Tanh = Activation<T, D, kernels::TanhOp<T>>;
template <class T, Device D>
using Sigmoid = Activation<T, D, kernels::SigmoidOp<T>>;
template <class T, Device D>
using Mish = Activation<T, D, kernels::MishOp<T>>;

}  // namespace ddp::nn
