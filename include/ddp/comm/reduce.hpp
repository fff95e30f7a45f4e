// Element-wise reduction kernels on CPU memory, shared by the tcp and mpi backends: dst[i] = dst[i]
// (op) src[i] over a type-erased buffer, and the final division of ReduceOp::Avg. bfloat16 and half
// are widened to float, combined and rounded back once per call.
// SPDX-License-Identifier: MIT
//
// Every op here is commutative in IEEE arithmetic (a+b == b+a bit for bit, likewise *, min, max),
// which is what lets two ranks that combine the same pair of partial results in opposite order
// (recursive doubling) end with bit-identical buffers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ddp/comm/types.hpp"
#include "ddp/core/dtype.hpp"

namespace ddp::comm {

namespace detail {

template <class T>
struct Widen {
  using type = T;
};
template <>
struct Widen<bfloat16> {
  using type = float;
};
template <>
struct Widen<half> {
  using type = float;
};

template <class T, class F>
void combine(T* __restrict dst, const T* __restrict src, std::size_t n, F f) {
  using W = typename Widen<T>::type;
  if constexpr (std::is_same_v<W, T>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = T(f(static_cast<W>(dst[i]), static_cast<W>(src[i])));
  }
}
// dst[i] = f(a[i], b[i]): three distinct buffers.
template <class T, class F>
void combine(T* __restrict dst, const T* __restrict a, const T* __restrict b, std::size_t n, F f) {
  using W = typename Widen<T>::type;
  if constexpr (std::is_same_v<W, T>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = T(f(static_cast<W>(a[i]), static_cast<W>(b[i])));
  }
}

// Calls g(f) with f(W, W) -> W, the binary function of `op` on the widened type W.
template <class W, class G>
void with_op(ReduceOp op, G&& g) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:  // summed here, divided once at the end (divide_by)
      g([](W a, W b) { return static_cast<W>(a + b); });
      break;
    case ReduceOp::Product: g([](W a, W b) { return static_cast<W>(a * b); }); break;
    case ReduceOp::Min: g([](W a, W b) { return b < a ? b : a; }); break;
    case ReduceOp::Max: g([](W a, W b) { return a < b ? b : a; }); break;
  }
}

template <class T>
void divide_typed(T* data, std::size_t n, int by) {
  using W = typename Widen<T>::type;
  const W d = static_cast<W>(by);
  for (std::size_t i = 0; i < n; ++i) data[i] = T(static_cast<W>(static_cast<W>(data[i]) / d));
}

// Calls f(T*) with the buffer cast to the element type of `dtype`.
template <class F>
void visit_dtype(DType dtype, void* p, F&& f) {
  switch (dtype) {
    case DType::F32: f(static_cast<float*>(p)); break;
    case DType::F64: f(static_cast<double*>(p)); break;
    case DType::BF16: f(static_cast<bfloat16*>(p)); break;
    case DType::F16: f(static_cast<half*>(p)); break;
    case DType::I32: f(static_cast<std::int32_t*>(p)); break;
    case DType::I64: f(static_cast<std::int64_t*>(p)); break;
    case DType::U8: f(static_cast<std::uint8_t*>(p)); break;
  }
}

}  // namespace detail

// dst[i] = dst[i] (op) src[i] for i < count. dst and src must not overlap.
inline void reduce_into(void* dst, const void* src, std::size_t count, DType dtype, ReduceOp op) {
  detail::visit_dtype(dtype, dst, [&](auto* d) {
    using T = std::remove_pointer_t<decltype(d)>;
    detail::with_op<typename detail::Widen<T>::type>(
        op, [&](auto f) { detail::combine(d, static_cast<const T*>(src), count, f); });
  });
}

// dst[i] = a[i] (op) b[i] for i < count: reduce_into without first copying a into dst. No two may
// overlap.
inline void reduce_from(void* dst, const void* a, const void* b, std::size_t count, DType dtype,
                        ReduceOp op) {
  detail::visit_dtype(dtype, dst, [&](auto* d) {
    using T = std::remove_pointer_t<decltype(d)>;
    detail::with_op<typename detail::Widen<T>::type>(op, [&](auto f) {
      detail::combine(d, static_cast<const T*>(a), static_cast<const T*>(b), count, f);
    });
  });
}

// data[i] /= by: the last step of ReduceOp::Avg (integer division for integer types).
inline void divide_by(void* data, std::size_t count, DType dtype, int by) {
  detail::visit_dtype(dtype, data, [&](auto* d) {
    using T = std::remove_pointer_t<decltype(d)>;
    detail::divide_typed<T>(d, count, by);
  });
}

// memcpy that accepts n == 0 with null pointers: an empty buffer's data (and an empty Scratch) may
// be null, and memcpy's pointers must be valid even for 0 bytes (UBSan reports it).
inline void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
  if (n != 0) std::memcpy(dst, src, n);
}

// Element offsets of n segments covering count elements: segment i is [offs[i], offs[i+1]); the
// first count % n segments are one element longer. Example: count 10, n 4 -> 0 3 6 8 10.
inline std::vector<std::size_t> even_segments(std::size_t count, int n) {
  std::vector<std::size_t> offs(static_cast<std::size_t>(n) + 1, 0);
  const std::size_t base = count / static_cast<std::size_t>(n),
                    extra = count % static_cast<std::size_t>(n);
  for (int i = 0; i < n; ++i)
    offs[i + 1] = offs[i] + base + (static_cast<std::size_t>(i) < extra ? 1 : 0);
  return offs;
}

}  // namespace ddp::comm
