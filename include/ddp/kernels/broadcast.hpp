// Broadcasting, reduction and index-mapping functors for autograd's ops, written once for both
// devices and run by Kernels<D>::for_each_index(exec, n, f).
// SPDX-License-Identifier: MIT
//
// Shapes are aligned numpy-style: a rank-r operand of a rank-R result (r <= R) is padded with
// leading 1s, and an extent-1 dimension is read with stride 0. StridedIndex maps a flat index of
// the result (row-major over `dims`) to an operand offset (sum of index * stride), which is all
// broadcasting, expand, permute and narrow need. Example: a (3, 1) + b (4,) -> out (3, 4): a's
// strides (1, 0), b's (0, 1).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ddp/config.hpp"
#include "ddp/kernels/unary_ops.hpp"

namespace ddp::kernels {

constexpr int kMaxIndexRank = 5;

// Offset into an operand of flat index i of a row-major array of extents dims[0..rank).
struct StridedIndex {
  int rank = 0;
  std::int64_t dims[kMaxIndexRank] = {};
  // operand elements per step of each result dimension (0: broadcast)
  std::int64_t strides[kMaxIndexRank] = {};
  std::int64_t base = 0;
  DDP_HOST_DEVICE std::int64_t operator()(std::int64_t i) const {
    std::int64_t off = base;
    for (int d = rank - 1; d >= 0; --d) {
      off += (i % dims[d]) * strides[d];
      i /= dims[d];
    }
    return off;
  }
};

// out[i] = op(a[ia(i)], b[ib(i)]) (broadcasting binary op; Op is one of the small structs below).
template <class T, class Op>
struct BroadcastBinary {
  const T* a;
  const T* b;
  T* out;
  StridedIndex ia, ib;
  Op op;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i);
    out[i] = op(a[ia(k)], b[ib(k)]);
  }
};

// y[i] = x[ix(i)]: expand (broadcast copy), permute, narrow (a window of x), all as one gather.
template <class T>
struct Gather {
  const T* x;
  T* y;
  StridedIndex ix;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    y[i] = x[ix(static_cast<std::int64_t>(i))];
  }
};

// y[iy(i)] = x[i]: undoes a Gather whose offsets are distinct (permute, narrow, concat parts).
template <class T>
struct Scatter {
  const T* x;
  T* y;
  StridedIndex iy;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    y[iy(static_cast<std::int64_t>(i))] = x[i];
  }
};

// y[j] = scale * sum of x[outer(j) + inner(k)] for k in [0, count), accumulated in double. Sums the
// dimensions a broadcast expanded (a broadcast operand's gradient) or those of sum/mean.
template <class T>
struct ReduceSum {
  const T* x;
  T* y;
  StridedIndex outer, inner;
  std::int64_t count;
  double scale;
  DDP_HOST_DEVICE void operator()(std::size_t j) const {
    const std::int64_t o = outer(static_cast<std::int64_t>(j));
    double acc = 0.0;
    for (std::int64_t k = 0; k < count; ++k) acc += static_cast<double>(x[o + inner(k)]);
    y[j] = static_cast<T>(acc * scale);
  }
};

// ---- binary ops of BroadcastBinary ----
template <class T>
struct AddOp {
  DDP_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};
template <class T>
struct SubOp {
  DDP_HOST_DEVICE T operator()(T a, T b) const { return a - b; }
};
template <class T>
struct MulOp {
  DDP_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};
template <class T>
struct DivOp {
  DDP_HOST_DEVICE T operator()(T a, T b) const { return a / b; }
};
// d(a / b)/db = -dy * a / b^2, run as BroadcastBinary over (dy * a) and b. The other operand
// gradients (dy, -dy, dy * b, dy / b) are MulOp, DivOp or NegOp applied to dy.
template <class T>
struct DivGradDenOp {
  DDP_HOST_DEVICE T operator()(T dya, T b) const { return -dya / (b * b); }
};

// ---- reductions along one dimension: `outer` lines of `len` elements `step` apart ----
// Line j starts at line(j); max over it writes the value and the index of the first maximum
// (torch's choice for ties on the CPU is also the first); NaN wins as in torch.
template <class T>
struct MaxAlong {
  const T* x;
  T* y;
  std::int64_t* arg;
  StridedIndex line;
  std::int64_t len, step;
  DDP_HOST_DEVICE void operator()(std::size_t j) const {
    const std::int64_t o = line(static_cast<std::int64_t>(j));
    T best = x[o];
    std::int64_t bi = 0;
    for (std::int64_t k = 1; k < len; ++k) {
      const T v = x[o + k * step];
      if (best != best) break;
      if (v > best || v != v) {
        best = v;
        bi = k;
      }
    }
    y[j] = best;
    arg[j] = bi;
  }
};
// dx[line(j) + arg[j] * step] = dy[j], dx zeroed first (each line writes one distinct element).
template <class T>
struct MaxAlongGrad {
  const T* dy;
  const std::int64_t* arg;
  T* dx;
  StridedIndex line;
  std::int64_t step;
  DDP_HOST_DEVICE void operator()(std::size_t j) const {
    dx[line(static_cast<std::int64_t>(j)) + arg[j] * step] = dy[j];
  }
};

// Softmax / log-softmax along one dimension, one line per index (max-shifted, sums in double).
template <class T>
struct SoftmaxAlong {
  const T* x;
  T* y;
  StridedIndex line;
  std::int64_t len, step;
  bool log_form;  // log-softmax
  DDP_HOST_DEVICE void operator()(std::size_t j) const {
    using std::exp;
    using std::log;
    const std::int64_t o = line(static_cast<std::int64_t>(j));
    double mx = static_cast<double>(x[o]);
    for (std::int64_t k = 1; k < len; ++k)
      mx = static_cast<double>(x[o + k * step]) > mx ? static_cast<double>(x[o + k * step]) : mx;
    double s = 0.0;
    for (std::int64_t k = 0; k < len; ++k) s += exp(static_cast<double>(x[o + k * step]) - mx);
    const double lse = mx + log(s);
    for (std::int64_t k = 0; k < len; ++k) {
      const double z = static_cast<double>(x[o + k * step]) - lse;
      y[o + k * step] = static_cast<T>(log_form ? z : exp(z));
    }
  }
};
// Softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy).
template <class T>
struct SoftmaxAlongGrad {
  const T* y;
  const T* dy;
  T* dx;
  StridedIndex line;
  std::int64_t len, step;
  bool log_form;  // log-softmax
  DDP_HOST_DEVICE void operator()(std::size_t j) const {
    using std::exp;
    const std::int64_t o = line(static_cast<std::int64_t>(j));
    double s = 0.0;
    for (std::int64_t k = 0; k < len; ++k) {
      const std::int64_t i = o + k * step;
      s += log_form ? static_cast<double>(dy[i])
                    : static_cast<double>(dy[i]) * static_cast<double>(y[i]);
    }
    for (std::int64_t k = 0; k < len; ++k) {
      const std::int64_t i = o + k * step;
      const double yi = static_cast<double>(y[i]), g = static_cast<double>(dy[i]);
      dx[i] = static_cast<T>(log_form ? g - exp(yi) * s : yi * (g - s));
    }
  }
};

// index_select along one dimension: y's line j (len_out long) takes x's rows idx[k]; its gradient
// gathers, for every x element, the dy elements whose index picked its row (no atomics: repeated
// indices sum in a fixed order).
template <class T>
struct IndexSelect {
  const T* x;
  const std::int64_t* idx;
  T* y;
  // y viewed as (outer, len_out, inner), x as (outer, len_in, inner)
  std::int64_t inner, len_in, len_out;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i);
    const std::int64_t in = k % inner, r = (k / inner) % len_out, o = k / (inner * len_out);
    y[i] = x[(o * len_in + idx[r]) * inner + in];
  }
};
template <class T>
struct IndexSelectGrad {
  const T* dy;
  const std::int64_t* idx;
  T* dx;
  std::int64_t inner, len_in, len_out;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i);
    const std::int64_t in = k % inner, r = (k / inner) % len_in, o = k / (inner * len_in);
    T acc = T(0);
    for (std::int64_t s = 0; s < len_out; ++s)
      if (idx[s] == r) acc += dy[(o * len_out + s) * inner + in];
    dx[i] = acc;
  }
};

}  // namespace ddp::kernels
