// Unary element-wise ops, y = f(x) and dx = dy * f'(x, y), written once for every user: one struct
// per op serves Kernels<D>::unary_forward / unary_backward, the nn activation modules and the
// autograd ops, on both devices. Formulas follow torch 1.13's CPU kernels.
// SPDX-License-Identifier: MIT
//
// An op is a struct template over the element type T with
//   T operator()(T x) const       the value y = f(x)
//   T grad(T x, T y) const        df/dx at x, given y = f(x)
// and, for the ops that are also modules, `name` (torch's function name, for errors),
// `module_name` (torch.nn's class name, describe()) and `reads` (what grad uses: x, y or both),
// so a module keeps only that. Adding an activation is one such struct here, an alias in
// nn/activation.hpp and a one-line function in autograd/ops.hpp (docs/decisions/0078). A user's
// own op works the same way: nn::Activation<T, D, F> and autograd::unary(x, F{}) (docs/GUIDE.md).
#pragma once

#include <cmath>
#include <cstddef>

#include "ddp/config.hpp"

namespace ddp::kernels {

// The op's name in errors: F::name, or "unary op" for an op that has none.
template <class F>
constexpr const char* op_name() {
  if constexpr (requires { F::name; })
    return F::name;
  else
    return "unary op";
}

// What an op's grad(x, y) reads; an op that does not say reads both.
enum class Reads { Input, Output, Both };
template <class F>
constexpr Reads reads_of() {
  if constexpr (requires { F::reads; })
    return F::reads;
  else
    return Reads::Both;
}

// y = f(x); run by Kernels<D>::for_each_index (y may alias x).
template <class T, class F>
struct UnaryMap {
  const T* x;
  T* y;
  F f;
  DDP_HOST_DEVICE void operator()(std::size_t i) const { y[i] = f(x[i]); }
};
// dx = dy * f.grad(x, y); x or y is null when f does not read it (dx may alias dy).
template <class T, class F>
struct UnaryGrad {
  const T* x;
  const T* y;
  const T* dy;
  T* dx;
  F f;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    dx[i] = dy[i] * f.grad(x ? x[i] : T(0), y ? y[i] : T(0));
  }
};

// ---- activations (also modules: nn::SiLU, nn::Tanh, nn::Sigmoid, nn::Mish) ----
// silu(x) = x / (1 + exp(-x)); grad s (1 + x (1 - s)), s = sigmoid(x).
template <class T>
struct SiluOp {
  static constexpr const char* name = "silu";
  static constexpr const char* module_name = "SiLU";
  static constexpr Reads reads = Reads::Input;
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::exp;
    return x / (T(1) + exp(-x));
  }
  DDP_HOST_DEVICE T grad(T x, T) const {
    using std::exp;
    const T s = T(1) / (T(1) + exp(-x));
    return s * (T(1) + x * (T(1) - s));
  }
};
// tanh(x); grad 1 - y^2 from the output (torch's tanh_backward).
template <class T>
struct TanhOp {
  static constexpr const char* name = "tanh";
  static constexpr const char* module_name = "Tanh";
  static constexpr Reads reads = Reads::Output;
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::tanh;
    return tanh(x);
  }
  DDP_HOST_DEVICE T grad(T, T y) const { return T(1) - y * y; }
};
// sigmoid(x) = 1 / (1 + exp(-x)); grad (1 - y) y from the output (torch's sigmoid_backward).
template <class T>
struct SigmoidOp {
  static constexpr const char* name = "sigmoid";
  static constexpr const char* module_name = "Sigmoid";
  static constexpr Reads reads = Reads::Output;
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::exp;
    return T(1) / (T(1) + exp(-x));
  }
  DDP_HOST_DEVICE T grad(T, T y) const { return (T(1) - y) * y; }
};
// mish(x) = x tanh(softplus(x)), softplus(x) = log(1 + exp(x)); grad t + x s (1 - t^2),
// t = tanh(softplus(x)), s = sigmoid(x) (torch's mish_backward).
template <class T>
struct MishOp {
  static constexpr const char* name = "mish";
  static constexpr const char* module_name = "Mish";
  static constexpr Reads reads = Reads::Input;
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::exp, std::log1p, std::tanh;
    return x * tanh(log1p(exp(x)));
  }
  DDP_HOST_DEVICE T grad(T x, T) const {
    using std::exp, std::log1p, std::tanh;
    const T s = T(1) / (T(1) + exp(-x));
    const T t = tanh(log1p(exp(x)));
    return t + x * s * (T(1) - t * t);
  }
};

// ---- the unary ops of autograd only ----
template <class T>
struct NegOp {
  DDP_HOST_DEVICE T operator()(T x) const { return -x; }
  DDP_HOST_DEVICE T grad(T, T) const { return T(-1); }
};
template <class T>
struct ExpOp {
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::exp;
    return exp(x);
  }
  DDP_HOST_DEVICE T grad(T, T y) const { return y; }
};
template <class T>
struct LogOp {
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::log;
    return log(x);
  }
  DDP_HOST_DEVICE T grad(T x, T) const { return T(1) / x; }
};
// x^p for a scalar p; torch's gradient p * x^(p-1) (0 where p == 0).
template <class T>
struct PowOp {
  T p;
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::pow;
    return pow(x, p);
  }
  DDP_HOST_DEVICE T grad(T x, T) const {
    using std::pow;
    return p == T(0) ? T(0) : p * pow(x, p - T(1));
  }
};
template <class T>
struct SqrtOp {
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::sqrt;
    return sqrt(x);
  }
  DDP_HOST_DEVICE T grad(T, T y) const { return T(0.5) / y; }
};
template <class T>
struct RsqrtOp {
  DDP_HOST_DEVICE T operator()(T x) const {
    using std::sqrt;
    return T(1) / sqrt(x);
  }
  DDP_HOST_DEVICE T grad(T x, T y) const { return T(-0.5) * y / x; }
};
// |x|; gradient sign(x) (0 at 0, as torch).
template <class T>
struct AbsOp {
  DDP_HOST_DEVICE T operator()(T x) const { return x < T(0) ? -x : x; }
  DDP_HOST_DEVICE T grad(T x, T) const { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0)); }
};
// min(max(x, lo), hi); gradient 1 inside [lo, hi] (bounds included, as torch), else 0.
template <class T>
struct ClampOp {
  T lo, hi;
  DDP_HOST_DEVICE T operator()(T x) const { return x < lo ? lo : (x > hi ? hi : x); }
  DDP_HOST_DEVICE T grad(T x, T) const { return (x >= lo && x <= hi) ? T(1) : T(0); }
};

}  // namespace ddp::kernels
