// CPU pooling in NHWC: max-pool (any kernel/stride/padding, argmax kept for backward) and adaptive average pool.
// SPDX-License-Identifier: MIT
//
// Max-pool: output (ho, wo, c) is the maximum of x over rows [ho*sh - ph, +kh) and columns [wo*sw - pw, +kw)
// clipped to the image (padding acts as -infinity, as in PyTorch); argmax stores hi * W + wi of the first
// maximum in row-major window order (PyTorch's tie rule), and a NaN wins over numbers (PyTorch propagates
// it). Backward scatters dy to dx[argmax]. Example: ResNet's stem pool, kernel 3, stride 2, padding 1,
// maps 112x112 to 56x56; output (0, 0) looks at input rows and columns {0, 1} only.
// Adaptive average pool: output cell (i, j) averages rows [floor(i H / Ho), ceil((i + 1) H / Ho)) and the
// like for columns; backward spreads dy / cell_size over the cell (cells may overlap: contributions add).
// Images are spread over threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
void max_pool2d_forward(const Exec<Cpu>& exec, const MaxPool2dForwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t h = a.x.dim(1), w = a.x.dim(2), c = a.x.dim(3), ho = a.y.dim(1), wo = a.y.dim(2);
  const T* x = a.x.data();
  T* y = a.y.data();
  std::int32_t* am = a.argmax.empty() ? nullptr : a.argmax.data();
  parallel_for(exec, a.x.dim(0) * ho, 1, [&](std::int64_t r0, std::int64_t r1, int) {
    std::vector<std::int32_t> arg_buf(static_cast<std::size_t>(c));
    for (std::int64_t r = r0; r < r1; ++r) {  // r = n * ho + oh: one output row
      const std::int64_t n = r / ho, oh = r % ho;
      const std::int64_t h0 = oh * a.stride.h - a.padding.h;
      const std::int64_t hb = std::max<std::int64_t>(h0, 0), he = std::min(h0 + a.kernel.h, h);
      for (std::int64_t ow = 0; ow < wo; ++ow) {
        const std::int64_t w0 = ow * a.stride.w - a.padding.w;
        const std::int64_t wb = std::max<std::int64_t>(w0, 0), we = std::min(w0 + a.kernel.w, w);
        T* yo = y + (r * wo + ow) * c;
        std::int32_t* ao = am ? am + (r * wo + ow) * c : arg_buf.data();
        // Window pixels outside, channels inside: every load is a contiguous run of C values, and the
        // update is a branch-free select (values are random: a branch would mispredict half the time).
        std::fill(yo, yo + c, -std::numeric_limits<T>::infinity());
        std::fill(ao, ao + c, static_cast<std::int32_t>(hb * w + wb));
        for (std::int64_t hi = hb; hi < he; ++hi)
          for (std::int64_t wi = wb; wi < we; ++wi) {
            const T* xi = x + ((n * h + hi) * w + wi) * c;
            const auto pos = static_cast<std::int32_t>(hi * w + wi);
            for (std::int64_t k = 0; k < c; ++k) {
              const T v = xi[k], best = yo[k];
              const bool take = (v > best) | ((v != v) & (best == best));  // first NaN wins and stays
              yo[k] = take ? v : best;
              ao[k] = take ? pos : ao[k];
            }
          }
      }
    }
  });
}

template <class T>
void max_pool2d_backward(const Exec<Cpu>& exec, const MaxPool2dBackwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t hw = a.dx.dim(1) * a.dx.dim(2), c = a.dx.dim(3), pout = a.dy.dim(1) * a.dy.dim(2);
  const T* dy = a.dy.data();
  const std::int32_t* am = a.argmax.data();
  T* dx = a.dx.data();
  parallel_for(exec, a.dx.dim(0), 1, [&](std::int64_t n0, std::int64_t n1, int) {
    std::fill(dx + n0 * hw * c, dx + n1 * hw * c, T(0));
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t p = 0; p < pout; ++p) {
        const std::int64_t o = (n * pout + p) * c;
        for (std::int64_t k = 0; k < c; ++k) dx[(n * hw + am[o + k]) * c + k] += dy[o + k];
      }
  });
}

namespace detail {
inline std::int64_t pool_start(std::int64_t i, std::int64_t in, std::int64_t out) { return (i * in) / out; }
inline std::int64_t pool_end(std::int64_t i, std::int64_t in, std::int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}
}  // namespace detail

template <class T>
void adaptive_avg_pool2d_forward(const Exec<Cpu>& exec, const AdaptiveAvgPool2dForwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t h = a.x.dim(1), w = a.x.dim(2), c = a.x.dim(3), ho = a.y.dim(1), wo = a.y.dim(2);
  const T* x = a.x.data();
  T* y = a.y.data();
  parallel_for(exec, a.x.dim(0), 1, [&](std::int64_t n0, std::int64_t n1, int) {
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t i = 0; i < ho; ++i)
        for (std::int64_t j = 0; j < wo; ++j) {
          const std::int64_t hb = detail::pool_start(i, h, ho), he = detail::pool_end(i, h, ho);
          const std::int64_t wb = detail::pool_start(j, w, wo), we = detail::pool_end(j, w, wo);
          T* yo = y + ((n * ho + i) * wo + j) * c;
          std::fill(yo, yo + c, T(0));
          for (std::int64_t hi = hb; hi < he; ++hi)
            for (std::int64_t wi = wb; wi < we; ++wi) {
              const T* xi = x + ((n * h + hi) * w + wi) * c;
              for (std::int64_t k = 0; k < c; ++k) yo[k] += xi[k];
            }
          const T inv = T(1) / static_cast<T>((he - hb) * (we - wb));
          for (std::int64_t k = 0; k < c; ++k) yo[k] *= inv;
        }
  });
}

template <class T>
void adaptive_avg_pool2d_backward(const Exec<Cpu>& exec, const AdaptiveAvgPool2dBackwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t h = a.dx.dim(1), w = a.dx.dim(2), c = a.dx.dim(3), ho = a.dy.dim(1), wo = a.dy.dim(2);
  const T* dy = a.dy.data();
  T* dx = a.dx.data();
  parallel_for(exec, a.dx.dim(0), 1, [&](std::int64_t n0, std::int64_t n1, int) {
    std::fill(dx + n0 * h * w * c, dx + n1 * h * w * c, T(0));
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t i = 0; i < ho; ++i)
        for (std::int64_t j = 0; j < wo; ++j) {
          const std::int64_t hb = detail::pool_start(i, h, ho), he = detail::pool_end(i, h, ho);
          const std::int64_t wb = detail::pool_start(j, w, wo), we = detail::pool_end(j, w, wo);
          const T* g = dy + ((n * ho + i) * wo + j) * c;
          const T inv = T(1) / static_cast<T>((he - hb) * (we - wb));
          for (std::int64_t hi = hb; hi < he; ++hi)
            for (std::int64_t wi = wb; wi < we; ++wi) {
              T* d = dx + ((n * h + hi) * w + wi) * c;
              for (std::int64_t k = 0; k < c; ++k) d[k] += g[k] * inv;
            }
        }
  });
}

}  // namespace ddp::kernels::cpu
