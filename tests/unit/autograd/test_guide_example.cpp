// docs/GUIDE.md's autograd example, as written there: it compiles, and its parameters' gradients (through
// Var::parameter and nn::Parameter's protocol) equal those of plain leaves over the same values.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>

#include <ddp/autograd/autograd.hpp>
#include <ddp/nn/linear.hpp>

namespace test_guide_example {
using namespace ddp;

TEST_CASE("autograd: the GUIDE's example runs and hands fc's gradients to its parameters") {
  using V = autograd::Var<float, Cpu>;

  kernels::cpu::ThreadPool pool(2);
  Exec<Cpu> exec{.pool = &pool};
  nn::Linear<float, Cpu> fc({.in_features = 4, .out_features = 16});  // initialised as torch.nn.Linear
  auto x = V::leaf(Tensor<float, Cpu>::full({8, 4}, 0.5f), /*requires_grad=*/false, exec);
  auto w2 = V::leaf(Tensor<float, Cpu>::full({3, 16}, 0.1f), /*requires_grad=*/true, exec);
  auto w1 = V::parameter(fc.weight(), exec);  // gradient goes to fc.weight().grad()
  auto b1 = V::parameter(*fc.bias(), exec);
  auto labels = Tensor<std::int64_t, Cpu>::from({8}, {0, 1, 2, 0, 1, 2, 0, 1});

  fc.weight().zero_grad();
  fc.bias()->zero_grad();
  auto h = autograd::gelu(autograd::linear(x, w1, b1));                // (8, 16)
  auto loss = autograd::cross_entropy(autograd::linear(h, w2), labels)  // mean, as F.cross_entropy
              + autograd::sum(w1 * w1) * 1e-4f;                         // w1 used twice: gradients add
  loss.backward();
  const Tensor<float, Cpu>& dw2 = w2.grad();  // (3, 16), kept in the leaf

  CHECK(dw2.shape() == Shape{3, 16});
  CHECK(fc.weight().grad_ready_count() == 1);
  CHECK(fc.bias()->grad_ready_count() == 1);
  // The same forward over plain leaves holding copies of fc's values.
  auto lw1 = V::leaf(fc.weight().value().clone(), true, exec), lb1 = V::leaf(fc.bias()->value().clone(), true, exec);
  auto lw2 = V::leaf(Tensor<float, Cpu>::full({3, 16}, 0.1f), true, exec);
  auto lh = autograd::gelu(autograd::linear(x, lw1, lb1));
  (autograd::cross_entropy(autograd::linear(lh, lw2), labels) + autograd::sum(lw1 * lw1) * 1e-4f).backward();
  for (std::int64_t i = 0; i < 64; ++i) CHECK(fc.weight().grad().data()[i] == lw1.grad().data()[i]);
  for (std::int64_t i = 0; i < 16; ++i) CHECK(fc.bias()->grad().data()[i] == lb1.grad().data()[i]);
  for (std::int64_t i = 0; i < 48; ++i) CHECK(dw2.data()[i] == lw2.grad().data()[i]);
}

}  // namespace test_guide_example
