// core: ddp::half and ddp::bfloat16 conversions bit-equal to numpy's float16 and torch's bfloat16.
// SPDX-License-Identifier: MIT
//
// make_dtype_reference.py covers every 16-bit pattern (widening) and ~875k float32 patterns (narrowing):
// random bits, every exponent with the rounding ties and their neighbours, subnormals, overflow to inf,
// NaN and the largest finite values. NaN results are compared as "is a NaN" (payloads differ by design:
// we return a quiet NaN with the input's sign, torch returns 0x7FC0).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>

#include <ddp/core/dtype.hpp>

#include "reference_file.hpp"

namespace {
const ddp::test::RefFile& dref() {
  static const ddp::test::RefFile r = ddp::test::RefFile::generate("make_dtype_reference.py");
  return r;
}
float f32(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
bool half_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }
}  // namespace

TEST_SUITE("core") {
  TEST_CASE("half -> float equals numpy for all 65536 patterns") {
    const auto& in = dref().at("half_bits/in").i;
    const auto& want = dref().at("half_bits/f32").i;
    int bad = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const float got = ddp::half::to_float(static_cast<std::uint16_t>(in[k]));
      const float w = f32(static_cast<std::uint32_t>(want[k]));
      std::uint32_t gb;
      std::memcpy(&gb, &got, 4);
      const bool ok = (got != got) ? (w != w) : gb == static_cast<std::uint32_t>(want[k]);
      if (!ok && bad++ < 5)
        FAIL_CHECK("half bits 0x" << std::hex << in[k] << " -> 0x" << gb << ", numpy 0x" << want[k]);
    }
    CHECK(bad == 0);
  }

  TEST_CASE("bfloat16 -> float equals torch for all 65536 patterns") {
    const auto& in = dref().at("bf16_bits/in").i;
    const auto& want = dref().at("bf16_bits/f32").i;
    int bad = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const float got = ddp::bfloat16::to_float(static_cast<std::uint16_t>(in[k]));
      std::uint32_t gb;
      std::memcpy(&gb, &got, 4);
      const float w = f32(static_cast<std::uint32_t>(want[k]));
      const bool ok = (got != got) ? (w != w) : gb == static_cast<std::uint32_t>(want[k]);
      if (!ok && bad++ < 5)
        FAIL_CHECK("bf16 bits 0x" << std::hex << in[k] << " -> 0x" << gb << ", torch 0x" << want[k]);
    }
    CHECK(bad == 0);
  }

  TEST_CASE("float -> half and float -> bfloat16 round like numpy and torch (ties, subnormals, inf, NaN)") {
    const auto& in = dref().at("f32/in").i;
    const auto& half = dref().at("f32/half").i;
    const auto& bf = dref().at("f32/bf16").i;
    REQUIRE(in.size() > 800000);
    int bad_half = 0, bad_bf = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const float f = f32(static_cast<std::uint32_t>(in[k]));
      const std::uint16_t h = ddp::half::from_float(f), wh = static_cast<std::uint16_t>(half[k]);
      const bool ok_h = half_is_nan(wh) ? half_is_nan(h) : h == wh;
      if (!ok_h && bad_half++ < 5)
        FAIL_CHECK("float bits 0x" << std::hex << in[k] << " -> half 0x" << h << ", numpy 0x" << wh);
      const std::uint16_t b = ddp::bfloat16::from_float(f), wb = static_cast<std::uint16_t>(bf[k]);
      const bool ok_b = bf16_is_nan(wb) ? bf16_is_nan(b) : b == wb;
      if (!ok_b && bad_bf++ < 5)
        FAIL_CHECK("float bits 0x" << std::hex << in[k] << " -> bf16 0x" << b << ", torch 0x" << wb);
    }
    CHECK(bad_half == 0);
    CHECK(bad_bf == 0);
  }
}
