// Differentiable ops on Var<T, D> (autograd/var.hpp): each computes its value with Kernels<D>
// (existing kernels, or the functors of kernels/broadcast.hpp through Kernels<D>::for_each_index)
// and records its backward.
// SPDX-License-Identifier: MIT
//
// Semantics follow PyTorch's: binary element-wise ops broadcast numpy-style (a (3, 1) and b (4,)
// give (3, 4); the gradient of a broadcast operand sums over the dimensions it was expanded along);
// dims may be negative; linear's weight is (out, in). Errors name the op and both shapes. Shapes
// have rank <= 5 (Shape::kMaxRank). The one device-specific piece is matmul's GEMM
// (detail::Gemm<D>: kernels/cpu/gemm.hpp on the CPU, cuBLAS in autograd/cuda/gemm.cuh on the GPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "ddp/autograd/var.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/broadcast.hpp"
#include "ddp/kernels/cpu/gemm.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::autograd {

namespace detail {
using kernels::StridedIndex;

inline std::vector<std::int64_t> dims_of(const Shape& s) { return {s.begin(), s.end()}; }

inline int norm_dim(int dim, int rank, const char* op, const Shape& s) {
  const int d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank)
    throw ValueError(ddp::detail::str("ddp: autograd: ", op, ": dim ", dim,
                                      " is out of range for shape ", s, " (valid: ", -rank, " to ",
                                      rank - 1, ")"));
  return d;
}

// numpy broadcasting of two shapes, or a ValueError naming the op and both shapes.
inline Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> out(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int ia = i - (r - a.rank()), ib = i - (r - b.rank());
    const std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      throw ValueError(ddp::detail::str(
          "ddp: autograd: ", op, ": shapes ", a, " and ", b, " cannot be broadcast (dimension ", i,
          " of the result: ", da, " vs ", db, "); each dimension must match or be 1"));
    out[static_cast<std::size_t>(i)] = da == 1 ? db : da;
  }
  return Shape(out);
}

// Offsets into an operand of shape `s` for each flat index of the broadcast result `out`.
inline StridedIndex broadcast_index(const Shape& s, const Shape& out) {
  StridedIndex ix;
  ix.rank = out.rank();
  for (int i = 0; i < out.rank(); ++i) {
    const int j = i - (out.rank() - s.rank());
    ix.dims[i] = out[i];
    ix.strides[i] = (j < 0 || s[j] == 1) ? 0 : s.stride(j);
  }
  return ix;
}

template <class T, Device D>
Tensor<T, D> zeros(const Exec<D>& e, const Shape& s) {
  Tensor<T, D> t(s);
  Kernels<D>::fill(e, t.view(), T(0));
  return t;
}

// out = op(a, b) broadcast to `out_shape`.
template <class T, Device D, class Op>
Tensor<T, D> broadcast_binary(const Exec<D>& e, TensorView<const T, D> a, TensorView<const T, D> b,
                              const Shape& out_shape, Op op) {
  Tensor<T, D> out(out_shape);
  Kernels<D>::for_each_index(
      e, static_cast<std::size_t>(out.numel()),
      kernels::BroadcastBinary<T, Op>{.a = a.data(),
                                      .b = b.data(),
                                      .out = out.data(),
                                      .ia = broadcast_index(a.shape(), out_shape),
                                      .ib = broadcast_index(b.shape(), out_shape),
                                      .op = op});
  return out;
}

// x (any shape) summed down to `target` (x's shape with dims of extent 1 or missing leading dims),
// times scale: the gradient of a broadcast, and sum/mean over dims.
template <class T, Device D>
Tensor<T, D> reduce_to(const Exec<D>& e, TensorView<const T, D> x, const Shape& target,
                       double scale = 1.0) {
  const Shape& s = x.shape();
  const int lead = s.rank() - target.rank();
  StridedIndex outer, inner;
  outer.rank = target.rank();
  std::int64_t count = 1;
  for (int i = 0; i < s.rank(); ++i) {
    const int j = i - lead;
    const bool reduced = j < 0 || (target[j] == 1 && s[i] != 1);
    if (j >= 0) {
      outer.dims[j] = target[j];
      outer.strides[j] = reduced ? 0 : s.stride(i);
    }
    if (reduced) {
      inner.dims[inner.rank] = s[i];
      inner.strides[inner.rank++] = s.stride(i);
      count *= s[i];
    }
  }
  Tensor<T, D> out(target);
  Kernels<D>::for_each_index(e, static_cast<std::size_t>(out.numel()),
                             kernels::ReduceSum<T>{.x = x.data(),
                                                   .y = out.data(),
                                                   .outer = outer,
                                                   .inner = inner,
                                                   .count = count,
                                                   .scale = scale});
  return out;
}

// x broadcast (copied) to `out_shape`.
template <class T, Device D>
Tensor<T, D> expand(const Exec<D>& e, TensorView<const T, D> x, const Shape& out_shape) {
  Tensor<T, D> out(out_shape);
  Kernels<D>::for_each_index(
      e, static_cast<std::size_t>(out.numel()),
      kernels::Gather<T>{
          .x = x.data(), .y = out.data(), .ix = broadcast_index(x.shape(), out_shape)});
  return out;
}

template <class T, Device D>
Tensor<T, D> clone(const Exec<D>& e, TensorView<const T, D> x) {
  Tensor<T, D> out(x.shape());
  copy(x, out.view(), e);
  return out;
}

// The result of an op: records inputs and backward only when grad mode is on and some input
// requires grad.
template <class T, Device D, class Bwd>
Var<T, D> record(const char* op, Tensor<T, D> value,
                 std::vector<std::shared_ptr<Node<T, D>>> inputs, Bwd bwd) {
  auto n = std::make_shared<Node<T, D>>();
  n->value = std::move(value);
  n->op = op;
  n->leaf = false;
  n->exec = inputs.front()->exec;
  bool any = false;
  for (const auto& in : inputs) any = any || in->requires_grad;
  if (any && grad_enabled()) {
    n->requires_grad = true;
    n->inputs = std::move(inputs);
    n->backward_fn = std::move(bwd);
  } else {
    n->leaf = true;  // a constant: nothing to differentiate through
  }
  return Var<T, D>(std::move(n));
}

// The lines along dimension `dim` of shape s: line(j) is the offset of line j's first element; len,
// step.
inline StridedIndex lines_along(const Shape& s, int dim) {
  StridedIndex ix;
  for (int i = 0; i < s.rank(); ++i) {
    if (i == dim) continue;
    ix.dims[ix.rank] = s[i];
    ix.strides[ix.rank++] = s.stride(i);
  }
  return ix;
}

// Gemm<D>::run: C (m x n) = op(A) op(B) with row-major leading dimensions, on device D. Gemm<Cpu>
// is below; Gemm<Cuda> (cuBLAS at exec.precision, like Linear's) is in autograd/cuda/gemm.cuh,
// which only nvcc compiles.
template <Device D>
struct Gemm {
  static_assert(
      ddp::detail::dependent_false<D>,
      "ddp: autograd's matmul on CUDA needs its cuBLAS GEMM, which only nvcc compiles: include "
      "<ddp/autograd/cuda/gemm.cuh> in a .cu file and link ddp::cuda");
};
template <>
struct Gemm<Cpu> {
  template <class T>
  static void run(const Exec<Cpu>& e, bool ta, bool tb, std::int64_t m, std::int64_t n,
                  std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c,
                  std::int64_t ldc) {
    using kernels::cpu::Trans;
    kernels::cpu::gemm(e, ta ? Trans::Yes : Trans::No, tb ? Trans::Yes : Trans::No, m, n, k, T(1),
                       a, lda, b, ldb, T(0), c, ldc);
  }
};
template <class T, Device D>
void gemm(const Exec<D>& e, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc) {
  Gemm<D>::run(e, ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
}

// An int64 index tensor kept for backward on D, and a host copy of it (one stream synchronisation
// on the GPU) for range checks that must throw before any kernel reads it.
template <Device D>
struct Indices {
  std::shared_ptr<Tensor<std::int64_t, D>> keep;
  Tensor<std::int64_t, Cpu> host;
};
template <Device D>
Indices<D> keep_indices(const Exec<D>& e, const Tensor<std::int64_t, D>& idx, bool with_host) {
  Indices<D> r{std::make_shared<Tensor<std::int64_t, D>>(idx.shape()), {}};
  copy(idx.cview(), r.keep->view(), e);
  if (with_host) {
    Exec<D> ex = e;
    r.host = to<Cpu>(idx.cview(), ex);
  }
  return r;
}
}  // namespace detail

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

// ---- element-wise binary ops with broadcasting ----
namespace detail {
enum class BinKind { Add, Sub, Mul, Div };
template <class T, Device D>
Var<T, D> binary(const Var<T, D>& a, const Var<T, D>& b, BinKind kind) {
  static constexpr const char* names[] = {"add", "sub", "mul", "div"};
  const char* op = names[static_cast<int>(kind)];
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape(), op);
  const Exec<D>& e = a.exec();
  Tensor<T, D> y;
  switch (kind) {
    case BinKind::Add:
      y = broadcast_binary(e, a.value().cview(), b.value().cview(), out_shape, kernels::AddOp<T>{});
      break;
    case BinKind::Sub:
      y = broadcast_binary(e, a.value().cview(), b.value().cview(), out_shape, kernels::SubOp<T>{});
      break;
    case BinKind::Mul:
      y = broadcast_binary(e, a.value().cview(), b.value().cview(), out_shape, kernels::MulOp<T>{});
      break;
    case BinKind::Div:
      y = broadcast_binary(e, a.value().cview(), b.value().cview(), out_shape, kernels::DivOp<T>{});
      break;
  }
  return record<T, D>(op, std::move(y), {a.node_ptr(), b.node_ptr()}, [kind](Node<T, D>& n) {
    const auto& A = *n.inputs[0];
    const auto& B = *n.inputs[1];
    const Exec<D>& e = n.exec;
    const auto dy = n.grad.cview();
    const Shape& s = n.value.shape();
    const bool add_sub = kind == BinKind::Add || kind == BinKind::Sub;
    // An operand of the output's shape takes its gradient as computed (no reduce_to copy); add/sub
    // pass dy on unchanged, so the last operand that takes it gets the node's own grad (dropped
    // after this backward anyway).
    auto give = [&](int i, Tensor<T, D>&& g) {
      Node<T, D>& in = *n.inputs[static_cast<std::size_t>(i)];
      if (in.value.shape() == s)
        in.accumulate(std::move(g));
      else
        in.accumulate(reduce_to(e, g.cview(), in.value.shape()));
    };
    if (A.requires_grad) {
      if (add_sub) {
        if (!(A.value.shape() == s))
          n.inputs[0]->accumulate(reduce_to(e, dy, A.value.shape()));
        else if (B.requires_grad)
          n.inputs[0]->accumulate(clone(e, dy));
        else
          n.inputs[0]->accumulate(std::move(n.grad));
      } else if (kind == BinKind::Mul) {
        give(0, broadcast_binary(e, dy, B.value.cview(), s, kernels::MulOp<T>{}));
      } else {
        give(0, broadcast_binary(e, dy, B.value.cview(), s, kernels::DivOp<T>{}));
      }
    }
    if (B.requires_grad) {
      const double sign = kind == BinKind::Sub ? -1.0 : 1.0;
      if (add_sub) {
        if (!(B.value.shape() == s)) {
          n.inputs[1]->accumulate(reduce_to(e, dy, B.value.shape(), sign));
        } else {
          Tensor<T, D> g = std::move(n.grad);
          if (kind == BinKind::Sub) Kernels<D>::scale(e, T(-1), g.view());
          n.inputs[1]->accumulate(std::move(g));
        }
      } else if (kind == BinKind::Mul) {
        give(1, broadcast_binary(e, dy, A.value.cview(), s, kernels::MulOp<T>{}));
      } else {
        Tensor<T, D> dya = broadcast_binary(e, dy, A.value.cview(), s, kernels::MulOp<T>{});
        give(1, broadcast_binary(e, dya.cview(), B.value.cview(), s, kernels::DivGradDenOp<T>{}));
      }
    }
    n.has_grad = false;
  });
}

// y = f(x) element-wise, dx = dy * f.grad(x, y) (Kernels<D>::unary_forward / unary_backward).
template <class T, Device D, class F>
Var<T, D> unary(const Var<T, D>& x, const char* op, F f) {
  Tensor<T, D> y(x.shape());
  Kernels<D>::unary_forward(x.exec(), x.value().cview(), y.view(), f);
  return record<T, D>(op, std::move(y), {x.node_ptr()}, [f](Node<T, D>& n) {
    Tensor<T, D> dx(n.value.shape());
    Kernels<D>::unary_backward(n.exec, n.inputs[0]->value.cview(), n.value.cview(), n.grad.cview(),
                               dx.view(), f);
    n.inputs[0]->accumulate(std::move(dx));
  });
}
}  // namespace detail

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

// ---- reductions ----
namespace detail {
// sum (scale 1) or mean (scale 1 / count) over `dims` (all when empty), keeping them as size 1 or
// not.
template <class T, Device D>
Var<T, D> reduce(const Var<T, D>& x, std::vector<int> dims, bool keepdim, bool mean,
                 const char* op) {
  const Shape& s = x.shape();
  std::vector<bool> red(static_cast<std::size_t>(s.rank()), dims.empty());
  for (int d : dims) red[static_cast<std::size_t>(norm_dim(d, s.rank(), op, s))] = true;
  std::vector<std::int64_t> kept, squeezed;
  std::int64_t count = 1;
  for (int i = 0; i < s.rank(); ++i) {
    if (red[static_cast<std::size_t>(i)]) count *= s[i];
    kept.push_back(red[static_cast<std::size_t>(i)] ? 1 : s[i]);
    if (!red[static_cast<std::size_t>(i)]) squeezed.push_back(s[i]);
  }
  const Shape keep_shape = Shape(kept), out_shape = keepdim ? keep_shape : Shape(squeezed);
  const double scale = mean ? 1.0 / static_cast<double>(count) : 1.0;
  Tensor<T, D> y = reduce_to(x.exec(), x.value().cview(), keep_shape, scale);
  y.reshape(out_shape);
  return record<T, D>(op, std::move(y), {x.node_ptr()}, [keep_shape, scale](Node<T, D>& n) {
    Tensor<T, D> dx =
        expand(n.exec, n.grad.cview().reshape(keep_shape), n.inputs[0]->value.shape());
    if (scale != 1.0) Kernels<D>::scale(n.exec, static_cast<T>(scale), dx.view());
    n.inputs[0]->accumulate(std::move(dx));
  });
}
}  // namespace detail

// Sum of all elements (rank-0 result), or over `dims`.
template <class T, Device D>
Var<T, D> sum(const Var<T, D>& x) {
  return detail::reduce(x, {}, false, false, "sum");
}
template <class T, Device D>
Var<T, D> sum(const Var<T, D>& x, std::vector<int> dims, bool keepdim = false) {
  if (dims.empty())
    throw ValueError("ddp: autograd: sum: empty dim list; call sum(x) to sum every element");
  return detail::reduce(x, std::move(dims), keepdim, false, "sum");
}
template <class T, Device D>
Var<T, D> mean(const Var<T, D>& x) {
  return detail::reduce(x, {}, false, true, "mean");
}
template <class T, Device D>
Var<T, D> mean(const Var<T, D>& x, std::vector<int> dims, bool keepdim = false) {
  if (dims.empty())
    throw ValueError("ddp: autograd: mean: empty dim list; call mean(x) to average every element");
  return detail::reduce(x, std::move(dims), keepdim, true, "mean");
}

// Maximum along `dim` (torch.max(x, dim).values); the gradient goes to the first maximal element of
// each line.
template <class T, Device D>
Var<T, D> max(const Var<T, D>& x, int dim, bool keepdim = false) {
  const Shape& s = x.shape();
  const int d = detail::norm_dim(dim, s.rank(), "max", s);
  if (s[d] == 0)
    throw ValueError(
        ddp::detail::str("ddp: autograd: max: dim ", dim, " of shape ", s, " is empty"));
  std::vector<std::int64_t> kept = detail::dims_of(s), squeezed;
  kept[static_cast<std::size_t>(d)] = 1;
  for (int i = 0; i < s.rank(); ++i)
    if (i != d) squeezed.push_back(s[i]);
  Tensor<T, D> y(keepdim ? Shape(kept) : Shape(squeezed));
  auto arg = std::make_shared<Tensor<std::int64_t, D>>(y.shape());
  const auto line = detail::lines_along(s, d);
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(y.numel()),
                             kernels::MaxAlong<T>{.x = x.value().data(),
                                                  .y = y.data(),
                                                  .arg = arg->data(),
                                                  .line = line,
                                                  .len = s[d],
                                                  .step = s.stride(d)});
  return detail::record<T, D>("max", std::move(y), {x.node_ptr()}, [arg, line, d](Node<T, D>& n) {
    const Shape& xs = n.inputs[0]->value.shape();
    Tensor<T, D> dx = detail::zeros<T, D>(n.exec, xs);
    Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(n.grad.numel()),
                               kernels::MaxAlongGrad<T>{.dy = n.grad.data(),
                                                        .arg = arg->data(),
                                                        .dx = dx.data(),
                                                        .line = line,
                                                        .step = xs.stride(d)});
    n.inputs[0]->accumulate(std::move(dx));
  });
}

// ---- matmul and linear ----
// a (..., m, k) @ b (..., k, n) -> (..., m, n); both of rank >= 2, batch dims broadcast
// (torch.matmul).
template <class T, Device D>
Var<T, D> matmul(const Var<T, D>& a, const Var<T, D>& b) {
  const Shape &sa = a.shape(), &sb = b.shape();
  if (sa.rank() < 2 || sb.rank() < 2)
    throw ValueError(ddp::detail::str("ddp: autograd: matmul: both operands need rank >= 2, got ",
                                      sa, " and ", sb, "; reshape a vector to (1, k) or (k, 1)"));
  const std::int64_t m = sa[-2], k = sa[-1], n = sb[-1];
  if (sb[-2] != k)
    throw ValueError(ddp::detail::str("ddp: autograd: matmul: shapes ", sa, " and ", sb,
                                      " do not chain: a has ", k, " columns but b has ", sb[-2],
                                      " rows"));
  std::vector<std::int64_t> ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const Shape batch = detail::broadcast_shapes(Shape(ba), Shape(bb), "matmul");
  std::vector<std::int64_t> od = detail::dims_of(batch);
  od.push_back(m);
  od.push_back(n);
  const Shape out_shape = Shape(od);
  // Offsets of each batch's matrix in a, b (in elements), and the number of batches.
  struct Batches {
    kernels::StridedIndex ia, ib;
    std::int64_t count;
  };
  auto batches = [batch](const Shape& sa, const Shape& sb) {
    std::vector<std::int64_t> ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
    Batches r{detail::broadcast_index(Shape(ba), batch), detail::broadcast_index(Shape(bb), batch),
              batch.numel()};
    for (int i = 0; i < r.ia.rank; ++i) r.ia.strides[i] *= sa[-2] * sa[-1];
    for (int i = 0; i < r.ib.rank; ++i) r.ib.strides[i] *= sb[-2] * sb[-1];
    return r;
  };
  const Batches bt = batches(sa, sb);
  Tensor<T, D> y(out_shape);
  for (std::int64_t i = 0; i < bt.count; ++i)
    detail::gemm(a.exec(), false, false, m, n, k, a.value().data() + bt.ia(i), k,
                 b.value().data() + bt.ib(i), n, y.data() + i * m * n, n);
  return detail::record<T, D>(
      "matmul", std::move(y), {a.node_ptr(), b.node_ptr()},
      [bt, m, n, k, out_shape](Node<T, D>& nd) {
        const auto& A = *nd.inputs[0];
        const auto& B = *nd.inputs[1];
        std::vector<std::int64_t> batch_dims(out_shape.begin(), out_shape.end() - 2);
        // da (batch, m, k) = dy (m, n) b^T (n, k), summed over a's broadcast batch dims
        if (A.requires_grad) {
          std::vector<std::int64_t> fd = batch_dims;
          fd.push_back(m);
          fd.push_back(k);
          Tensor<T, D> full{Shape(fd)};
          for (std::int64_t i = 0; i < bt.count; ++i)
            detail::gemm(nd.exec, false, true, m, k, n, nd.grad.data() + i * m * n, n,
                         B.value.data() + bt.ib(i), n, full.data() + i * m * k, k);
          if (A.value.shape() == full.shape())  // no broadcast batch dim: full is da
            nd.inputs[0]->accumulate(std::move(full));
          else
            nd.inputs[0]->accumulate(detail::reduce_to(nd.exec, full.cview(), A.value.shape()));
        }
        if (B.requires_grad) {  // db (batch, k, n) = a^T (k, m) dy (m, n)
          std::vector<std::int64_t> fd = batch_dims;
          fd.push_back(k);
          fd.push_back(n);
          Tensor<T, D> full{Shape(fd)};
          for (std::int64_t i = 0; i < bt.count; ++i)
            detail::gemm(nd.exec, true, false, k, n, m, A.value.data() + bt.ia(i), k,
                         nd.grad.data() + i * m * n, n, full.data() + i * k * n, n);
          if (B.value.shape() == full.shape())
            nd.inputs[1]->accumulate(std::move(full));
          else
            nd.inputs[1]->accumulate(detail::reduce_to(nd.exec, full.cview(), B.value.shape()));
        }
      });
}

// y = x W^T + b (torch.nn.functional.linear): x (..., in), w (out, in), bias (out) or an empty Var
// for none. Runs Kernels<D>::linear_forward / linear_backward on x viewed as (N, in).
template <class T, Device D>
Var<T, D> linear(const Var<T, D>& x, const Var<T, D>& w, const Var<T, D>& bias = {}) {
  const Shape &sx = x.shape(), &sw = w.shape();
  if (sx.rank() < 1 || sw.rank() != 2 || sx[-1] != sw[1])
    throw ValueError(ddp::detail::str("ddp: autograd: linear: x ", sx,
                                      " must be (..., in) and the weight ", sw,
                                      " (out, in) with the same in"));
  if (bias.defined() && !(bias.shape() == Shape{sw[0]}))
    throw ValueError(ddp::detail::str("ddp: autograd: linear: bias has shape ", bias.shape(),
                                      " but the weight ", sw, " needs (", sw[0], ")"));
  const std::int64_t in = sw[1], out = sw[0], rows = sx.numel() / std::max<std::int64_t>(in, 1);
  std::vector<std::int64_t> od = detail::dims_of(sx);
  od.back() = out;
  Tensor<T, D> y{Shape(od)};
  Kernels<D>::linear_forward(
      x.exec(), kernels::LinearForwardArgs<T, D>{
                    .x = x.value().cview().reshape(Shape{rows, in}),
                    .w = w.value().cview(),
                    .bias = bias.defined() ? bias.value().cview() : TensorView<const T, D>(),
                    .y = y.view().reshape(Shape{rows, out})});
  std::vector<std::shared_ptr<Node<T, D>>> inputs{x.node_ptr(), w.node_ptr()};
  if (bias.defined()) inputs.push_back(bias.node_ptr());
  return detail::record<T, D>(
      "linear", std::move(y), std::move(inputs), [rows, in, out](Node<T, D>& n) {
        auto& X = *n.inputs[0];
        auto& W = *n.inputs[1];
        const bool has_b = n.inputs.size() == 3;
        Tensor<T, D> dx, dw, db;
        if (X.requires_grad) dx = Tensor<T, D>(X.value.shape());
        if (W.requires_grad) dw = Tensor<T, D>(W.value.shape());
        if (has_b && n.inputs[2]->requires_grad) db = Tensor<T, D>(Shape{out});
        Kernels<D>::linear_backward(
            n.exec,
            kernels::LinearBackwardArgs<T, D>{
                .x = X.value.cview().reshape(Shape{rows, in}),
                .w = W.value.cview(),
                .dy = n.grad.cview().reshape(Shape{rows, out}),
                .dx = X.requires_grad ? dx.view().reshape(Shape{rows, in}) : TensorView<T, D>(),
                .dw = dw.view(),
                .dbias = db.view()});
        if (X.requires_grad) n.inputs[0]->accumulate(std::move(dx));
        if (W.requires_grad) n.inputs[1]->accumulate(std::move(dw));
        if (has_b && n.inputs[2]->requires_grad) n.inputs[2]->accumulate(std::move(db));
      });
}

// ---- shape ops (each copies: a Tensor owns its memory) ----
// The same elements with another shape of equal numel (torch.reshape / view).
template <class T, Device D>
Var<T, D> reshape(const Var<T, D>& x, Shape s) {
  Tensor<T, D> y = detail::clone(x.exec(), x.value().cview());
  y.reshape(s);  // throws naming both shapes
  return detail::record<T, D>("reshape", std::move(y), {x.node_ptr()}, [](Node<T, D>& n) {
    Tensor<T, D> dx = std::move(n.grad);
    n.has_grad = false;
    dx.reshape(n.inputs[0]->value.shape());
    n.inputs[0]->accumulate(std::move(dx));
  });
}

// Dimensions reordered: y's dim i is x's dim perm[i] (torch.permute).
template <class T, Device D>
Var<T, D> permute(const Var<T, D>& x, std::vector<int> perm) {
  const Shape& s = x.shape();
  if (static_cast<int>(perm.size()) != s.rank())
    throw ValueError(
        ddp::detail::str("ddp: autograd: permute: ", perm.size(), " dims given for shape ", s));
  std::vector<bool> seen(perm.size(), false);
  std::vector<std::int64_t> od;
  kernels::StridedIndex ix;  // y index -> x offset
  ix.rank = s.rank();
  for (std::size_t i = 0; i < perm.size(); ++i) {
    const int p = detail::norm_dim(perm[i], s.rank(), "permute", s);
    if (seen[static_cast<std::size_t>(p)])
      throw ValueError(ddp::detail::str("ddp: autograd: permute: dim ", perm[i],
                                        " repeats in the order given for shape ", s));
    seen[static_cast<std::size_t>(p)] = true;
    od.push_back(s[p]);
    ix.dims[i] = s[p];
    ix.strides[i] = s.stride(p);
  }
  Tensor<T, D> y{Shape(od)};
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(y.numel()),
                             kernels::Gather<T>{.x = x.value().data(), .y = y.data(), .ix = ix});
  return detail::record<T, D>("permute", std::move(y), {x.node_ptr()}, [ix](Node<T, D>& n) {
    Tensor<T, D> dx(n.inputs[0]->value.shape());
    Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(dx.numel()),
                               kernels::Scatter<T>{.x = n.grad.data(), .y = dx.data(), .iy = ix});
    n.inputs[0]->accumulate(std::move(dx));
  });
}
template <class T, Device D>
Var<T, D> transpose(const Var<T, D>& x, int d0, int d1) {
  std::vector<int> perm(static_cast<std::size_t>(x.rank()));
  for (int i = 0; i < x.rank(); ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(detail::norm_dim(d0, x.rank(), "transpose", x.shape()))],
            perm[static_cast<std::size_t>(detail::norm_dim(d1, x.rank(), "transpose", x.shape()))]);
  return permute(x, perm);
}

// Elements [start, start + length) of dimension dim (torch.narrow).
template <class T, Device D>
Var<T, D> narrow(const Var<T, D>& x, int dim, std::int64_t start, std::int64_t length) {
  const Shape& s = x.shape();
  const int d = detail::norm_dim(dim, s.rank(), "narrow", s);
  if (start < 0 || length < 0 || start + length > s[d])
    throw ValueError(ddp::detail::str("ddp: autograd: narrow: [", start, ", ", start + length,
                                      ") is outside dim ", dim, " of shape ", s, " (extent ", s[d],
                                      ")"));
  std::vector<std::int64_t> od = detail::dims_of(s);
  od[static_cast<std::size_t>(d)] = length;
  const Shape ys = Shape(od);
  kernels::StridedIndex ix;
  ix.rank = s.rank();
  for (int i = 0; i < s.rank(); ++i) {
    ix.dims[i] = ys[i];
    ix.strides[i] = s.stride(i);
  }
  ix.base = start * s.stride(d);
  Tensor<T, D> y(ys);
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(y.numel()),
                             kernels::Gather<T>{.x = x.value().data(), .y = y.data(), .ix = ix});
  return detail::record<T, D>("narrow", std::move(y), {x.node_ptr()}, [ix](Node<T, D>& n) {
    Tensor<T, D> dx = detail::zeros<T, D>(n.exec, n.inputs[0]->value.shape());
    Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(n.grad.numel()),
                               kernels::Scatter<T>{.x = n.grad.data(), .y = dx.data(), .iy = ix});
    n.inputs[0]->accumulate(std::move(dx));
  });
}

// Joins values along dim (torch.cat); all other dims must match.
template <class T, Device D>
Var<T, D> concat(const std::vector<Var<T, D>>& xs, int dim) {
  if (xs.empty()) throw ValueError("ddp: autograd: concat: no values given");
  const Shape& s0 = xs[0].shape();
  const int d = detail::norm_dim(dim, s0.rank(), "concat", s0);
  std::vector<std::int64_t> od = detail::dims_of(s0);
  od[static_cast<std::size_t>(d)] = 0;
  for (const auto& x : xs) {
    const Shape& s = x.shape();
    bool ok = s.rank() == s0.rank();
    for (int i = 0; ok && i < s.rank(); ++i) ok = i == d || s[i] == s0[i];
    if (!ok)
      throw ValueError(ddp::detail::str("ddp: autograd: concat: shapes ", s0, " and ", s,
                                        " differ outside the concatenated dim ", dim));
    od[static_cast<std::size_t>(d)] += s[d];
  }
  const Shape ys = Shape(od);
  Tensor<T, D> y(ys);
  std::vector<kernels::StridedIndex> parts;  // part p's index -> y offset
  std::int64_t at = 0;
  std::vector<std::shared_ptr<Node<T, D>>> inputs;
  for (const auto& x : xs) {
    kernels::StridedIndex iy;
    iy.rank = ys.rank();
    for (int i = 0; i < ys.rank(); ++i) {
      iy.dims[i] = x.shape()[i];
      iy.strides[i] = ys.stride(i);
    }
    iy.base = at * ys.stride(d);
    at += x.shape()[d];
    Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(x.numel()),
                               kernels::Scatter<T>{.x = x.value().data(), .y = y.data(), .iy = iy});
    parts.push_back(iy);
    inputs.push_back(x.node_ptr());
  }
  return detail::record<T, D>("concat", std::move(y), std::move(inputs), [parts](Node<T, D>& n) {
    for (std::size_t p = 0; p < parts.size(); ++p) {
      if (!n.inputs[p]->requires_grad) continue;
      Tensor<T, D> dx(n.inputs[p]->value.shape());
      Kernels<D>::for_each_index(
          n.exec, static_cast<std::size_t>(dx.numel()),
          kernels::Gather<T>{.x = n.grad.data(), .y = dx.data(), .ix = parts[p]});
      n.inputs[p]->accumulate(std::move(dx));
    }
  });
}

// Pieces of `sizes[i]` along dim (torch.split with a list of sizes; they must add up to the dim's
// extent).
template <class T, Device D>
std::vector<Var<T, D>> split(const Var<T, D>& x, const std::vector<std::int64_t>& sizes, int dim) {
  const int d = detail::norm_dim(dim, x.rank(), "split", x.shape());
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  if (total != x.shape()[d])
    throw ValueError(ddp::detail::str("ddp: autograd: split: sizes add up to ", total, " but dim ",
                                      dim, " of shape ", x.shape(), " has ", x.shape()[d]));
  std::vector<Var<T, D>> out;
  std::int64_t at = 0;
  for (auto s : sizes) {
    out.push_back(narrow(x, d, at, s));
    at += s;
  }
  return out;
}

// Rows idx[j] of dimension dim (torch.index_select); idx is int64 on the same device, each in [0,
// extent).
template <class T, Device D>
Var<T, D> index_select(const Var<T, D>& x, int dim, const Tensor<std::int64_t, D>& idx) {
  const Shape& s = x.shape();
  const int d = detail::norm_dim(dim, s.rank(), "index_select", s);
  if (idx.rank() != 1)
    throw ValueError(ddp::detail::str(
        "ddp: autograd: index_select: indices must be 1-D, got shape ", idx.shape()));
  detail::Indices<D> ix = detail::keep_indices(x.exec(), idx, true);  // checked on the host
  const auto keep = ix.keep;
  const Tensor<std::int64_t, Cpu>& host = ix.host;
  for (std::int64_t j = 0; j < host.numel(); ++j)
    if (host.data()[j] < 0 || host.data()[j] >= s[d])
      throw ValueError(ddp::detail::str("ddp: autograd: index_select: index ", host.data()[j],
                                        " at position ", j, " is out of range for dim ", dim,
                                        " of shape ", s));
  std::vector<std::int64_t> od = detail::dims_of(s);
  od[static_cast<std::size_t>(d)] = idx.numel();
  Tensor<T, D> y{Shape(od)};
  const std::int64_t inner = s.stride(d), len_in = s[d], len_out = idx.numel();
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(y.numel()),
                             kernels::IndexSelect<T>{.x = x.value().data(),
                                                     .idx = keep->data(),
                                                     .y = y.data(),
                                                     .inner = inner,
                                                     .len_in = len_in,
                                                     .len_out = len_out});
  return detail::record<T, D>(
      "index_select", std::move(y), {x.node_ptr()}, [keep, inner, len_in, len_out](Node<T, D>& n) {
        Tensor<T, D> dx(n.inputs[0]->value.shape());
        Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(dx.numel()),
                                   kernels::IndexSelectGrad<T>{.dy = n.grad.data(),
                                                               .idx = keep->data(),
                                                               .dx = dx.data(),
                                                               .inner = inner,
                                                               .len_in = len_in,
                                                               .len_out = len_out});
        n.inputs[0]->accumulate(std::move(dx));
      });
}

// ---- softmax family and losses ----
namespace detail {
template <class T, Device D>
Var<T, D> softmax_impl(const Var<T, D>& x, int dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const Shape& s = x.shape();
  const int d = norm_dim(dim, s.rank(), op, s);
  const auto line = lines_along(s, d);
  const std::int64_t lines = s.numel() / std::max<std::int64_t>(s[d], 1);
  Tensor<T, D> y(s);
  Kernels<D>::for_each_index(x.exec(), static_cast<std::size_t>(lines),
                             kernels::SoftmaxAlong<T>{.x = x.value().data(),
                                                      .y = y.data(),
                                                      .line = line,
                                                      .len = s[d],
                                                      .step = s.stride(d),
                                                      .log_form = log});
  return record<T, D>(op, std::move(y), {x.node_ptr()}, [line, lines, d, log](Node<T, D>& n) {
    const Shape& xs = n.value.shape();
    Tensor<T, D> dx(xs);
    Kernels<D>::for_each_index(n.exec, static_cast<std::size_t>(lines),
                               kernels::SoftmaxAlongGrad<T>{.y = n.value.data(),
                                                            .dy = n.grad.data(),
                                                            .dx = dx.data(),
                                                            .line = line,
                                                            .len = xs[d],
                                                            .step = xs.stride(d),
                                                            .log_form = log});
    n.inputs[0]->accumulate(std::move(dx));
  });
}
}  // namespace detail

template <class T, Device D>
Var<T, D> softmax(const Var<T, D>& x, int dim = -1) {
  return detail::softmax_impl(x, dim, false);
}
template <class T, Device D>
Var<T, D> log_softmax(const Var<T, D>& x, int dim = -1) {
  return detail::softmax_impl(x, dim, true);
}

// torch.nn.functional.cross_entropy(logits (N, C), targets (N) int64, reduction="mean",
// label_smoothing): Kernels<D>::cross_entropy, whose gradient it asks for again in backward (no (N,
// C) buffer kept alive).
template <class T, Device D>
Var<T, D> cross_entropy(const Var<T, D>& logits, const Tensor<std::int64_t, D>& targets,
                        double label_smoothing = 0.0) {
  auto labels = detail::keep_indices(logits.exec(), targets, false).keep;
  const double loss = Kernels<D>::cross_entropy(
      logits.exec(), kernels::CrossEntropyArgs<T, D>{.logits = logits.value().cview(),
                                                     .labels = labels->cview(),
                                                     .label_smoothing = label_smoothing});
  Tensor<T, D> y(Shape{});
  Kernels<D>::fill(logits.exec(), y.view(), static_cast<T>(loss));
  return detail::record<T, D>(
      "cross_entropy", std::move(y), {logits.node_ptr()}, [labels, label_smoothing](Node<T, D>& n) {
        auto& L = *n.inputs[0];
        Tensor<T, D> dz(L.value.shape());
        Kernels<D>::cross_entropy(
            n.exec, kernels::CrossEntropyArgs<T, D>{.logits = L.value.cview(),
                                                    .labels = labels->cview(),
                                                    .dlogits = dz.view(),
                                                    .label_smoothing = label_smoothing});
        // d(loss)/d(logits) times the incoming scalar gradient.
        Tensor<T, D> g = detail::broadcast_binary(n.exec, dz.cview(), n.grad.cview(), dz.shape(),
                                                  kernels::MulOp<T>{});
        L.accumulate(std::move(g));
      });
}

// torch.nn.functional.mse_loss(x, target) with mean reduction (Kernels<D>::mse); both get
// gradients.
template <class T, Device D>
Var<T, D> mse_loss(const Var<T, D>& x, const Var<T, D>& target) {
  if (!(x.shape() == target.shape()))
    throw ValueError(ddp::detail::str("ddp: autograd: mse_loss: input ", x.shape(), " and target ",
                                      target.shape(), " must have the same shape"));
  const double loss = Kernels<D>::mse(
      x.exec(), kernels::MseArgs<T, D>{.x = x.value().cview(), .target = target.value().cview()});
  Tensor<T, D> y(Shape{});
  Kernels<D>::fill(x.exec(), y.view(), static_cast<T>(loss));
  return detail::record<T, D>(
      "mse_loss", std::move(y), {x.node_ptr(), target.node_ptr()}, [](Node<T, D>& n) {
        auto& X = *n.inputs[0];
        auto& Y = *n.inputs[1];
        Tensor<T, D> dx(X.value.shape());
        Kernels<D>::mse(n.exec,
                        kernels::MseArgs<T, D>{
                            .x = X.value.cview(), .target = Y.value.cview(), .dx = dx.view()});
        Tensor<T, D> g = detail::broadcast_binary(n.exec, dx.cview(), n.grad.cview(), dx.shape(),
                                                  kernels::MulOp<T>{});
        if (Y.requires_grad) {  // d/d(target) = -d/d(x)
          Tensor<T, D> gy = detail::clone(n.exec, g.cview());
          Kernels<D>::scale(n.exec, T(-1), gy.view());
          Y.accumulate(std::move(gy));
        }
        if (X.requires_grad) X.accumulate(std::move(g));
      });
}

// ---- transformer layers as ops (the existing Kernels<D> members) ----
// Rows ids[...] of weight (V, C) (torch.nn.functional.embedding): ids of any shape S give (S...,
// C). The kernel checks every id; the weight's gradient adds the dy rows of repeated ids.
template <class T, Device D>
Var<T, D> embedding(const Tensor<std::int64_t, D>& ids, const Var<T, D>& weight) {
  const Shape& sw = weight.shape();
  if (sw.rank() != 2)
    throw ValueError(ddp::detail::str("ddp: autograd: embedding: weight ", sw, " must be (V, C)"));
  if (ids.rank() >= Shape::kMaxRank)
    throw ValueError(ddp::detail::str("ddp: autograd: embedding: ids of shape ", ids.shape(),
                                      " leave no room for C"));
  auto keep = detail::keep_indices(weight.exec(), ids, false).keep;
  const std::int64_t n = ids.numel(), c = sw[1];
  std::vector<std::int64_t> od = detail::dims_of(ids.shape());
  od.push_back(c);
  Tensor<T, D> y{Shape(od)};
  Kernels<D>::embedding_forward(
      weight.exec(), kernels::EmbeddingForwardArgs<T, D>{.ids = keep->cview().reshape(Shape{n}),
                                                         .weight = weight.value().cview(),
                                                         .y = y.view().reshape(Shape{n, c})});
  return detail::record<T, D>(
      "embedding", std::move(y), {weight.node_ptr()}, [keep, n, c](Node<T, D>& nd) {
        Tensor<T, D> dw(nd.inputs[0]->value.shape());
        Kernels<D>::embedding_backward(nd.exec, kernels::EmbeddingBackwardArgs<T, D>{
                                                    .ids = keep->cview().reshape(Shape{n}),
                                                    .dy = nd.grad.cview().reshape(Shape{n, c}),
                                                    .dweight = dw.view(),
                                                    // forward checked these very ids
                                                    .ids_checked = true});
        nd.inputs[0]->accumulate(std::move(dw));
      });
}

// Causal multi-head self-attention on the packed projection qkv (B, T, 3C) (q, k, v side by side,
// minGPT's c_attn output; head h is columns h * hs .. (h + 1) * hs of each, hs = C / n_head) -> y
// (B, T, C), the heads side by side: torch's (softmax(q k^T / sqrt(hs) + causal mask)
// v).transpose(1, 2).reshape(B, T, C) per head, in one op on Kernels<D>::attention_forward/backward
// (nn::CausalSelfAttention's kernels, kernels/attention_args.hpp). Keeps the probabilities (B, nh,
// T, T) for backward: one such tensor, and no (B, nh, T, hs) copies of q, k, v or y.
template <class T, Device D>
Var<T, D> causal_attention(const Var<T, D>& qkv, std::int64_t n_head) {
  const Shape& s = qkv.shape();
  if (s.rank() != 3 || s[2] % 3 != 0 || n_head < 1 || (s[2] / 3) % n_head != 0)
    throw ValueError(ddp::detail::str("ddp: autograd: causal_attention: qkv ", s,
                                      " must be (B, T, 3C) with C ",
                                      "divisible by n_head = ", n_head));
  const std::int64_t b = s[0], t = s[1], c = s[2] / 3;
  auto att = std::make_shared<Tensor<T, D>>(Shape{b, n_head, t, t});
  Tensor<T, D> y(Shape{b, t, c});
  Kernels<D>::attention_forward(
      qkv.exec(),
      kernels::AttentionForwardArgs<T, D>{
          .qkv = qkv.value().cview(), .att = att->view(), .y = y.view(), .n_head = n_head});
  return detail::record<T, D>(
      "causal_attention", std::move(y), {qkv.node_ptr()}, [att, n_head](Node<T, D>& nd) {
        Tensor<T, D> dqkv(nd.inputs[0]->value.shape());
        Kernels<D>::attention_backward(
            nd.exec, kernels::AttentionBackwardArgs<T, D>{.qkv = nd.inputs[0]->value.cview(),
                                                          .att = att->cview(),
                                                          .dy = nd.grad.cview(),
                                                          .dqkv = dqkv.view(),
                                                          .n_head = n_head});
        nd.inputs[0]->accumulate(std::move(dqkv));
      });
}

// torch.nn.functional.layer_norm over the last dim: x (..., C), weight and bias (C) or empty Vars
// for none.
template <class T, Device D>
Var<T, D> layer_norm(const Var<T, D>& x, const Var<T, D>& weight = {}, const Var<T, D>& bias = {},
                     double eps = 1e-5) {
  using S = kernels::LayerNormStat<T>;
  const Shape& sx = x.shape();
  if (sx.rank() < 1)
    throw ValueError(
        ddp::detail::str("ddp: autograd: layer_norm: x must have rank >= 1, got shape ", sx));
  const std::int64_t c = sx[-1], m = sx.numel() / std::max<std::int64_t>(c, 1);
  for (const Var<T, D>* p : {&weight, &bias})
    if (p->defined() && !(p->shape() == Shape{c}))
      throw ValueError(
          ddp::detail::str("ddp: autograd: layer_norm: ", p == &weight ? "weight" : "bias",
                           " has shape ", p->shape(), " but x ", sx, " needs (", c, ")"));
  auto mean = std::make_shared<Tensor<S, D>>(Shape{m});
  auto rstd = std::make_shared<Tensor<S, D>>(Shape{m});
  Tensor<T, D> y(sx);
  Kernels<D>::layer_norm_forward(
      x.exec(), kernels::LayerNormForwardArgs<T, D>{
                    .x = x.value().cview().reshape(Shape{m, c}),
                    .weight = weight.defined() ? weight.value().cview() : TensorView<const T, D>(),
                    .bias = bias.defined() ? bias.value().cview() : TensorView<const T, D>(),
                    .y = y.view().reshape(Shape{m, c}),
                    .mean = mean->view(),
                    .rstd = rstd->view(),
                    .eps = eps});
  std::vector<std::shared_ptr<Node<T, D>>> inputs{x.node_ptr()};
  const int wi = weight.defined() ? 1 : 0, bi = bias.defined() ? 1 + wi : 0;
  if (weight.defined()) inputs.push_back(weight.node_ptr());
  if (bias.defined()) inputs.push_back(bias.node_ptr());
  return detail::record<T, D>(
      "layer_norm", std::move(y), std::move(inputs), [mean, rstd, m, c, wi, bi](Node<T, D>& n) {
        auto& X = *n.inputs[0];
        const bool gw = wi && n.inputs[static_cast<std::size_t>(wi)]->requires_grad;
        const bool gb = bi && n.inputs[static_cast<std::size_t>(bi)]->requires_grad;
        Tensor<T, D> dx, dw, db;
        if (X.requires_grad) dx = Tensor<T, D>(X.value.shape());
        if (gw) dw = Tensor<T, D>(Shape{c});
        if (gb) db = Tensor<T, D>(Shape{c});
        Kernels<D>::layer_norm_backward(
            n.exec, kernels::LayerNormBackwardArgs<T, D>{
                        .x = X.value.cview().reshape(Shape{m, c}),
                        .weight = wi ? n.inputs[static_cast<std::size_t>(wi)]->value.cview()
                                     : TensorView<const T, D>(),
                        .mean = mean->cview(),
                        .rstd = rstd->cview(),
                        .dy = n.grad.cview().reshape(Shape{m, c}),
                        .dx = X.requires_grad ? dx.view().reshape(Shape{m, c}) : TensorView<T, D>(),
                        .dweight = dw.view(),
                        .dbias = db.view()});
        if (X.requires_grad) X.accumulate(std::move(dx));
        if (gw) n.inputs[static_cast<std::size_t>(wi)]->accumulate(std::move(dw));
        if (gb) n.inputs[static_cast<std::size_t>(bi)]->accumulate(std::move(db));
      });
}

// Inverted dropout (torch.nn.functional.dropout in training mode) with nn::Dropout's counter-based
// mask: the mask is a function of (seed, rank, stream, step) and the element index, so one step's
// mask is reproducible.
struct DropoutOptions {
  double p = 0.5;
  std::uint64_t seed = 0;
  std::uint32_t rank = 0;
  // one per dropout of a model: two sharing (seed, rank, stream) draw the same mask
  std::uint32_t stream = 0;
  std::uint64_t step = 0;  // below 2^32
  bool training = true;    // false: the identity (a copy)
};
template <class T, Device D>
Var<T, D> dropout(const Var<T, D>& x, const DropoutOptions& o) {
  if (!o.training || o.p == 0.0) return x * T(1);
  auto mask = std::make_shared<Tensor<std::uint8_t, D>>(x.shape());
  Tensor<T, D> y(x.shape());
  Kernels<D>::dropout_forward(x.exec(), kernels::DropoutForwardArgs<T, D>{.x = x.value().cview(),
                                                                          .y = y.view(),
                                                                          .mask = mask->view(),
                                                                          .p = o.p,
                                                                          .seed = o.seed,
                                                                          .rank = o.rank,
                                                                          .stream = o.stream,
                                                                          .step = o.step});
  const double p = o.p;
  return detail::record<T, D>("dropout", std::move(y), {x.node_ptr()}, [mask, p](Node<T, D>& n) {
    Tensor<T, D> dx(n.value.shape());
    Kernels<D>::dropout_backward(
        n.exec, kernels::DropoutBackwardArgs<T, D>{
                    .dy = n.grad.cview(), .mask = mask->cview(), .dx = dx.view(), .p = p});
    n.inputs[0]->accumulate(std::move(dx));
  });
}

// ---- convolution, pooling and batch norm on NHWC activations (ddp's layout, docs/decisions/0005)
// conv2d: x (N, H, W, C_in), weight (C_out, kH, kW, C_in) (KRSC), bias (C_out) or an empty Var ->
// (N, H_out, W_out, C_out); torch's conv2d on the NCHW/OIHW permutations (no groups).
struct Conv2dOptions {
  kernels::Size2 stride{1, 1};
  kernels::Size2 padding{0, 0};
  kernels::Size2 dilation{1, 1};
};
template <class T, Device D>
Var<T, D> conv2d(const Var<T, D>& x, const Var<T, D>& weight, const Var<T, D>& bias = {},
                 Conv2dOptions o = {}) {
  const Shape ys =
      kernels::conv2d_output_shape<T, D>(x.value().cview(), weight.value().cview(), o.stride,
                                         o.padding, o.dilation, "autograd conv2d");
  if (bias.defined() && !(bias.shape() == Shape{ys[3]}))
    throw ValueError(ddp::detail::str("ddp: autograd: conv2d: bias has shape ", bias.shape(),
                                      " but the weight ", weight.shape(), " needs (", ys[3], ")"));
  Tensor<T, D> y(ys);
  Kernels<D>::conv2d_forward(
      x.exec(), kernels::Conv2dForwardArgs<T, D>{
                    .x = x.value().cview(),
                    .w = weight.value().cview(),
                    .bias = bias.defined() ? bias.value().cview() : TensorView<const T, D>(),
                    .y = y.view(),
                    .stride = o.stride,
                    .padding = o.padding,
                    .dilation = o.dilation});
  std::vector<std::shared_ptr<Node<T, D>>> inputs{x.node_ptr(), weight.node_ptr()};
  if (bias.defined()) inputs.push_back(bias.node_ptr());
  return detail::record<T, D>("conv2d", std::move(y), std::move(inputs), [o](Node<T, D>& n) {
    auto& X = *n.inputs[0];
    auto& W = *n.inputs[1];
    const bool gb = n.inputs.size() == 3 && n.inputs[2]->requires_grad;
    Tensor<T, D> dx, dw, db;
    if (X.requires_grad) dx = Tensor<T, D>(X.value.shape());
    if (W.requires_grad) dw = Tensor<T, D>(W.value.shape());
    if (gb) db = Tensor<T, D>(Shape{W.value.shape()[0]});
    Kernels<D>::conv2d_backward(n.exec, kernels::Conv2dBackwardArgs<T, D>{.x = X.value.cview(),
                                                                          .w = W.value.cview(),
                                                                          .dy = n.grad.cview(),
                                                                          .dx = dx.view(),
                                                                          .dw = dw.view(),
                                                                          .dbias = db.view(),
                                                                          .stride = o.stride,
                                                                          .padding = o.padding,
                                                                          .dilation = o.dilation});
    if (X.requires_grad) X.accumulate(std::move(dx));
    if (W.requires_grad) W.accumulate(std::move(dw));
    if (gb) n.inputs[2]->accumulate(std::move(db));
  });
}

// max_pool2d (torch's, -infinity padding, floor mode) on x (N, H, W, C); the gradient goes to each
// window's max.
template <class T, Device D>
Var<T, D> max_pool2d(const Var<T, D>& x, kernels::Size2 kernel, kernels::Size2 stride,
                     kernels::Size2 padding = {0, 0}) {
  const Shape ys = kernels::maxpool2d_output_shape(x.value().cview(), kernel, stride, padding);
  Tensor<T, D> y(ys);
  auto argmax = std::make_shared<Tensor<std::int32_t, D>>(ys);
  Kernels<D>::max_pool2d_forward(x.exec(),
                                 kernels::MaxPool2dForwardArgs<T, D>{.x = x.value().cview(),
                                                                     .y = y.view(),
                                                                     .argmax = argmax->view(),
                                                                     .kernel = kernel,
                                                                     .stride = stride,
                                                                     .padding = padding});
  return detail::record<T, D>(
      "max_pool2d", std::move(y), {x.node_ptr()}, [argmax, kernel, stride, padding](Node<T, D>& n) {
        Tensor<T, D> dx(n.inputs[0]->value.shape());
        Kernels<D>::max_pool2d_backward(
            n.exec, kernels::MaxPool2dBackwardArgs<T, D>{.dy = n.grad.cview(),
                                                         .argmax = argmax->cview(),
                                                         .dx = dx.view(),
                                                         .kernel = kernel,
                                                         .stride = stride,
                                                         .padding = padding});
        n.inputs[0]->accumulate(std::move(dx));
      });
}

// adaptive_avg_pool2d on x (N, H, W, C) to (N, out.h, out.w, C), torch's cells; (1, 1) is global
// average pooling.
template <class T, Device D>
Var<T, D> adaptive_avg_pool2d(const Var<T, D>& x, kernels::Size2 out) {
  const Shape& sx = x.shape();
  if (sx.rank() != 4 || out.h < 1 || out.w < 1)
    throw ValueError(ddp::detail::str("ddp: autograd: adaptive_avg_pool2d: x ", sx,
                                      " must be NHWC and the output (", out.h, ", ", out.w,
                                      ") at least 1x1"));
  Tensor<T, D> y(Shape{sx[0], out.h, out.w, sx[3]});
  Kernels<D>::adaptive_avg_pool2d_forward(
      x.exec(), kernels::AdaptiveAvgPool2dForwardArgs<T, D>{.x = x.value().cview(), .y = y.view()});
  return detail::record<T, D>(
      "adaptive_avg_pool2d", std::move(y), {x.node_ptr()}, [](Node<T, D>& n) {
        Tensor<T, D> dx(n.inputs[0]->value.shape());
        Kernels<D>::adaptive_avg_pool2d_backward(
            n.exec,
            kernels::AdaptiveAvgPool2dBackwardArgs<T, D>{.dy = n.grad.cview(), .dx = dx.view()});
        n.inputs[0]->accumulate(std::move(dx));
      });
}

// batch_norm over the last dim of x (N, ..., C) (torch's F.batch_norm on the channels-first
// permutation): training uses the batch statistics and updates running_mean/running_var (C) in
// place (momentum, unbiased variance); eval uses them. weight (gamma) and bias (beta) are (C).
struct BatchNormOptions {
  bool training = true;
  double momentum = 0.1;
  double eps = 1e-5;
};
template <class T, Device D>
Var<T, D> batch_norm(const Var<T, D>& x, const Var<T, D>& weight, const Var<T, D>& bias,
                     Tensor<T, D>& running_mean, Tensor<T, D>& running_var,
                     BatchNormOptions o = {}) {
  const std::int64_t c = x.rank() >= 1 ? x.shape()[-1] : 0;
  auto save_mean = std::make_shared<Tensor<T, D>>(Shape{c});
  auto save_invstd = std::make_shared<Tensor<T, D>>(Shape{c});
  Tensor<T, D> y(x.shape());
  Kernels<D>::batchnorm_forward(
      x.exec(), kernels::BatchNormForwardArgs<T, D>{.x = x.value().cview(),
                                                    .gamma = weight.value().cview(),
                                                    .beta = bias.value().cview(),
                                                    .running_mean = running_mean.view(),
                                                    .running_var = running_var.view(),
                                                    .y = y.view(),
                                                    .save_mean = save_mean->view(),
                                                    .save_invstd = save_invstd->view(),
                                                    .training = o.training,
                                                    .momentum = o.momentum,
                                                    .eps = o.eps});
  const bool training = o.training;
  return detail::record<T, D>(
      "batch_norm", std::move(y), {x.node_ptr(), weight.node_ptr(), bias.node_ptr()},
      [save_mean, save_invstd, training](Node<T, D>& n) {
        auto& X = *n.inputs[0];
        auto& G = *n.inputs[1];
        auto& B = *n.inputs[2];
        Tensor<T, D> dx, dg, db;
        if (X.requires_grad) dx = Tensor<T, D>(X.value.shape());
        if (G.requires_grad) dg = Tensor<T, D>(G.value.shape());
        if (B.requires_grad) db = Tensor<T, D>(B.value.shape());
        Kernels<D>::batchnorm_backward(
            n.exec, kernels::BatchNormBackwardArgs<T, D>{.x = X.value.cview(),
                                                         .dy = n.grad.cview(),
                                                         .gamma = G.value.cview(),
                                                         .save_mean = save_mean->cview(),
                                                         .save_invstd = save_invstd->cview(),
                                                         .dx = dx.view(),
                                                         .dgamma = dg.view(),
                                                         .dbeta = db.view(),
                                                         .training = training});
        if (X.requires_grad) X.accumulate(std::move(dx));
        if (G.requires_grad) G.accumulate(std::move(dg));
        if (B.requires_grad) B.accumulate(std::move(db));
      });
}

}  // namespace ddp::autograd
