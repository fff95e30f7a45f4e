// CPU conv2d forward, backward-data and backward-weight in NHWC/KRSC via im2col + GEMM.
// SPDX-License-Identifier: MIT
//
// With x (N, H, W, C) and w (K, R, S, C), one image's conv is
//   y_n (P x K) = col_n (P x RSC) * w^T (RSC x K),    P = H_out * W_out, RSC = R * S * C
// where col_n[p][(r * S + s) * C + c] = x[n][ho*sh - ph + r*dh][wo*sw - pw + s*dw][c] (0 outside
// the image), p = (ho, wo). Gradients are the two other products:
//   dcol_n (P x RSC) = dy_n (P x K) * w (K x RSC), then col2im adds dcol_n back onto dx_n's pixels
//   dw (K x RSC)    += dy_n^T (K x P) * col_n (P x RSC)
// A 1x1 stride-1 unpadded conv needs no col: x itself is (N*P x C), one GEMM for the batch. col is
// built a block of rows at a time (col_block_rows) so it stays in cache between im2col and GEMM. A
// block is rows n * P + p of the batch's col, so it spans images where P is small (ResNet-18's
// layer4 at 32 px has P = 1: one 64-row block reads the 9 MiB weight once, not once per image).
// y and dy are (N*P x K) row-major, so a block's rows of them are contiguous too.
// Threads: with N >= threads each thread takes a contiguous block of images with its own col and
// partial dw (summed in block order, so results do not depend on timing); with fewer images the
// images run in turn and each GEMM is split across threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/gemm.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/geometry.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels::cpu {

namespace detail {

// Rows [r0, r1) of the batch's col (N*P x RSC) from x (N, H, W, C), stored from col's row 0: row r
// is image r / P's output pixel r % P.
template <class T>
void im2col(const ConvGeometry& g, const T* x, T* col, std::int64_t r0, std::int64_t r1) {
  const std::int64_t rsc = g.rsc(), pp = g.p(), in_img = g.h * g.w * g.c;
  for (std::int64_t row_i = r0; row_i < r1; ++row_i) {
    const std::int64_t p = row_i % pp, ho = p / g.wo, wo = p % g.wo;
    const T* xn = x + (row_i / pp) * in_img;
    T* row = col + (row_i - r0) * rsc;
    for (std::int64_t r = 0; r < g.r; ++r) {
      const std::int64_t hi = ho * g.stride.h - g.pad.h + r * g.dil.h;
      for (std::int64_t s = 0; s < g.s; ++s) {
        const std::int64_t wi = wo * g.stride.w - g.pad.w + s * g.dil.w;
        T* dst = row + (r * g.s + s) * g.c;
        if (hi < 0 || hi >= g.h || wi < 0 || wi >= g.w) {
          for (std::int64_t c = 0; c < g.c; ++c) dst[c] = T(0);
        } else {
          const T* src = xn + (hi * g.w + wi) * g.c;
          // a loop, not memcpy: C is 3 in the stem
          for (std::int64_t c = 0; c < g.c; ++c) dst[c] = src[c];
        }
      }
    }
  }
}

// dx (N, H, W, C) += dcol's rows [r0, r1) of the batch (stored from row 0), each entry added at the
// pixel it was read from.
template <class T>
void col2im_add(const ConvGeometry& g, const T* dcol, T* dx, std::int64_t r0, std::int64_t r1) {
  const std::int64_t rsc = g.rsc(), pp = g.p(), in_img = g.h * g.w * g.c;
  for (std::int64_t row_i = r0; row_i < r1; ++row_i) {
    const std::int64_t p = row_i % pp, ho = p / g.wo, wo = p % g.wo;
    T* dxn = dx + (row_i / pp) * in_img;
    const T* row = dcol + (row_i - r0) * rsc;
    for (std::int64_t r = 0; r < g.r; ++r) {
      const std::int64_t hi = ho * g.stride.h - g.pad.h + r * g.dil.h;
      if (hi < 0 || hi >= g.h) continue;
      for (std::int64_t s = 0; s < g.s; ++s) {
        const std::int64_t wi = wo * g.stride.w - g.pad.w + s * g.dil.w;
        if (wi < 0 || wi >= g.w) continue;
        const T* src = row + (r * g.s + s) * g.c;
        T* dst = dxn + (hi * g.w + wi) * g.c;
        for (std::int64_t c = 0; c < g.c; ++c) dst[c] += src[c];
      }
    }
  }
}

// Rows of col per block, out of `rows` (an image block's N*P): about 1 MiB, >= 64 rows for the
// GEMM. 128 KiB to 2 MiB blocks measured alike and 5-20 % faster than whole-image col (7 MiB for
// ResNet's 56x56 3x3 layers).
template <class T>
std::int64_t col_block_rows(const ConvGeometry& g, std::int64_t rows) {
  constexpr std::int64_t kColBlockBytes = std::int64_t{1} << 20;
  const std::int64_t fit = kColBlockBytes / (g.rsc() * static_cast<std::int64_t>(sizeof(T)));
  return std::min(rows, std::max<std::int64_t>(fit, 64));
}

// Calls f(n_begin, n_end, chunk, parallel_gemm) over the images: blocks of images per thread when
// there are enough images, else one block with GEMMs split across threads. Returns the block count.
template <class F>
int for_image_blocks(const Exec<Cpu>& exec, std::int64_t n, F&& f) {
  const int t = num_threads(exec);
  if (n >= t && t > 1) {
    const int chunks = static_cast<int>(std::min<std::int64_t>(t, n));
    parallel_for(exec, n, 1,
                 [&](std::int64_t b, std::int64_t e, int chunk) { f(b, e, chunk, false); });
    return chunks;
  }
  f(std::int64_t{0}, n, 0, t > 1);
  return 1;
}

// One GEMM either split across exec's threads or on the calling thread.
template <class T>
void gemm_on(bool parallel, const Exec<Cpu>& exec, Trans ta, Trans tb, std::int64_t m,
             std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, const T* b,
             std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  if (parallel)
    gemm(exec, ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
  else
    gemm_serial(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

}  // namespace detail

template <class T>
void conv2d_forward(const Exec<Cpu>& exec, const Conv2dForwardArgs<T, Cpu>& a) {
  validate(a);
  const ConvGeometry g = conv_geometry(a.x, a.w, a.stride, a.padding, a.dilation);
  const std::int64_t p = g.p(), rsc = g.rsc();
  const T* w = a.w.data();
  if (g.pointwise()) {  // y (N*P x K) = x (N*P x C) * w^T: one GEMM for the batch
    gemm(exec, Trans::No, Trans::Yes, g.n * p, g.k, g.c, T(1), a.x.data(), g.c, w, g.c, T(0),
         a.y.data(), g.k);
  } else {
    detail::for_image_blocks(exec, g.n, [&](std::int64_t n0, std::int64_t n1, int, bool par) {
      const std::int64_t end = n1 * p, pb = detail::col_block_rows<T>(g, end - n0 * p);
      std::vector<T> col(static_cast<std::size_t>(pb * rsc));
      // y_b (rows x K) = col_b (rows x RSC) * w^T
      for (std::int64_t r0 = n0 * p; r0 < end; r0 += pb) {
        const std::int64_t r1 = std::min(end, r0 + pb);
        detail::im2col(g, a.x.data(), col.data(), r0, r1);
        detail::gemm_on(par, exec, Trans::No, Trans::Yes, r1 - r0, g.k, rsc, col.data(), rsc, w,
                        rsc, T(0), a.y.data() + r0 * g.k, g.k);
      }
    });
  }
  if (!a.bias.empty()) {
    const T* b = a.bias.data();
    T* y = a.y.data();
    parallel_for(exec, g.n * p, 1024, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t k = 0; k < g.k; ++k) y[r * g.k + k] += b[k];
    });
  }
}

template <class T>
void conv2d_backward(const Exec<Cpu>& exec, const Conv2dBackwardArgs<T, Cpu>& a) {
  validate(a);
  if (a.accumulate_dx && !a.dx.empty()) {
    // Computed apart, then added: a GEMM with beta = 1 would change the rounding, and the residual
    // block's gradients must stay bit for bit those of the separate add (docs/decisions/0061).
    Tensor<T, Cpu> part(a.dx.shape());
    Conv2dBackwardArgs<T, Cpu> b = a;
    b.dx = part.view();
    b.accumulate_dx = false;
    conv2d_backward(exec, b);
    T* dx = a.dx.data();
    const T* p = part.data();
    parallel_for(exec, a.dx.numel(), 1 << 14, [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) dx[i] += p[i];
    });
    return;
  }
  const ConvGeometry g = conv_geometry(a.x, a.w, a.stride, a.padding, a.dilation);
  const std::int64_t p = g.p(), rsc = g.rsc(), in_img = g.h * g.w * g.c;
  const T* w = a.w.data();
  const T* dy = a.dy.data();
  const bool want_dx = !a.dx.empty(), want_dw = !a.dw.empty();
  if (g.pointwise()) {
    if (want_dx)  // dx (N*P x C) = dy (N*P x K) * w (K x C)
      gemm(exec, Trans::No, Trans::No, g.n * p, g.c, g.k, T(1), dy, g.k, w, g.c, T(0), a.dx.data(),
           g.c);
    if (want_dw)  // dw (K x C) = dy^T (K x N*P) * x (N*P x C)
      gemm(exec, Trans::Yes, Trans::No, g.k, g.c, g.n * p, T(1), dy, g.k, a.x.data(), g.c, T(0),
           a.dw.data(), g.c);
  } else if (want_dx || want_dw) {
    // dw of image blocks 1.. (block 0 writes a.dw), summed in block order.
    std::vector<std::vector<T>> partial(
        static_cast<std::size_t>(std::max(num_threads(exec) - 1, 0)));
    const int blocks = detail::for_image_blocks(
        exec, g.n, [&](std::int64_t n0, std::int64_t n1, int chunk, bool par) {
          const std::int64_t end = n1 * p, pb = detail::col_block_rows<T>(g, end - n0 * p);
          std::vector<T> col(static_cast<std::size_t>(pb * rsc));
          T* dw = nullptr;
          if (want_dw) {
            if (chunk == 0) {
              dw = a.dw.data();
            } else {
              auto& part = partial[static_cast<std::size_t>(chunk - 1)];
              part.assign(static_cast<std::size_t>(g.k * rsc), T(0));
              dw = part.data();
            }
          }
          if (want_dx) std::fill(a.dx.data() + n0 * in_img, a.dx.data() + n1 * in_img, T(0));
          for (std::int64_t r0 = n0 * p; r0 < end; r0 += pb) {
            const std::int64_t r1 = std::min(end, r0 + pb), rows = r1 - r0;
            const T* dyb = dy + r0 * g.k;
            if (want_dw) {  // dw (K x RSC) += dy_b^T (K x rows) * col_b (rows x RSC)
              detail::im2col(g, a.x.data(), col.data(), r0, r1);
              const T beta = r0 == n0 * p ? T(0) : T(1);
              detail::gemm_on(par, exec, Trans::Yes, Trans::No, g.k, rsc, rows, dyb, g.k,
                              col.data(), rsc, beta, dw, rsc);
            }
            // col is free again: dcol_b (rows x RSC) = dy_b (rows x K) * w (K x RSC)
            if (want_dx) {
              detail::gemm_on(par, exec, Trans::No, Trans::No, rows, rsc, g.k, dyb, g.k, w, rsc,
                              T(0), col.data(), rsc);
              detail::col2im_add(g, col.data(), a.dx.data(), r0, r1);
            }
          }
        });
    if (want_dw && blocks > 1) {
      T* dw = a.dw.data();
      parallel_for(exec, g.k * rsc, 4096, [&](std::int64_t i0, std::int64_t i1, int) {
        for (int b = 1; b < blocks; ++b) {
          const T* part = partial[static_cast<std::size_t>(b - 1)].data();
          for (std::int64_t i = i0; i < i1; ++i) dw[i] += part[i];
        }
      });
    }
  }
  if (!a.dbias.empty()) {  // dbias[k] = sum over the N*P rows of dy
    T* db = a.dbias.data();
    std::fill(db, db + g.k, T(0));
    for (std::int64_t r = 0; r < g.n * p; ++r)
      for (std::int64_t k = 0; k < g.k; ++k) db[k] += dy[r * g.k + k];
  }
}

}  // namespace ddp::kernels::cpu
