// CPU pooling in NHWC: max-pool (any kernel/stride/padding, argmax kept for backward) and adaptive
// average pool.
// SPDX-License-Identifier: MIT
//
// Max-pool: output (ho, wo, c) is the maximum of x over rows [ho*sh - ph, +kh) and columns [wo*sw -
// pw, +kw) clipped to the image (padding acts as -infinity, as in PyTorch); argmax stores hi * W +
// wi of the first maximum in row-major window order (PyTorch's tie rule), and a NaN wins over
// numbers (PyTorch propagates it). Backward scatters dy to dx[argmax]. Example: ResNet's stem pool,
// kernel 3, stride 2, padding 1, maps 112x112 to 56x56; output (0, 0) looks at input rows and
// columns {0, 1} only. Adaptive average pool: output cell (i, j) averages rows [floor(i H / Ho),
// ceil((i + 1) H / Ho)) and the like for columns; backward spreads dy / cell_size over the cell
// (cells may overlap: contributions add). Images are spread over threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/geometry.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
void max_pool2d_forward(const Exec<Cpu>& exec, const MaxPool2dForwardArgs<T, Cpu>& a) {
  validate(a);
  const PoolGeometry g = pool_geometry(a.x, a.y, a.kernel, a.stride, a.padding);
  const T* x = a.x.data();
  T* y = a.y.data();
  std::int32_t* am = a.argmax.empty() ? nullptr : a.argmax.data();
  parallel_for(exec, g.n * g.ho, 1, [&](std::int64_t r0, std::int64_t r1, int) {
    std::vector<std::int32_t> arg_buf(static_cast<std::size_t>(g.c));
    for (std::int64_t r = r0; r < r1; ++r) {  // r = n * ho + oh: one output row
      const std::int64_t n = r / g.ho, oh = r % g.ho;
      const std::int64_t h0 = oh * g.stride.h - g.pad.h;
      const std::int64_t hb = std::max<std::int64_t>(h0, 0), he = std::min(h0 + g.kernel.h, g.h);
      for (std::int64_t ow = 0; ow < g.wo; ++ow) {
        const std::int64_t w0 = ow * g.stride.w - g.pad.w;
        const std::int64_t wb = std::max<std::int64_t>(w0, 0), we = std::min(w0 + g.kernel.w, g.w);
        T* yo = y + (r * g.wo + ow) * g.c;
        std::int32_t* ao = am ? am + (r * g.wo + ow) * g.c : arg_buf.data();
        // Window pixels outside, channels inside: every load is a contiguous run of C values, and
        // the update is a branch-free select (values are random: a branch would mispredict half the
        // time).
        std::fill(yo, yo + g.c, -std::numeric_limits<T>::infinity());
        std::fill(ao, ao + g.c, static_cast<std::int32_t>(hb * g.w + wb));
        for (std::int64_t hi = hb; hi < he; ++hi)
          for (std::int64_t wi = wb; wi < we; ++wi) {
            const T* xi = x + ((n * g.h + hi) * g.w + wi) * g.c;
            const auto pos = static_cast<std::int32_t>(hi * g.w + wi);
            for (std::int64_t k = 0; k < g.c; ++k) {
              const T v = xi[k], best = yo[k];
              // first NaN wins and stays
              const bool take = (v > best) | ((v != v) & (best == best));
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
  const PoolGeometry g = pool_geometry(a.dx, a.dy, a.kernel, a.stride, a.padding);
  const std::int64_t hw = g.h * g.w, pout = g.ho * g.wo;
  const T* dy = a.dy.data();
  const std::int32_t* am = a.argmax.data();
  T* dx = a.dx.data();
  parallel_for(exec, g.n, 1, [&](std::int64_t n0, std::int64_t n1, int) {
    std::fill(dx + n0 * hw * g.c, dx + n1 * hw * g.c, T(0));
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t p = 0; p < pout; ++p) {
        const std::int64_t o = (n * pout + p) * g.c;
        for (std::int64_t k = 0; k < g.c; ++k) dx[(n * hw + am[o + k]) * g.c + k] += dy[o + k];
      }
  });
}

template <class T>
void adaptive_avg_pool2d_forward(const Exec<Cpu>& exec,
                                 const AdaptiveAvgPool2dForwardArgs<T, Cpu>& a) {
  validate(a);
  const PoolGeometry g = pool_geometry(a.x, a.y);
  const T* x = a.x.data();
  T* y = a.y.data();
  parallel_for(exec, g.n, 1, [&](std::int64_t n0, std::int64_t n1, int) {
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t i = 0; i < g.ho; ++i)
        for (std::int64_t j = 0; j < g.wo; ++j) {
          const std::int64_t hb = pool_start(i, g.h, g.ho), he = pool_end(i, g.h, g.ho);
          const std::int64_t wb = pool_start(j, g.w, g.wo), we = pool_end(j, g.w, g.wo);
          T* yo = y + ((n * g.ho + i) * g.wo + j) * g.c;
          std::fill(yo, yo + g.c, T(0));
          for (std::int64_t hi = hb; hi < he; ++hi)
            for (std::int64_t wi = wb; wi < we; ++wi) {
              const T* xi = x + ((n * g.h + hi) * g.w + wi) * g.c;
              for (std::int64_t k = 0; k < g.c; ++k) yo[k] += xi[k];
            }
          const T inv = T(1) / static_cast<T>((he - hb) * (we - wb));
          for (std::int64_t k = 0; k < g.c; ++k) yo[k] *= inv;
        }
  });
}

template <class T>
void adaptive_avg_pool2d_backward(const Exec<Cpu>& exec,
                                  const AdaptiveAvgPool2dBackwardArgs<T, Cpu>& a) {
  validate(a);
  const PoolGeometry g = pool_geometry(a.dx, a.dy);
  const T* dy = a.dy.data();
  T* dx = a.dx.data();
  parallel_for(exec, g.n, 1, [&](std::int64_t n0, std::int64_t n1, int) {
    std::fill(dx + n0 * g.h * g.w * g.c, dx + n1 * g.h * g.w * g.c, T(0));
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t i = 0; i < g.ho; ++i)
        for (std::int64_t j = 0; j < g.wo; ++j) {
          const std::int64_t hb = pool_start(i, g.h, g.ho), he = pool_end(i, g.h, g.ho);
          const std::int64_t wb = pool_start(j, g.w, g.wo), we = pool_end(j, g.w, g.wo);
          const T* dyo = dy + ((n * g.ho + i) * g.wo + j) * g.c;
          const T inv = T(1) / static_cast<T>((he - hb) * (we - wb));
          for (std::int64_t hi = hb; hi < he; ++hi)
            for (std::int64_t wi = wb; wi < we; ++wi) {
              T* d = dx + ((n * g.h + hi) * g.w + wi) * g.c;
              for (std::int64_t k = 0; k < g.c; ++k) d[k] += dyo[k] * inv;
            }
        }
  });
}

}  // namespace ddp::kernels::cpu
