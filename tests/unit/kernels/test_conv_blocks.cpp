// kernels: conv2d on images large enough that col is built in several row blocks, against direct loops.
// SPDX-License-Identifier: MIT
//
// The finite-difference tests use small images (one col block). Here x is (3, 41, 37, 64) in double with
// 3x3 weights: RSC = 576, so a 1 MiB col block holds 227 rows of the batch's 3 x 1517 (stride 1): 21 blocks,
// most of them reaching into the next image, the last one partial. Then the other extreme, ResNet's layer4 at
// small input: x (37, 2, 1, 64), P = 2 at stride 1 and 1 at stride 2, so one block holds many images (a
// thread's 18 or 19 images at 2 threads). The expectation is the textbook 7-loop convolution and its two
// gradients.
#include <doctest/doctest.h>

#include <cmath>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

using ddp::Cpu;
using ddp::Exec;
using ddp::Tensor;
namespace kn = ddp::kernels;
using T64 = Tensor<double, Cpu>;

TEST_SUITE("kernels") {
  TEST_CASE("conv2d over many col blocks equals the direct convolution (forward, dx, dw)") {
    struct Case {
      std::int64_t n, h, w, c, k;
    };
    for (const Case shape : {Case{3, 41, 37, 64, 5}, Case{37, 2, 1, 64, 7}})
      for (std::int64_t stride : {1, 2}) {
        const std::int64_t n = shape.n, h = shape.h, w = shape.w, c = shape.c, k = shape.k, r = 3, s = 3;
        CAPTURE(n);
        CAPTURE(h);
        CAPTURE(stride);
        const std::int64_t pad = 1, ho = (h + 2 * pad - r) / stride + 1, wo = (w + 2 * pad - s) / stride + 1;
        auto x = T64::empty({n, h, w, c}), wt = T64::empty({k, r, s, c}), dy = T64::empty({n, ho, wo, k});
        ddp::Generator(1).fill_normal(x.view(), 0, 1);
        ddp::Generator(2).fill_normal(wt.view(), 0, 1);
        ddp::Generator(3).fill_normal(dy.view(), 0, 1);
        // direct loops, over raw NHWC / KRSC offsets (element access through operator() costs ~5x under ASan,
        // which made this reference most of unit_kernels' time)
        auto y_ref = T64::zeros({n, ho, wo, k}), dx_ref = T64::zeros(x.shape()), dw_ref = T64::zeros(wt.shape());
        const double *xp = x.data(), *wp = wt.data(), *dyp = dy.data();
        double *yp = y_ref.data(), *dxp = dx_ref.data(), *dwp = dw_ref.data();
        for (std::int64_t b = 0; b < n; ++b)
          for (std::int64_t oh = 0; oh < ho; ++oh)
            for (std::int64_t ow = 0; ow < wo; ++ow)
              for (std::int64_t o = 0; o < k; ++o)
                for (std::int64_t i = 0; i < r; ++i)
                  for (std::int64_t j = 0; j < s; ++j) {
                    const std::int64_t hi = oh * stride - pad + i, wi = ow * stride - pad + j;
                    if (hi < 0 || hi >= h || wi < 0 || wi >= w) continue;
                    const std::int64_t yo = ((b * ho + oh) * wo + ow) * k + o, xo = ((b * h + hi) * w + wi) * c,
                                       wo_ = ((o * r + i) * s + j) * c;
                    double acc = 0;
                    for (std::int64_t q = 0; q < c; ++q) {
                      acc += xp[xo + q] * wp[wo_ + q];
                      dxp[xo + q] += dyp[yo] * wp[wo_ + q];
                      dwp[wo_ + q] += dyp[yo] * xp[xo + q];
                    }
                    yp[yo] += acc;
                  }
        for (int threads : {1, 2}) {
          CAPTURE(threads);
          kn::cpu::ThreadPool pool(threads);
          Exec<Cpu> e{.pool = &pool};
          auto y = T64::empty(y_ref.shape()), dx = T64::empty(x.shape()), dw = T64::empty(wt.shape());
          ddp::Kernels<Cpu>::conv2d_forward(
              e, kn::Conv2dForwardArgs<double, Cpu>{
                     .x = x.view(), .w = wt.view(), .y = y.view(), .stride = {stride, stride}, .padding = {pad, pad}});
          ddp::Kernels<Cpu>::conv2d_backward(e, kn::Conv2dBackwardArgs<double, Cpu>{.x = x.view(),
                                                                                    .w = wt.view(),
                                                                                    .dy = dy.view(),
                                                                                    .dx = dx.view(),
                                                                                    .dw = dw.view(),
                                                                                    .stride = {stride, stride},
                                                                                    .padding = {pad, pad}});
          double ey = 0, edx = 0, edw = 0;
          for (std::int64_t i = 0; i < y.numel(); ++i) ey = std::max(ey, std::abs(y.data()[i] - y_ref.data()[i]));
          for (std::int64_t i = 0; i < dx.numel(); ++i) edx = std::max(edx, std::abs(dx.data()[i] - dx_ref.data()[i]));
          for (std::int64_t i = 0; i < dw.numel(); ++i) edw = std::max(edw, std::abs(dw.data()[i] - dw_ref.data()[i]));
          CHECK(ey < 1e-10);
          CHECK(edx < 1e-10);
          CHECK(edw < 1e-9);
        }
      }
  }
}
