// Element types shared by tensors, collectives and checkpoint files: the DType tag, its size and
// name, and the 16-bit float storage types bfloat16 and half (conversion only; math happens in
// float).
// SPDX-License-Identifier: MIT
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "ddp/config.hpp"

namespace ddp {

enum class DType : std::uint8_t { F32, F64, BF16, F16, I32, I64, U8 };

// bfloat16: the top 16 bits of an IEEE float32. Conversion rounds to nearest even; NaN stays NaN.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  DDP_HOST_DEVICE explicit bfloat16(float f) : bits(from_float(f)) {}
  DDP_HOST_DEVICE explicit operator float() const { return to_float(bits); }
  DDP_HOST_DEVICE static std::uint16_t from_float(float f) {
    std::uint32_t u = bit_cast_u32(f);
    // quiet NaN
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
  }
  DDP_HOST_DEVICE static float to_float(std::uint16_t b) {
    return bit_cast_f32(static_cast<std::uint32_t>(b) << 16);
  }

 private:
  DDP_HOST_DEVICE static std::uint32_t bit_cast_u32(float f) {
    std::uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    return u;
  }
  DDP_HOST_DEVICE static float bit_cast_f32(std::uint32_t u) {
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
};

// half: IEEE binary16. Conversion rounds to nearest even, handles subnormals, infinities and NaN.
struct half {
  std::uint16_t bits = 0;
  half() = default;
  DDP_HOST_DEVICE explicit half(float f) : bits(from_float(f)) {}
  DDP_HOST_DEVICE explicit operator float() const { return to_float(bits); }

  DDP_HOST_DEVICE static std::uint16_t from_float(float f) {
    std::uint32_t x;
    __builtin_memcpy(&x, &f, 4);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    std::uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
    // subnormal or zero in half
    if (abs < 0x38800000u) {
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // rounds to zero
      const std::uint32_t exp = abs >> 23;
      std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      // 14 + (113 - exp) - 1 ... brings mantissa to half subnormal scale
      const std::uint32_t shift = 126u - exp;
      const std::uint32_t rounded =
          (mant + ((1u << (shift - 1)) - 1u) + ((mant >> shift) & 1u)) >> shift;
      return static_cast<std::uint16_t>(sign | rounded);
    }
    // rebias exponent: (127-15) << 23, mod 2^32
    abs += 0xc8000000u;
    // round to nearest even on the 13 dropped bits
    abs += 0xfffu + ((abs >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (abs >> 13));
  }
  DDP_HOST_DEVICE static float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    std::uint32_t out;
    if (exp == 0x1fu) {
      out = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
      out = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
      out = sign;
    } else {  // subnormal half: normalise
      std::uint32_t e = 113u;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      out = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    __builtin_memcpy(&f, &out, 4);
    return f;
  }
};

inline constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

// The names safetensors uses ("F32", "BF16", ...), also used in messages.
inline constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

// no value for unsupported element types: a compile error names T
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct DTypeOf<bfloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct DTypeOf<half> {
  static constexpr DType value = DType::F16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::U8;
};

template <class T>
inline constexpr DType dtype_of = DTypeOf<std::remove_cv_t<T>>::value;

}  // namespace ddp
