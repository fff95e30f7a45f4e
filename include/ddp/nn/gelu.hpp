// GELU as a module (torch.nn.GELU): y = x Phi(x), exact (erf) or the tanh approximation; any shape.
// SPDX-License-Identifier: MIT
//
//   GeluApproximate::None (torch's default): y = x * 0.5 * (1 + erf(x / sqrt 2))
//   GeluApproximate::Tanh (approximate='tanh'): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// Which minGPT uses: the DDP tutorial's minGPT-ddp (pytorch/examples
// distributed/minGPT-ddp/mingpt/model.py) builds its MLP with nn.GELU(), the exact form;
// karpathy/minGPT's NewGELU (and GPT-2's gelu) is the tanh form,
// 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))). Forward keeps a view of x (THE CALLER KEEPS x ALIVE
// until backward returns, nn/module.hpp); backward returns dx = dy * gelu'(x). Runs on any device
// through Kernels<D>::gelu_forward / gelu_backward, element-wise functors of
// kernels/elementwise.hpp (the CUDA instantiation compiles with them but has not run yet).
#pragma once

#include <cstdint>
#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/module.hpp"

namespace ddp::nn {

enum class GeluApproximate : std::uint8_t {
  None,  // exact, with erf (torch.nn.GELU(), the tutorial's minGPT-ddp)
  Tanh,  // the tanh approximation (torch.nn.GELU(approximate='tanh'), karpathy/minGPT's NewGELU)
};

template <class T, Device D>
class GELU : public Module<T, D> {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::None) : approximate_(approximate) {}

  GeluApproximate approximate() const noexcept { return approximate_; }
  std::string describe() const override {
    return ddp::detail::str("GELU(approximate='",
                            approximate_ == GeluApproximate::Tanh ? "tanh" : "none", "')");
  }

 protected:
  Tensor<T, D> forward_impl(Exec<D>& exec, TensorView<const T, D> x) override {
    Tensor<T, D> y(x.shape());
    Kernels<D>::gelu_forward(exec, x, y.view(), tanh_form());
    x_ = x;
    have_x_ = true;
    return y;
  }
  Tensor<T, D> backward_impl(Exec<D>& exec, TensorView<const T, D> dy) override {
    this->require_forward_state(have_x_);
    have_x_ = false;
    expect_shape(dy, x_.shape(), "output gradient dy", "GELU.backward");
    Tensor<T, D> dx(dy.shape());
    Kernels<D>::gelu_backward(exec, x_, dy, dx.view(), tanh_form());
    return dx;
  }

 private:
  bool tanh_form() const noexcept { return approximate_ == GeluApproximate::Tanh; }

  GeluApproximate approximate_;
  TensorView<const T, D> x_;  // the last forward's input, owned by the caller
  bool have_x_ = false;
};

}  // namespace ddp::nn
