// nn::CausalSelfAttention against minGPT's CausalSelfAttention in PyTorch (make_attention_reference.py), float32,
// the same weights, with 1 and 2 threads: the output, dx and the four parameter gradients.
// SPDX-License-Identifier: MIT
//
// Tolerance: |ddp - torch| <= 1e-5 * (|torch| + rms(torch)) per element, the RMS as the floor for elements near 0
// (the key bias's gradient is 0 up to rounding in both: the softmax cancels it).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>

#include <ddp/nn/causal_self_attention.hpp>
#include <ddp/tensor/tensor.hpp>

#include "reference_file.hpp"

namespace attn_ref_test {

using ddp::Cpu;
using ddp::Tensor;

const ddp::test::RefFile& ref() {
  static const ddp::test::RefFile r = ddp::test::RefFile::generate("make_attention_reference.py");
  return r;
}

Tensor<float, Cpu> get(const std::string& name) { return ddp::test::to_ddp_layout(ref().at("attn/" + name)); }

// The largest |got - want| / (|want| + rms(want)) over the tensor.
double worst_error(const Tensor<float, Cpu>& got, const Tensor<float, Cpu>& want) {
  REQUIRE(got.shape() == want.shape());
  double ss = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) ss += double(want.data()[i]) * want.data()[i];
  const double rms = std::sqrt(ss / double(want.numel()));
  double worst = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.data()[i], g = got.data()[i];
    worst = std::max(worst, std::abs(g - w) / (std::abs(w) + rms + 1e-30));
  }
  return worst;
}

void check_close(const Tensor<float, Cpu>& got, const Tensor<float, Cpu>& want, const std::string& what) {
  const double worst = worst_error(got, want);
  MESSAGE(what << ": max relative error " << worst);
  CAPTURE(what);
  CHECK(worst <= 1e-5);
}

}  // namespace attn_ref_test

TEST_SUITE("nn") {
  TEST_CASE("CausalSelfAttention equals minGPT's in PyTorch: output, dx and every parameter gradient") {
    namespace art = attn_ref_test;  // qualified: the unity build also sees test_torch_ops.cpp's get() and ref()
    const auto x = art::get("x"), dy = art::get("dy");
    const std::int64_t c = x.dim(2);
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      auto pool = std::make_unique<ddp::kernels::cpu::ThreadPool>(threads);
      ddp::Exec<ddp::Cpu> exec{.pool = pool.get()};
      ddp::nn::CausalSelfAttention<float, ddp::Cpu> m({.n_embd = c,
                                                       .n_head = art::ref().int_at("attn/n_head"),
                                                       .block_size = art::ref().int_at("attn/block_size")});
      for (auto* p : m.parameters()) {
        const auto v = art::get(p->name());
        REQUIRE(v.shape() == p->shape());
        std::copy(v.data(), v.data() + v.numel(), p->value().data());
      }
      m.zero_grad();
      const auto y = m.forward(exec, x.cview());
      art::check_close(y, art::get("y"), "y");
      const auto dx = m.backward(exec, dy.cview());
      art::check_close(dx, art::get("dx"), "dx");
      for (auto* p : m.parameters()) art::check_close(p->grad(), art::get("grad/" + p->name()), "grad " + p->name());
    }
  }
}
