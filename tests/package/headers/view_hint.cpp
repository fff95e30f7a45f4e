// Must NOT compile (headers.view_hint): a Tensor passed where a TensorView is expected. Before docs/decisions/0066
// g++ printed 1.6 KB of "no matching function ... no known conversion" notes; now one line that names .cview().
// SPDX-License-Identifier: MIT
#include <ddp/nn/relu.hpp>
#include <ddp/tensor/tensor.hpp>

int main() {
  ddp::Exec<ddp::Cpu> exec;
  ddp::nn::ReLU<float, ddp::Cpu> relu;
  ddp::Tensor<float, ddp::Cpu> x(ddp::Shape{2, 3});
  const auto y = relu.forward(exec, x);  // should be relu.forward(exec, x.cview())
  return y.numel() == 6 ? 0 : 1;
}
