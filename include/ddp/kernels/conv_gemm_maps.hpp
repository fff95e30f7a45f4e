// The implicit-GEMM operand maps of conv2d: forward, backward-data (split by stride phase) and
// backward-weight as C = A B problems whose operands are read straight from the NHWC/KRSC tensors.
// Host- and device-callable: kernels/cuda/conv2d.cuh runs them in its tiled kernels, and the unit
// tests check every index formula on the host against the CPU conv.
// SPDX-License-Identifier: MIT
//
// A problem P has m_size() x n_size() outputs and a k_size() reduction; a(m, k) and b(k, n) give
// the operand elements (0 where the window leaves the image) and store(m, n, v) writes the result:
//   fprop  y  (N*P x K) = col (N*P x RSC) * w^T (RSC x K)    col(m, (r,s,c)) = x at the window
//   wgrad  dw (K x RSC) = dy^T (K x N*P) * col (N*P x RSC)
//   dgrad  one problem per stride phase (dgrad_phases): the dx pixels h = qh + i*sh,
//          w = qw + j*sw of phase (qh, qw) receive only from taps r with (qh + ph - r*dh)
//          divisible by sh (likewise s), a progression r0, r0 + rstep, ... of rcount taps. So
//            dx_q (N*Hq*Wq x C) = dyc_q (N*Hq*Wq x rcount*scount*K) * wt_q (rcount*scount*K x C)
//          with no product by a tap that cannot reach the pixel. Walking all R*S taps per pixel
//          would multiply by zero in 3/4 of the products of a stride-2 conv: about 1 TFLOP per
//          ResNet-50 training step at batch 256.
// Example: a 3x3 stride-2 pad-1 conv: phase qh = 0 takes r = 1 only, qh = 1 takes r = 0 and 2, so
// 2.25 of the 9 taps per pixel. A 1x1 stride-2 unpadded conv: phase (0, 0) takes the one tap, the
// other three phases none (their dx pixels are 0).
#pragma once

#include <cstdint>
#include <vector>

#include "ddp/config.hpp"
#include "ddp/kernels/geometry.hpp"

namespace ddp::kernels {

// col(m, j) of the batch: x under output pixel m = (img, ho, wo) at window position j = (r, s, c),
// 0 outside the image. fprop's A and wgrad's B.
template <class T>
DDP_HOST_DEVICE T col_value(const T* x, const ConvGeometry& g, std::int64_t m, std::int64_t j) {
  const std::int64_t p = g.ho * g.wo, img = m / p, pi = m % p, ho = pi / g.wo, wo = pi % g.wo;
  const std::int64_t r = j / (g.s * g.c), rem = j % (g.s * g.c), s = rem / g.c, c = rem % g.c;
  const std::int64_t hi = ho * g.stride.h - g.pad.h + r * g.dil.h,
                     wi = wo * g.stride.w - g.pad.w + s * g.dil.w;
  if (hi < 0 || hi >= g.h || wi < 0 || wi >= g.w) return T(0);
  return x[((img * g.h + hi) * g.w + wi) * g.c + c];
}

template <class T>
struct ConvFpropMap {
  const T* x;
  const T* w;
  const T* bias;  // nullptr: none
  T* y;
  ConvGeometry g;
  DDP_HOST_DEVICE std::int64_t m_size() const { return g.n * g.ho * g.wo; }
  DDP_HOST_DEVICE std::int64_t n_size() const { return g.k; }
  DDP_HOST_DEVICE std::int64_t k_size() const { return g.r * g.s * g.c; }
  DDP_HOST_DEVICE T a(std::int64_t m, std::int64_t kk) const { return col_value(x, g, m, kk); }
  DDP_HOST_DEVICE T b(std::int64_t kk, std::int64_t n) const { return w[n * k_size() + kk]; }
  DDP_HOST_DEVICE void store(std::int64_t m, std::int64_t n, T v) const {
    y[m * g.k + n] = bias ? v + bias[n] : v;
  }
};

// The `count` taps r0, r0 + step, ... of one axis that reach input positions q, q + stride, ...
struct TapProgression {
  std::int64_t r0 = 0, step = 1, count = 0;
};

// Taps r in [0, taps) with (q + pad - r * dil) divisible by stride.
inline TapProgression taps_reaching(std::int64_t q, std::int64_t taps, std::int64_t stride,
                                    std::int64_t pad, std::int64_t dil) {
  TapProgression t;
  for (std::int64_t r = 0; r < taps; ++r) {
    if (((q + pad - r * dil) % stride + stride) % stride != 0) continue;
    if (t.count == 0) t.r0 = r;
    if (t.count == 1) t.step = r - t.r0;
    ++t.count;
  }
  return t;
}

// One stride phase of dx: pixels h = qh + i*sh (i < nh), w = qw + j*sw (j < nw), and their taps.
struct DgradPhase {
  std::int64_t qh = 0, qw = 0, nh = 0, nw = 0;
  TapProgression th, tw;
  std::int64_t taps() const { return th.count * tw.count; }
};

// Every phase (qh < min(sh, H), qw < min(sw, W)) of g's dx; together they cover dx once.
inline std::vector<DgradPhase> dgrad_phases(const ConvGeometry& g) {
  std::vector<DgradPhase> out;
  for (std::int64_t qh = 0; qh < g.stride.h && qh < g.h; ++qh)
    for (std::int64_t qw = 0; qw < g.stride.w && qw < g.w; ++qw)
      out.push_back({.qh = qh,
                     .qw = qw,
                     .nh = (g.h - qh + g.stride.h - 1) / g.stride.h,
                     .nw = (g.w - qw + g.stride.w - 1) / g.stride.w,
                     .th = taps_reaching(qh, g.r, g.stride.h, g.pad.h, g.dil.h),
                     .tw = taps_reaching(qw, g.s, g.stride.w, g.pad.w, g.dil.w)});
  return out;
}

// dx of one phase. Rows m = (img, i, j); reduction kk = (ri, si, ko) over the taps
// r = th.r0 + ri * th.step, s = tw.r0 + si * tw.step and the K output channels. Divisibility holds
// by construction; the only test left is whether the output pixel lies inside dy.
template <class T>
struct ConvDgradPhaseMap {
  const T* dy;
  const T* w;
  T* dx;
  ConvGeometry g;
  DgradPhase q;
  bool accumulate = false;  // dx += v (Conv2dBackwardArgs::accumulate_dx) instead of dx = v
  DDP_HOST_DEVICE std::int64_t m_size() const { return g.n * q.nh * q.nw; }
  DDP_HOST_DEVICE std::int64_t n_size() const { return g.c; }
  DDP_HOST_DEVICE std::int64_t k_size() const { return q.th.count * q.tw.count * g.k; }
  // Row m's dx pixel (image, h, w) and reduction index kk's tap (r, s) and output channel.
  struct Pixel {
    std::int64_t img, h, w;
  };
  struct Tap {
    std::int64_t r, s, ko;
  };
  DDP_HOST_DEVICE Pixel pixel(std::int64_t m) const {
    const std::int64_t per = q.nh * q.nw, pi = m % per;
    return {m / per, q.qh + (pi / q.nw) * g.stride.h, q.qw + (pi % q.nw) * g.stride.w};
  }
  DDP_HOST_DEVICE Tap tap(std::int64_t kk) const {
    const std::int64_t sk = q.tw.count * g.k, rem = kk % sk;
    return {q.th.r0 + (kk / sk) * q.th.step, q.tw.r0 + (rem / g.k) * q.tw.step, rem % g.k};
  }
  DDP_HOST_DEVICE T a(std::int64_t m, std::int64_t kk) const {
    const Pixel x = pixel(m);
    const Tap t = tap(kk);
    const std::int64_t th = x.h + g.pad.h - t.r * g.dil.h, tw = x.w + g.pad.w - t.s * g.dil.w;
    if (th < 0 || tw < 0) return T(0);
    const std::int64_t ho = th / g.stride.h, wo = tw / g.stride.w;
    if (ho >= g.ho || wo >= g.wo) return T(0);
    return dy[((x.img * g.ho + ho) * g.wo + wo) * g.k + t.ko];
  }
  DDP_HOST_DEVICE T b(std::int64_t kk, std::int64_t c) const {
    const Tap t = tap(kk);
    return w[((t.ko * g.r + t.r) * g.s + t.s) * g.c + c];
  }
  DDP_HOST_DEVICE void store(std::int64_t m, std::int64_t c, T v) const {
    const Pixel x = pixel(m);
    T& d = dx[((x.img * g.h + x.h) * g.w + x.w) * g.c + c];
    d = accumulate ? d + v : v;
  }
};

template <class T>
struct ConvWgradMap {
  const T* x;
  const T* dy;
  T* dw;
  ConvGeometry g;
  DDP_HOST_DEVICE std::int64_t m_size() const { return g.k; }
  DDP_HOST_DEVICE std::int64_t n_size() const { return g.r * g.s * g.c; }
  DDP_HOST_DEVICE std::int64_t k_size() const { return g.n * g.ho * g.wo; }
  DDP_HOST_DEVICE T a(std::int64_t ko, std::int64_t np) const { return dy[np * g.k + ko]; }
  DDP_HOST_DEVICE T b(std::int64_t np, std::int64_t j) const { return col_value(x, g, np, j); }
  DDP_HOST_DEVICE void store(std::int64_t ko, std::int64_t j, T v) const {
    dw[ko * n_size() + j] = v;
  }
};

}  // namespace ddp::kernels
