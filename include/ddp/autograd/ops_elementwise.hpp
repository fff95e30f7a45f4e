// Element-wise autograd ops: constants, + - * / with broadcasting (and with scalars), the unary
// math ops and the activations (kernels/unary_ops.hpp, Kernels<D>'s ReLU and GELU).
// SPDX-License-Identifier: MIT
#pragma once

#include "ddp/autograd/ops_core.hpp"

namespace ddp::autograd {

// ---- constants ----
// A value that requires no gradient (a scalar of rank 0 broadcasts against anything).
template <class T, Device D>
Var<T, D> constant(Tensor<T, D> value, Exec<D> exec = {}) {
  return Var<T, D>::leaf(std::move(value), false, exec);
}
template <class T, Device D>
Var<T, D> scalar_like(const Var<T, D>& like, T v) {
  Tensor<T, D> t(Shape{});
  Kernels<D>::fill(like.exec(), t.view(), v);
  return Var<T, D>::leaf(std::move(t), false, like.exec());
}

template <class T, Device D>
Var<T, D> add(const Var<T, D>& a, const Var<T, D>& b) {
  return detail::binary(a, b, detail::BinKind::Add);
}
template <class T, Device D>
Var<T, D> sub(const Var<T, D>& a, const Var<T, D>& b) {
  return detail::binary(a, b, detail::BinKind::Sub);
}
template <class T, Device D>
Var<T, D> mul(const Var<T, D>& a, const Var<T, D>& b) {
  return detail::binary(a, b, detail::BinKind::Mul);
}
template <class T, Device D>
Var<T, D> div(const Var<T, D>& a, const Var<T, D>& b) {
  return detail::binary(a, b, detail::BinKind::Div);
}
template <class T, Device D>
Var<T, D> operator+(const Var<T, D>& a, const Var<T, D>& b) {
  return add(a, b);
}
template <class T, Device D>
Var<T, D> operator-(const Var<T, D>& a, const Var<T, D>& b) {
  return sub(a, b);
}
template <class T, Device D>
Var<T, D> operator*(const Var<T, D>& a, const Var<T, D>& b) {
  return mul(a, b);
}
template <class T, Device D>
Var<T, D> operator/(const Var<T, D>& a, const Var<T, D>& b) {
  return div(a, b);
}
// With a scalar (a rank-0 constant, broadcast).
template <class T, Device D>
Var<T, D> operator+(const Var<T, D>& a, std::type_identity_t<T> s) {
  return add(a, scalar_like(a, s));
}
template <class T, Device D>
Var<T, D> operator+(std::type_identity_t<T> s, const Var<T, D>& a) {
  return add(scalar_like(a, s), a);
}
template <class T, Device D>
Var<T, D> operator-(const Var<T, D>& a, std::type_identity_t<T> s) {
  return sub(a, scalar_like(a, s));
}
template <class T, Device D>
Var<T, D> operator-(std::type_identity_t<T> s, const Var<T, D>& a) {
  return sub(scalar_like(a, s), a);
}
template <class T, Device D>
Var<T, D> operator*(const Var<T, D>& a, std::type_identity_t<T> s) {
  return mul(a, scalar_like(a, s));
}
template <class T, Device D>
Var<T, D> operator*(std::type_identity_t<T> s, const Var<T, D>& a) {
  return mul(scalar_like(a, s), a);
}
template <class T, Device D>
Var<T, D> operator/(const Var<T, D>& a, std::type_identity_t<T> s) {
  return div(a, scalar_like(a, s));
}
template <class T, Device D>
Var<T, D> operator/(std::type_identity_t<T> s, const Var<T, D>& a) {
  return div(scalar_like(a, s), a);
}

// Values of two devices never meet in one op: Var<T, Cpu> and Var<T, Cuda> are different types, and
// these overloads turn the mix into one readable compile error.
namespace detail {
template <Device Da, Device Db>
void different_devices() {
  static_assert(std::is_same_v<Da, Db>,
                "ddp: autograd: the operands live on different devices (Cpu and Cuda); "
                "copy one to the other's device first (tensor/copy.hpp)");
}
}  // namespace detail
template <class T, Device Da, Device Db>
requires(!std::is_same_v<Da, Db>) Var<T, Da>
operator+(const Var<T, Da>&, const Var<T, Db>&) {
  return detail::different_devices<Da, Db>(), Var<T, Da>();
}
template <class T, Device Da, Device Db>
requires(!std::is_same_v<Da, Db>) Var<T, Da>
operator-(const Var<T, Da>&, const Var<T, Db>&) {
  return detail::different_devices<Da, Db>(), Var<T, Da>();
}
template <class T, Device Da, Device Db>
requires(!std::is_same_v<Da, Db>) Var<T, Da>
operator*(const Var<T, Da>&, const Var<T, Db>&) {
  return detail::different_devices<Da, Db>(), Var<T, Da>();
}
template <class T, Device Da, Device Db>
requires(!std::is_same_v<Da, Db>) Var<T, Da>
operator/(const Var<T, Da>&, const Var<T, Db>&) {
  return detail::different_devices<Da, Db>(), Var<T, Da>();
}
template <class T, Device Da, Device Db>
requires(!std::is_same_v<Da, Db>) Var<T, Da> matmul(const Var<T, Da>&, const Var<T, Db>&) {
  return detail::different_devices<Da, Db>(), Var<T, Da>();
}

// ---- element-wise unary ops ----
template <class T, Device D>
Var<T, D> neg(const Var<T, D>& x) {
  return detail::unary(x, "neg", kernels::NegOp<T>{});
}
template <class T, Device D>
Var<T, D> operator-(const Var<T, D>& x) {
  return neg(x);
}
template <class T, Device D>
Var<T, D> exp(const Var<T, D>& x) {
  return detail::unary(x, "exp", kernels::ExpOp<T>{});
}
template <class T, Device D>
Var<T, D> log(const Var<T, D>& x) {
  return detail::unary(x, "log", kernels::LogOp<T>{});
}
template <class T, Device D>
Var<T, D> pow(const Var<T, D>& x, std::type_identity_t<T> p) {
  return detail::unary(x, "pow", kernels::PowOp<T>{.p = p});
}
template <class T, Device D>
Var<T, D> sqrt(const Var<T, D>& x) {
  return detail::unary(x, "sqrt", kernels::SqrtOp<T>{});
}
template <class T, Device D>
Var<T, D> rsqrt(const Var<T, D>& x) {
  return detail::unary(x, "rsqrt", kernels::RsqrtOp<T>{});
}
template <class T, Device D>
Var<T, D> abs(const Var<T, D>& x) {
  return detail::unary(x, "abs", kernels::AbsOp<T>{});
}
template <class T, Device D>
Var<T, D> clamp(const Var<T, D>& x, std::type_identity_t<T> lo, std::type_identity_t<T> hi) {
  if (!(lo <= hi))
    throw ValueError(
        ddp::detail::str("ddp: autograd: clamp: min ", lo, " must not exceed max ", hi));
  return detail::unary(x, "clamp", kernels::ClampOp<T>{.lo = lo, .hi = hi});
}

// ---- activations (the existing kernels of Kernels<D>) ----
namespace detail {
// y = fwd(x); dx = bwd(from, dy) where `from` is the forward input (from_input) or output.
template <class T, Device D, class Fwd, class Bwd>
Var<T, D> activation(const Var<T, D>& x, const char* op, bool from_input, Fwd fwd, Bwd bwd) {
  Tensor<T, D> y(x.shape());
  fwd(x.exec(), x.value().cview(), y.view());
  return record<T, D>(op, std::move(y), {x.node_ptr()}, [from_input, bwd](Node<T, D>& n) {
    Tensor<T, D> dx(n.value.shape());
    bwd(n.exec, from_input ? n.inputs[0]->value.cview() : n.value.cview(), n.grad.cview(),
        dx.view());
    n.inputs[0]->accumulate(std::move(dx));
  });
}
}  // namespace detail

template <class T, Device D>
Var<T, D> relu(const Var<T, D>& x) {
  return detail::activation(
      x, "relu", false,
      [](const Exec<D>& e, auto in, auto out) { Kernels<D>::relu_forward(e, in, out); },
      [](const Exec<D>& e, auto y, auto dy, auto dx) { Kernels<D>::relu_backward(e, y, dy, dx); });
}
// tanh_form: GELU's tanh approximation (torch's approximate="tanh"); the default is the exact erf
// form.
template <class T, Device D>
Var<T, D> gelu(const Var<T, D>& x, bool tanh_form = false) {
  return detail::activation(
      x, "gelu", true,
      [tanh_form](const Exec<D>& e, auto in, auto out) {
        Kernels<D>::gelu_forward(e, in, out, tanh_form);
      },
      [tanh_form](const Exec<D>& e, auto in, auto dy, auto dx) {
        Kernels<D>::gelu_backward(e, in, dy, dx, tanh_form);
      });
}
// torch's silu, tanh, sigmoid and mish (kernels/unary_ops.hpp).
template <class T, Device D>
Var<T, D> silu(const Var<T, D>& x) {
  return detail::unary(x, "silu", kernels::SiluOp<T>{});
}
template <class T, Device D>
Var<T, D> tanh(const Var<T, D>& x) {
  return detail::unary(x, "tanh", kernels::TanhOp<T>{});
}
template <class T, Device D>
Var<T, D> sigmoid(const Var<T, D>& x) {
  return detail::unary(x, "sigmoid", kernels::SigmoidOp<T>{});
}
template <class T, Device D>
Var<T, D> mish(const Var<T, D>& x) {
  return detail::unary(x, "mish", kernels::MishOp<T>{});
}
// Any element-wise op f of the form of kernels/unary_ops.hpp (operator()(x), grad(x, y)), a
// user's own included: y = f(x), dx = dy * f.grad(x, y).
template <class T, Device D, class F>
Var<T, D> unary(const Var<T, D>& x, F f) {
  return detail::unary(x, kernels::op_name<F>(), f);
}

}  // namespace ddp::autograd
