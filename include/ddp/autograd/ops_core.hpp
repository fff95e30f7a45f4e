// What every autograd op is built from: shape helpers, broadcasting, the tape node recorder
// (detail::record), the element-wise binary and unary machinery, matmul's GEMM per device
// (detail::Gemm<D>; cuBLAS in autograd/cuda/gemm.cuh) and int64 index tensors.
// SPDX-License-Identifier: MIT
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

inline int norm_dim(int dim, const char* op, const Shape& s) {
  return wrap_dim(dim, s, "dim", [op] { return ddp::detail::str("autograd: ", op); });
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

}  // namespace ddp::autograd
