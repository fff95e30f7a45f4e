// Branch-free float exp and erfc that GCC vectorises (no libm call per element), for the CPU
// kernels' loops.
// SPDX-License-Identifier: MIT
//
// Why: libm's expf / erff are calls GCC does not vectorise without -ffast-math; in the CPU GELU and
// the attention's softmax they were most of those kernels' time.
//   exp(u), u <= 88:  u = n ln2 + r, |r| <= ln2 / 2, exp(r) by its degree-7 Taylor polynomial
//     (truncation 5e-9
//                     relative), 2^n put into the exponent bits; 0 once 2^n is below the smallest
//                       normal float
//                     (u < -87.3), where libm's result is a denormal or 0. Error: a few ulp.
//   erfc(z), z >= 0:  the Chebyshev fit of Numerical Recipes (Press et al., 2nd ed., section 6.2;
//     RELATIVE error
//                     below 1.2e-7 for every z): t = 1 / (1 + z / 2),
//                     erfc(z) = t exp(-z^2 - 1.26551223 + t (1.00002368 + t (...)))
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

// Each element's result depends only on that element (outputs may alias inputs exactly): no
// loop-carried dependence, which GCC cannot prove for possibly aliasing pointers on its own.
#if defined(__GNUC__) && !defined(__clang__)
#  define DDP_CPU_IVDEP _Pragma("GCC ivdep")
#elif defined(__clang__)
#  define DDP_CPU_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#  define DDP_CPU_IVDEP
#endif

namespace ddp::kernels::cpu::detail {

// exp(u) for float and u <= 88, branch-free (see the file comment); 0 below about -87.3 (where 2^n
// is no longer a normal float: its exponent bits are clamped to 0). A float select (min/max, ?:)
// would stop GCC's vectorisation here (-ftrapping-math); the integer clamp does not.
inline float exp_vectorizable(float u) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (u * kLog2e + kRound) - kRound;
  const float r = (u - n * kLn2Hi) - n * kLn2Lo;  // ln 2 in two parts: r exact to float rounding
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t e = std::max(static_cast<std::int32_t>(n) + 127, std::int32_t{0});
  return p * std::bit_cast<float>(e << 23);
}

// erfc(z) for z >= 0 (Numerical Recipes' erfcc, relative error < 1.2e-7).
inline float erfc_nonneg_vectorizable(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * exp_vectorizable(p - z * z);
}

}  // namespace ddp::kernels::cpu::detail
