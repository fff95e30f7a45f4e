// tensor: Philox4x32-10 known answers, reproducible and independent per-rank streams, distributions.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

using ddp::Cpu;
using ddp::Generator;
using ddp::Tensor;

TEST_SUITE("tensor") {
  TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors") {
    using A4 = std::array<std::uint32_t, 4>;
    CHECK(ddp::philox4x32_10({0, 0, 0, 0}, {0, 0}) == A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
    CHECK(ddp::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
          A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
    CHECK(ddp::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
          A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
  }

  TEST_CASE("the same (seed, rank, stream) reproduces; other ranks and streams differ") {
    auto a = Tensor<float, Cpu>::empty({1000}), b = Tensor<float, Cpu>::empty({1000}),
         c = Tensor<float, Cpu>::empty({1000}), d = Tensor<float, Cpu>::empty({1000});
    Generator(42, 0).fill_normal(a.view(), 0, 1);
    Generator(42, 0).fill_normal(b.view(), 0, 1);
    Generator(42, 1).fill_normal(c.view(), 0, 1);
    Generator(42, 0, ddp::kStreamData).fill_normal(d.view(), 0, 1);
    int same_ab = 0, same_ac = 0, same_ad = 0;
    for (int i = 0; i < 1000; ++i) {
      same_ab += a(i) == b(i);
      same_ac += a(i) == c(i);
      same_ad += a(i) == d(i);
    }
    CHECK(same_ab == 1000);
    CHECK(same_ac == 0);
    CHECK(same_ad == 0);
  }

  TEST_CASE("fills advance the offset by ceil(n / 4) blocks and can be resumed from a saved state") {
    Generator g(7, 3, ddp::kStreamInit);
    auto a = Tensor<float, Cpu>::empty({6});
    g.fill_uniform(a.view(), 0, 1);
    CHECK(g.offset() == 2);
    const ddp::RngState saved = g.state();
    auto next1 = Tensor<float, Cpu>::empty({5});
    g.fill_normal(next1.view(), 0, 1);
    Generator resumed(saved);
    auto next2 = Tensor<float, Cpu>::empty({5});
    resumed.fill_normal(next2.view(), 0, 1);
    for (int i = 0; i < 5; ++i) CHECK(next1(i) == next2(i));
    // Two fills of 8 equal one fill of 16 (8 is a multiple of 4 words per block).
    Generator g1(9), g2(9);
    auto x = Tensor<double, Cpu>::empty({16}), y1 = Tensor<double, Cpu>::empty({8}),
         y2 = Tensor<double, Cpu>::empty({8});
    g1.fill_uniform(x.view(), -1, 1);
    g2.fill_uniform(y1.view(), -1, 1);
    g2.fill_uniform(y2.view(), -1, 1);
    for (int i = 0; i < 8; ++i) {
      CHECK(x(i) == y1(i));
      CHECK(x(8 + i) == y2(i));
    }
    // Element 0 of a uniform fill is word 0 of block 0: (w + 0.5) / 2^32.
    const auto w = Generator(9).block(0);
    CHECK(x(0) == -1.0 + 2.0 * ((w[0] + 0.5) / 4294967296.0));
  }

  TEST_CASE("uniform and normal fills have the right moments; uniform_int stays in range") {
    auto u = Tensor<double, Cpu>::empty({200000}), n = Tensor<double, Cpu>::empty({200000});
    Generator g(1);
    g.fill_uniform(u.view(), 2, 4);
    g.fill_normal(n.view(), 1, 3);
    double su = 0, sn = 0, sn2 = 0, lo = 10, hi = -10;
    for (std::int64_t i = 0; i < u.numel(); ++i) {
      su += u(i);
      lo = std::min(lo, u(i));
      hi = std::max(hi, u(i));
      sn += n(i);
      sn2 += (n(i) - 1) * (n(i) - 1);
    }
    const double cnt = static_cast<double>(u.numel());
    CHECK(su / cnt == doctest::Approx(3.0).epsilon(0.005));
    CHECK(lo >= 2.0);
    CHECK(hi < 4.0);
    CHECK(sn / cnt == doctest::Approx(1.0).epsilon(0.02));
    CHECK(std::sqrt(sn2 / cnt) == doctest::Approx(3.0).epsilon(0.01));
    std::vector<int> counts(7, 0);
    for (int i = 0; i < 70000; ++i) {
      const auto v = g.uniform_int(7);
      REQUIRE(v < 7);
      ++counts[v];
    }
    for (int c : counts) CHECK(std::abs(c - 10000) < 500);
    CHECK(g.uniform_int(1) == 0);
  }
}
