// CPU exact GELU for float, forward and backward, in loops the compiler vectorises (no libm call
// per element).
// SPDX-License-Identifier: MIT
//
// Why: the element-wise functors (kernels/elementwise.hpp GeluForward / GeluBackward) call erff and
// expf per element, which GCC cannot vectorise without -ffast-math; in the tutorial's GPT
// (bench/gpt_cpu) that was 8% of a CPU training step. Here:
//   Phi(x) = 0.5 (1 + erf(x / sqrt 2)) = 0.5 erfc(z) for x < 0, 1 - 0.5 erfc(z) for x >= 0, z = |x|
//     / sqrt 2
//   erfc and exp: kernels/cpu/vec_math.hpp (erfc's relative error below 1.2e-7 for every z >= 0)
//   forward   y  = x Phi(x)
//   backward  dx = dy (Phi(x) + x phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// Both are at float rounding level: over x in [-20, 20], |error| / (|exact| + 1) is at most 7e-8
// forward and 1.3e-7 backward (the erff functors: 8e-8 and 7e-8), and tests/interop/reference's
// GELU case (x ~ N(0, 9)) is within 1.2e-7 (y) and 3.1e-7 (dx) of torch 1.13, whose CPU kernel uses
// its own vectorised erf approximation. Phi keeps its relative accuracy in the far negative tail
// (erfc, no 1 + erf cancellation). double and the tanh form keep the functors. Speed (one thread, 2
// M floats): functors 10.6 ms forward / 20.8 ms backward, SSE2 loops 6.9 / 8.7 ms, AVX2 about twice
// as fast again.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/cpu/vec_math.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

namespace detail {

// Phi(x) = 0.5 (1 + erf(x / sqrt 2)).
inline float normal_cdf_vectorizable(float x) {
  const float h = 0.5f * erfc_nonneg_vectorizable(std::abs(x) * static_cast<float>(kGeluSqrtHalf));
  // x < 0 ? h : 1 - h as arithmetic on the sign bit (exact: one term is 0); a float compare or
  // select stops GCC's vectorisation under its default -ftrapping-math. 1 for x < 0 (and -0: h =
  // 0.5)
  const auto neg = static_cast<float>(std::bit_cast<std::uint32_t>(x) >> 31);
  return neg * h + (1.0f - neg) * (1.0f - h);
}

// The loops over [0, n), inlined into the two variants below.
[[gnu::always_inline]] inline void gelu_exact_forward_span(const float* x, float* y,
                                                           std::int64_t n) {
  DDP_CPU_IVDEP
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * normal_cdf_vectorizable(x[i]);
}
[[gnu::always_inline]] inline void gelu_exact_backward_span(const float* x, const float* dy,
                                                            float* dx, std::int64_t n) {
  DDP_CPU_IVDEP
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float pdf = exp_vectorizable(-0.5f * v * v) * static_cast<float>(kGeluInvSqrt2Pi);
    dx[i] = dy[i] * (normal_cdf_vectorizable(v) + v * pdf);
  }
}

// The build targets baseline x86-64 (SSE2, 4 floats a vector); where the CPU has AVX2 the same
// loops run 8 wide. target("avx2") without "fma": every operation stays a separately rounded
// multiply or add, so both variants give bitwise the same result.
#if defined(__x86_64__) && defined(__GNUC__)
#  define DDP_CPU_HAVE_AVX2_VARIANT 1
[[gnu::target("avx2")]] inline void gelu_exact_forward_span_avx2(const float* x, float* y,
                                                                 std::int64_t n) {
  gelu_exact_forward_span(x, y, n);
}
[[gnu::target("avx2")]] inline void gelu_exact_backward_span_avx2(const float* x, const float* dy,
                                                                  float* dx, std::int64_t n) {
  gelu_exact_backward_span(x, dy, dx, n);
}
inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

}  // namespace detail

// y = x Phi(x) over n floats (y may be x).
inline void gelu_exact_forward(const Exec<Cpu>& exec, const float* x, float* y, std::size_t n) {
  parallel_for(exec, static_cast<std::int64_t>(n), 1 << 14,
               [&](std::int64_t b, std::int64_t e, int) {
#ifdef DDP_CPU_HAVE_AVX2_VARIANT
                 if (detail::cpu_has_avx2())
                   return detail::gelu_exact_forward_span_avx2(x + b, y + b, e - b);
#endif
                 detail::gelu_exact_forward_span(x + b, y + b, e - b);
               });
}

// dx = dy (Phi(x) + x phi(x)) over n floats (dx may be dy).
inline void gelu_exact_backward(const Exec<Cpu>& exec, const float* x, const float* dy, float* dx,
                                std::size_t n) {
  parallel_for(exec, static_cast<std::int64_t>(n), 1 << 14,
               [&](std::int64_t b, std::int64_t e, int) {
#ifdef DDP_CPU_HAVE_AVX2_VARIANT
                 if (detail::cpu_has_avx2())
                   return detail::gelu_exact_backward_span_avx2(x + b, dy + b, dx + b, e - b);
#endif
                 detail::gelu_exact_backward_span(x + b, dy + b, dx + b, e - b);
               });
}

}  // namespace ddp::kernels::cpu
