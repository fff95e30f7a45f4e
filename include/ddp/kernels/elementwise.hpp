// Element-wise math written once for both devices: functors run by Kernels<D>::for_each_index(exec,
// n, f).
// SPDX-License-Identifier: MIT
//
// A functor holds raw pointers and scalars and maps one flat index i to one output element; it
// must not depend on the order indices run in (CPU: chunks on threads; CUDA: one per thread).
// Functors, not lambdas: nvcc needs no --extended-lambda. Arithmetic in T in PyTorch's order, so
// float results usually match PyTorch's bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ddp/config.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::kernels {

// y = max(x, 0); NaN stays NaN, as in PyTorch. Bitwise | keeps the loop branch-free (vectorises).
template <class T>
struct ReluForward {
  const T* x;
  T* y;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const T v = x[i];
    y[i] = ((v > T(0)) | (v != v)) ? v : T(0);
  }
};

// dx = dy where the forward output y > 0, else 0 (PyTorch's threshold_backward on the result). dy
// is loaded unconditionally: a vector select (a branch on random signs costs ~10x more).
template <class T>
struct ReluBackward {
  const T* y;
  const T* dy;
  T* dx;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const T g = dy[i];
    dx[i] = y[i] > T(0) ? g : T(0);
  }
};

// out = a + b (the residual connection; out may alias a or b).
template <class T>
struct Add {
  const T* a;
  const T* b;
  T* out;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { out[i] = a[i] + b[i]; }
};

// y += alpha * x.
template <class T>
struct Axpy {
  T alpha;
  const T* x;
  T* y;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { y[i] += alpha * x[i]; }
};

// x *= alpha.
template <class T>
struct Scale {
  T alpha;
  T* x;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { x[i] *= alpha; }
};

// x = value. bf16 activation storage (kernels/bf16_storage.hpp): y = float(x) (exact), y = bf16(x)
// (nearest even), and y = float(bf16(x)) (a float weight as a bf16 GEMM operand reads it).
struct Bf16Widen {
  const bfloat16* x;
  float* y;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { y[i] = float(x[i]); }
};
struct Bf16Narrow {
  const float* x;
  bfloat16* y;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { y[i] = bfloat16(x[i]); }
};
struct Bf16RoundOperand {
  const float* x;
  float* y;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { y[i] = float(bfloat16(x[i])); }
};

template <class T>
struct Fill {
  T value;
  T* x;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { x[i] = value; }
};

// One element of torch.optim.SGD's step (see SgdArgs in args.hpp for the formula). buf may be null
// when momentum == 0. Scalars are converted to T first, as PyTorch does for float parameters.
template <class T>
struct SgdStep {
  T* param;
  const T* grad;
  T* buf;
  T lr, momentum, dampening, weight_decay;
  bool first_step, nesterov, use_momentum, use_weight_decay;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    T g = grad[i];
    if (use_weight_decay) g = g + weight_decay * param[i];
    if (use_momentum) {
      const T b = first_step ? g : buf[i] * momentum + (T(1) - dampening) * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    param[i] = param[i] + (-lr) * g;
  }
};

// One element of torch.optim.AdamW's step (amsgrad off), torch 1.13's _single_tensor_adamw order:
//   p = p * decay                            decay = 1 - lr * weight_decay (decoupled)
//   m = m * beta1 + (1 - beta1) * g          exp_avg
//   v = v * beta2 + (1 - beta2) * g * g      exp_avg_sq
//   p = p + (-step_size * m) / (sqrt(v) / bias_correction2_sqrt + eps)
// step_size = lr / (1 - beta1^t), bias_correction2_sqrt = sqrt(1 - beta2^t) for the tensor's own
// step count t, computed in double on the host and converted to T (as PyTorch's Python scalars).
// Example: lr 0.1, no decay, t = 1, g = 2, m = v = 0: m = 0.2, v = 0.004, step_size = 1,
// bias_correction2_sqrt = sqrt(0.001), so p -= 0.2 / (0.0632.. / 0.0316.. + eps) = 0.1 (Adam's
// first step is lr * sign(g)).
template <class T>
struct AdamwStep {
  T* param;
  const T* grad;
  T* exp_avg;
  T* exp_avg_sq;
  T decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    using std::sqrt;
    const T g = grad[i];
    const T p = param[i] * decay;
    const T m = exp_avg[i] * beta1 + one_minus_beta1 * g;
    const T v = exp_avg_sq[i] * beta2 + one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const T denom = sqrt(v) / bias_correction2_sqrt + eps;
    param[i] = p + (-step_size) * m / denom;  // addcdiv: self + value * t1 / t2
  }
};

// ---- transformer element-wise ops: GELU and dropout ----
// GELU's constants: 1/sqrt(2), 1/sqrt(2 pi), sqrt(2/pi) and the tanh form's cubic coefficient.
inline constexpr double kGeluSqrtHalf = 0.70710678118654752440;
inline constexpr double kGeluInvSqrt2Pi = 0.39894228040143267794;
inline constexpr double kGeluSqrt2OverPi = 0.79788456080286535588;
inline constexpr double kGeluKappa = 0.044715;

// y = gelu(x) in T, in the order of torch 1.13's CPU kernel (GeluKernel.cpp):
//   exact (tanh_form false): y = x * 0.5 * (1 + erf(x / sqrt 2))
//   tanh form:               y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
template <class T>
struct GeluForward {
  const T* x;
  T* y;
  bool tanh_form;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    using std::erf;
    using std::tanh;
    const T v = x[i];
    if (tanh_form) {
      const T inner = T(kGeluSqrt2OverPi) * (v + T(kGeluKappa) * v * v * v);
      y[i] = T(0.5) * v * (T(1) + tanh(inner));
    } else {
      y[i] = v * T(0.5) * (T(1) + erf(v * T(kGeluSqrtHalf)));
    }
  }
};

// dx = dy * gelu'(x) (x is the forward input; dx may alias dy):
//   exact:     gelu'(x) = Phi(x) + x phi(x),
//              Phi(x) = 0.5 (1 + erf(x / sqrt 2)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
//   tanh form: gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 k x^2),
//              t = tanh(sqrt(2/pi) (x + k x^3))
template <class T>
struct GeluBackward {
  const T* x;
  const T* dy;
  T* dx;
  bool tanh_form;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    using std::erf;
    using std::exp;
    using std::tanh;
    const T v = x[i];
    T d;
    if (tanh_form) {
      const T v2 = v * v;
      const T t = tanh(T(kGeluSqrt2OverPi) * (v + T(kGeluKappa) * v2 * v));
      const T left = T(0.5) * v;
      const T inner_derivative = T(kGeluSqrt2OverPi) * (T(1) + T(3) * T(kGeluKappa) * v2);
      d = T(0.5) * (T(1) + t) + left * (T(1) - t * t) * inner_derivative;
    } else {
      const T cdf = T(0.5) * (T(1) + erf(v * T(kGeluSqrtHalf)));
      const T pdf = exp(T(-0.5) * v * v) * T(kGeluInvSqrt2Pi);
      d = cdf + v * pdf;
    }
    dx[i] = dy[i] * d;
  }
};

// One dropout draw's mask (docs/decisions/0043): element i (a flat index below 2^34) is kept iff
// word i % 4 of philox(counter (i / 4, step, rank, stream), key (seed_lo, seed_hi)) -- block
// (step << 32) + i / 4 of Generator(seed, rank, stream) -- is at least `threshold`. Used by
// nn::Dropout's functor below and the attention's dropout (attention_args.hpp), on either device.
struct DropoutMask {
  // words below it are dropped: 2^32 p rounded so that drop <=> (w + 0.5) / 2^32 < p
  std::uint64_t threshold = 0;
  std::uint32_t seed_lo = 0, seed_hi = 0, step = 0, rank = 0, stream = 0;
  // The words of elements 4 b .. 4 b + 3.
  DDP_HOST_DEVICE void words(std::uint64_t b, std::uint32_t (&c)[4]) const {
    c[0] = static_cast<std::uint32_t>(b);
    c[1] = step;
    c[2] = rank;
    c[3] = stream;
    philox4x32_10_inplace(c, seed_lo, seed_hi);
  }
  DDP_HOST_DEVICE bool keep(std::uint32_t word) const { return word >= threshold; }
};

// Drop probability p in [0, 1]; the step-th draw of (seed, rank, stream), step below 2^32.
inline DropoutMask dropout_mask(double p, std::uint64_t seed, std::uint32_t rank,
                                std::uint32_t stream, std::uint64_t step) {
  // drop <=> (w + 0.5) / 2^32 < p <=> w < p 2^32 - 0.5: the count of such 32-bit words w.
  const double cut = std::ceil(p * 4294967296.0 - 0.5);
  return DropoutMask{.threshold = cut <= 0.0 ? 0 : static_cast<std::uint64_t>(cut),
                     .seed_lo = static_cast<std::uint32_t>(seed),
                     .seed_hi = static_cast<std::uint32_t>(seed >> 32),
                     .step = static_cast<std::uint32_t>(step),
                     .rank = rank,
                     .stream = stream};
}

// The kept elements' scale as torch computes it (T(1) / T(1 - p)); 0 for p = 1 (all dropped).
template <class T>
T dropout_scale(double p) {
  return p >= 1.0 ? T(0) : T(1) / T(1.0 - p);
}

// Inverted dropout, 4 elements per index b (one Philox block): element i = 4 b + j < n gets word j
// of block b of `draw`. Run it for (n + 3) / 4 indices. y may alias x.
template <class T>
struct DropoutForward {
  const T* x;
  T* y;
  std::uint8_t* mask;
  std::size_t n;
  T scale;  // 1 / (1 - p)
  DropoutMask draw;
  DDP_HOST_DEVICE void operator()(std::size_t b) const {
    std::uint32_t c[4];
    draw.words(b, c);
    for (std::size_t j = 0; j < 4; ++j) {
      const std::size_t i = 4 * b + j;
      if (i >= n) break;
      const bool keep = draw.keep(c[j]);
      mask[i] = keep ? 1 : 0;
      y[i] = keep ? x[i] * scale : T(0);
    }
  }
};

// dx = mask ? dy * scale : 0 (dx may alias dy).
template <class T>
struct DropoutBackward {
  const T* dy;
  const std::uint8_t* mask;
  T* dx;
  T scale;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { dx[i] = mask[i] ? dy[i] * scale : T(0); }
};

// NHWC (n, h, w, c) to NCHW (n, c, h, w), or back (to_nhwc), one output element per index; not in
// place. nn::Flatten's permutation (torch flattens NCHW).
template <class T>
struct PermuteNhwcNchw {
  const T* x;
  T* y;
  std::int64_t h, w, c;
  bool to_nhwc;  // false: x NHWC, y NCHW; true: x NCHW, y NHWC
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i);
    const std::int64_t hw = h * w, image = k / (hw * c), r = k % (hw * c);
    if (to_nhwc) {
      const std::int64_t p = r / c, ch = r % c;  // output (n, p = (h, w), ch)
      y[i] = x[(image * c + ch) * hw + p];
    } else {
      const std::int64_t ch = r / hw, p = r % hw;  // output (n, ch, p)
      y[i] = x[(image * hw + p) * c + ch];
    }
  }
};

}  // namespace ddp::kernels
