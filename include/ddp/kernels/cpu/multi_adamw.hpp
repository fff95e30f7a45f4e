// CPU multi-tensor AdamW: every parameter tensor's step in one call; the reference for
// kernels/cuda/multi_adamw.cuh.
// SPDX-License-Identifier: MIT
//
// Per tensor, adamw_step_for (kernels/fused_args.hpp) turns the tensor's lr, weight decay and step
// count into the AdamwStep functor of kernels/elementwise.hpp, which runs over the tensor's
// elements in chunks of >= 32 Ki on exec's pool (small tensors on the calling thread). The GPU runs
// the same functors in one launch. float on x86-64 runs 4 elements at a time with SSE
// (adamw_step_sse below): GCC does not vectorise the functor's loop itself, because std::sqrt may
// set errno (-fmath-errno, its default). Same operations in the same order, each correctly rounded
// (sqrtps and divps as sqrtss and divss), so the result is bitwise the functor's. Measured in
// bench/gpt_cpu (the tutorial's GPT, 25 M parameters, 1 thread): clip_grad_norm + AdamW 94 -> 40
// ms.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__SSE2__)
#  include <immintrin.h>
#endif

#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

namespace detail {
// f over elements [i0, i1); float with SSE 4 at a time (the functor's formula, vector for vector),
// the rest by f.
template <class T>
void adamw_step_range(const AdamwStep<T>& f, std::int64_t i0, std::int64_t i1) {
  std::int64_t i = i0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    const __m128 decay = _mm_set1_ps(f.decay), beta1 = _mm_set1_ps(f.beta1),
                 omb1 = _mm_set1_ps(f.one_minus_beta1), beta2 = _mm_set1_ps(f.beta2),
                 omb2 = _mm_set1_ps(f.one_minus_beta2), neg_step = _mm_set1_ps(-f.step_size),
                 bc2 = _mm_set1_ps(f.bias_correction2_sqrt), eps = _mm_set1_ps(f.eps);
    for (; i + 4 <= i1; i += 4) {
      const __m128 g = _mm_loadu_ps(f.grad + i);
      const __m128 p = _mm_mul_ps(_mm_loadu_ps(f.param + i), decay);
      const __m128 m =
          _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(f.exp_avg + i), beta1), _mm_mul_ps(omb1, g));
      const __m128 v = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(f.exp_avg_sq + i), beta2),
                                  _mm_mul_ps(_mm_mul_ps(omb2, g), g));
      _mm_storeu_ps(f.exp_avg + i, m);
      _mm_storeu_ps(f.exp_avg_sq + i, v);
      const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(v), bc2), eps);
      _mm_storeu_ps(f.param + i, _mm_add_ps(p, _mm_div_ps(_mm_mul_ps(neg_step, m), denom)));
    }
  }
#endif
  for (; i < i1; ++i) f(static_cast<std::size_t>(i));
}
}  // namespace detail

template <class T>
void adamw_step_multi(const Exec<Cpu>& exec, const MultiAdamwArgs<T, Cpu>& a) {
  validate(a);
  for (const AdamwTensor<T>& t : a.tensors) {
    const AdamwStep<T> f = adamw_step_for(t, a.beta1, a.beta2, a.eps);
    parallel_for(exec, t.numel, 1 << 15, [&](std::int64_t i0, std::int64_t i1, int) {
      detail::adamw_step_range(f, i0, i1);
    });
  }
}

}  // namespace ddp::kernels::cpu
