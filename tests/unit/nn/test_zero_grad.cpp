// zero_grad() runs no kernel (docs/decisions/0062): it only marks the gradients "None", and the next backward must
// overwrite every element of every gradient. Checked by poisoning grad() with NaN before zero_grad(): the poison
// stays (nothing was filled), and the backward that follows gives, bit for bit, the gradients of the same backward
// into freshly constructed (zeroed) gradients. Every layer type of the ResNets and of GPT takes part, including
// the parameters a step uses only partly (GPT's unused embedding rows and pos_emb rows past T).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include <ddp/nn/gpt.hpp>
#include <ddp/nn/resnet.hpp>

#include "random_tensor.hpp"

namespace test_zero_grad {

using namespace ddp;

std::vector<std::vector<float>> grads_of(nn::Module<float, Cpu>& m) {
  std::vector<std::vector<float>> out;
  for (auto* p : m.parameters()) out.emplace_back(p->grad().data(), p->grad().data() + p->numel());
  return out;
}

// step(): one forward and backward of m on fixed inputs.
void check_overwrites(nn::Module<float, Cpu>& m, const std::function<void()>& step) {
  m.zero_grad();
  step();  // into the gradients as constructed (zeros)
  const auto first = grads_of(m);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (auto* p : m.parameters()) std::fill(p->grad().data(), p->grad().data() + p->numel(), nan);
  m.zero_grad();
  for (auto* p : m.parameters()) {
    CAPTURE(p->name());
    REQUIRE_FALSE(p->has_grad());
    REQUIRE(std::isnan(p->grad().data()[0]));  // zero_grad() wrote nothing
  }
  step();
  const auto second = grads_of(m);
  const auto params = m.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    CAPTURE(params[i]->name());
    CHECK(params[i]->has_grad());
    CHECK(std::memcmp(first[i].data(), second[i].data(), first[i].size() * sizeof(float)) == 0);
  }
}

}  // namespace test_zero_grad

TEST_SUITE("nn") {
  TEST_CASE("zero_grad fills nothing, and the next backward overwrites every gradient (ResNet-18/50, GPT)") {
    using namespace test_zero_grad;
    Exec<Cpu> exec;
    for (const char* arch : {"resnet18", "resnet50"}) {
      CAPTURE(arch);
      nn::ResNet<float, Cpu> m({.arch = arch, .num_classes = 5, .seed = 2, .width = 4});
      const Tensor<float, Cpu> x = test::randn(Shape{2, 32, 32, 3}, 1), dy = test::randn(Shape{2, 5}, 2);
      check_overwrites(m, [&] {
        const Tensor<float, Cpu> y = m.forward(exec, x.cview());
        m.backward(exec, dy.cview());
      });
    }
    nn::GPT<float, Cpu> g({.vocab_size = 7, .block_size = 6, .n_layer = 2, .n_head = 2, .n_embd = 8,
                           .embd_pdrop = 0.0, .resid_pdrop = 0.0, .seed = 11});
    Tensor<std::int64_t, Cpu> ids(Shape{2, 5});  // T = 5 < block_size; ids 0..4 of 7: two embedding rows unused
    for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data()[i] = i % 5;
    const Tensor<float, Cpu> dlogits = test::randn(Shape{2, 5, 7}, 3);
    check_overwrites(g, [&] {
      const Tensor<float, Cpu> y = g.forward(exec, ids.cview());
      g.backward(exec, dlogits.cview());
    });
  }
}
