// Activations as modules, one template over the ops of kernels/unary_ops.hpp: nn::SiLU, nn::Tanh,
// nn::Sigmoid, nn::Mish (torch.nn's classes of those names); any shape.
// SPDX-License-Identifier: MIT
//
// Forward keeps a view of what the op's gradient reads (kernels::reads_of): the input x (SiLU,
// Mish) or its own output y (Tanh, Sigmoid, as ReLU). THE CALLER KEEPS x, or y, ALIVE until
// backward returns (nn/module.hpp). Runs on any device through Kernels<D>::unary_forward /
// unary_backward. A new activation is an op struct in kernels/unary_ops.hpp and an alias below;
// a user's own op struct of that form works as well: nn::Activation<T, D, MyOp<T>>.
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
  std::string describe() const override { return std::string(module_name()) + "()"; }

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
    static const std::string op = std::string(module_name()) + ".backward";
    expect_shape(dy, kept_.shape(), "output gradient dy", op.c_str());
    Tensor<T, D> dx(dy.shape());
    const TensorView<const T, D> none;
    Kernels<D>::unary_backward(exec, kReadsInput ? kept_ : none, kReadsInput ? none : kept_, dy,
                               dx.view(), F{});
    return dx;
  }

 private:
  static_assert(
      kernels::reads_of<F>() != kernels::Reads::Both,
      "ddp: nn::Activation keeps one tensor for backward: give the op "
      "`static constexpr kernels::Reads reads = kernels::Reads::Input;` (grad reads x) or "
      "Reads::Output (grad reads y)");
  static constexpr const char* module_name() {
    if constexpr (requires { F::module_name; })
      return F::module_name;
    else
      return kernels::op_name<F>();
  }
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
