// The native bf16-activation CUDA kernels (docs/decisions/0072: convs on cuBLAS and cuDNN with bf16 tensors,
// BatchNorm (+ReLU, +residual) and pooling loading and storing bf16) against their reference, Bf16Storage<Cuda>
// (kernels/bf16_storage.hpp: widen, the float kernel, round), on the same bf16 inputs.
// SPDX-License-Identifier: MIT
//
// Both compute the same float quantity from the same bf16 values (products of bf16 operands are exact in fp32) in
// different summation orders, then round it once to bf16 (u = 2^-8, nearest even). Two values v1, v2 with
// |v1 - v2| <= d round to r1, r2 with |r1 - r2| <= u (|v1| + |v2|) + d <= 2.01 u |r_ref| + 1.01 d. The float
// difference d is bounded by the arithmetic:
//   GEMM-shaped (conv): d <= 2 gamma(K + 1) sum |a b| per element, K the reduction length (taps x channels, or
//     N x output pixels for the weight gradient), sum |a b| measured as the reference op on |x|, |w|, |dy| (and
//     |dx| when accumulating), rounded up by 2u for its own bf16 store. The weight gradient is float on both sides
//     but cuDNN's is bf16 before it is widened: one more u |ref|.
//   BatchNorm: the statistics of both sides are within docs/decisions/0063's bounds of exact (mean ~4e-6 std,
//     variance 6e-5 relative; bf16's 8 values per load change the decomposition, not the bound), so invstd, y and
//     the backward's coefficients differ by at most ~1.2e-4 of their own magnitude: slack 1.5e-4 max|ref|.
//   Pooling: the same float operations in the same order: equal bits.
// Every case skips (exit 77) without a device.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <ddp/core/dtype.hpp>
#include <ddp/kernels/bf16_storage.hpp>
#include <ddp/kernels/fused_args.hpp>

#include "support/gpu.hpp"
#include "unit/kernels/cuda_compare.hpp"

namespace test_cuda_bf16_native {

using namespace ddp::test::cuda_kernels;  // NOLINT: test file
namespace kn = ddp::kernels;
using B = ddp::bfloat16;
using BS = kn::Bf16Storage<Cuda>;
constexpr double kU = 1.0 / 256.0;  // bf16's unit roundoff
constexpr double gamma_n(double n) { return n * 0x1p-24 / (1.0 - n * 0x1p-24); }

Tensor<B, Cpu> to_bf16(const Tensor<float, Cpu>& f) {
  Tensor<B, Cpu> out(f.shape());
  for (std::int64_t i = 0; i < f.numel(); ++i) out.data()[i] = B(f.data()[i]);
  return out;
}
template <class T>
Tensor<T, Cpu> abs_of(const Tensor<T, Cpu>& t) {
  Tensor<T, Cpu> out(t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) out.data()[i] = T(std::fabs(float(t.data()[i])));
  return out;
}
template <class T>
std::vector<double> host(Fixture& f, const Tensor<T, Cuda>& t) {
  const Tensor<T, Cpu> h = f.down(t);
  std::vector<double> out(static_cast<std::size_t>(h.numel()));
  for (std::int64_t i = 0; i < h.numel(); ++i) out[static_cast<std::size_t>(i)] = double(float(h.data()[i]));
  return out;
}
Tensor<B, Cuda> poisoned_bf16(Fixture& f, const Shape& s) {
  Tensor<B, Cuda> t(s);
  KC::fill(f.gpu, t.view(), B(std::numeric_limits<float>::quiet_NaN()));
  return t;
}
double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// |got_i - ref_i| <= rel |ref_i| + slack_i for every i (a NaN fails); reports the worst element. Returns whether
// any element differs at all (the native path ran and rounded somewhere on its own).
bool expect_within(const std::vector<double>& ref, const std::vector<double>& got, double rel,
                   const std::vector<double>& slack, const char* what) {
  REQUIRE(ref.size() == got.size());
  REQUIRE(slack.size() == ref.size());
  std::size_t worst = ref.size();
  double worst_ratio = 0.0;
  bool differs = false;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]), bound = rel * std::fabs(ref[i]) + slack[i];
    differs = differs || got[i] != ref[i];
    if (!(err <= bound) && (worst == ref.size() || !(err / bound <= worst_ratio))) {
      worst = i;
      worst_ratio = err / bound;
    }
  }
  INFO(what, ": worst element ", worst,
       worst < ref.size() ? " ref " + std::to_string(ref[worst]) + " got " + std::to_string(got[worst]) +
                                " bound " + std::to_string(rel * std::fabs(ref[worst]) + slack[worst])
                          : std::string());
  CHECK(worst == ref.size());
  return differs;
}
std::vector<double> uniform(std::size_t n, double v) { return std::vector<double>(n, v); }
std::vector<double> scaled(const std::vector<double>& m, double s) {
  std::vector<double> out(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) out[i] = s * m[i];
  return out;
}

struct ConvCase {
  std::int64_t n, h, w, c, k, r;
  kn::Size2 stride, pad, dil;
  bool accumulate;
  bool must_be_native;  // false: shapes cuDNN may have no bf16 algorithm for (3 channels, dilation): widening path
};

}  // namespace test_cuda_bf16_native

TEST_SUITE("kernels_cuda_bf16_native") {
  TEST_CASE("bf16 conv2d on cuBLAS and cuDNN matches the widening reference within its rounding") {
    if (ddp::test::skip_without_gpu()) return;
    using namespace test_cuda_bf16_native;
    for (const ConvCase& cs : {ConvCase{2, 7, 9, 24, 40, 1, {1, 1}, {0, 0}, {1, 1}, false, true},    // cuBLAS 1x1
                              ConvCase{2, 7, 9, 24, 40, 1, {1, 1}, {0, 0}, {1, 1}, true, true},     // + skip dx
                              ConvCase{2, 9, 8, 32, 16, 3, {1, 1}, {1, 1}, {1, 1}, true, true},     // cuDNN 3x3
                              ConvCase{2, 9, 11, 16, 32, 3, {2, 2}, {1, 1}, {1, 1}, false, true},   // strided
                              ConvCase{2, 9, 9, 32, 64, 1, {2, 2}, {0, 0}, {1, 1}, true, true},     // downsample
                              ConvCase{1, 10, 10, 16, 16, 3, {1, 1}, {2, 2}, {2, 2}, false, false},  // dilated
                              ConvCase{2, 16, 16, 3, 16, 7, {2, 2}, {3, 3}, {1, 1}, false, false}}) {  // stem
      Fixture f;
      const std::int64_t ho = kn::conv_out_size(cs.h, cs.r, cs.stride.h, cs.pad.h, cs.dil.h);
      const std::int64_t wo = kn::conv_out_size(cs.w, cs.r, cs.stride.w, cs.pad.w, cs.dil.w);
      INFO("seed ", f.seed, " x (", cs.n, ", ", cs.h, ", ", cs.w, ", ", cs.c, ") w (", cs.k, ", ", cs.r, ", ", cs.r,
           ", ", cs.c, ") stride ", cs.stride.h, " pad ", cs.pad.h, " dilation ", cs.dil.h, " accumulate ",
           cs.accumulate);
      const Shape xs{cs.n, cs.h, cs.w, cs.c}, ws{cs.k, cs.r, cs.r, cs.c}, ys{cs.n, ho, wo, cs.k};
      const Tensor<B, Cpu> x = to_bf16(f.random(xs, -2.0, 2.0)), dy = to_bf16(f.random(ys)),
                           dx0 = to_bf16(f.random(xs));
      const Tensor<float, Cpu> w = f.random(ws, -0.5, 0.5);
      const auto gx = f.up(x), gdy = f.up(dy), gxa = f.up(abs_of(x)), gdya = f.up(abs_of(dy));
      const auto gw = f.up(w), gwa = f.up(abs_of(w));

      // forward
      auto y = poisoned_bf16(f, ys), yref = poisoned_bf16(f, ys), ymag = poisoned_bf16(f, ys);
      const kn::Conv2dForwardArgs<float, Cuda, B> fa{.x = gx.cview(), .w = gw.cview(), .y = y.view(),
                                                     .stride = cs.stride, .padding = cs.pad, .dilation = cs.dil};
      const bool native = ddp::kernels::cuda::conv2d_bf16_native(f.gpu, fa);
      MESSAGE("forward native: ", native);
      if (cs.must_be_native) CHECK(native);
      KC::conv2d_forward(f.gpu, fa);
      auto ra = fa;
      ra.y = yref.view();
      BS::conv2d_forward(f.gpu, ra);
      ra.x = gxa.cview();
      ra.w = gwa.cview();
      ra.y = ymag.view();
      BS::conv2d_forward(f.gpu, ra);
      const double kf = static_cast<double>(cs.r * cs.r * cs.c);
      const bool fdiff = expect_within(host(f, yref), host(f, y), 2.01 * kU,
                                       scaled(host(f, ymag), 1.01 * 2.0 * gamma_n(kf + 1) * (1 + 2 * kU)), "y");

      // backward: dx (accumulating into dx0 or not) and dw
      auto dx = cs.accumulate ? f.up(dx0) : poisoned_bf16(f, xs);
      auto dxref = cs.accumulate ? f.up(dx0) : poisoned_bf16(f, xs);
      auto dxmag = cs.accumulate ? f.up(abs_of(dx0)) : poisoned_bf16(f, xs);
      auto dw = f.poisoned(ws), dwref = f.poisoned(ws), dwmag = f.poisoned(ws);
      const kn::Conv2dBackwardArgs<float, Cuda, B> ba{
          .x = gx.cview(), .w = gw.cview(), .dy = gdy.cview(), .dx = dx.view(), .dw = dw.view(),
          .stride = cs.stride, .padding = cs.pad, .dilation = cs.dil, .accumulate_dx = cs.accumulate};
      const bool bnative = ddp::kernels::cuda::conv2d_bf16_native(f.gpu, ba);
      MESSAGE("backward native: ", bnative);
      if (cs.must_be_native) CHECK(bnative);
      KC::conv2d_backward(f.gpu, ba);
      auto rb = ba;
      rb.dx = dxref.view();
      rb.dw = dwref.view();
      BS::conv2d_backward(f.gpu, rb);
      rb.x = gxa.cview();
      rb.w = gwa.cview();
      rb.dy = gdya.cview();
      rb.dx = dxmag.view();
      rb.dw = dwmag.view();
      BS::conv2d_backward(f.gpu, rb);
      const double kd = static_cast<double>(cs.r * cs.r * cs.k) + 1.0;  // taps x output channels (+ the skip)
      const double kw = static_cast<double>(cs.n * ho * wo);
      const bool ddiff = expect_within(host(f, dxref), host(f, dx), 2.01 * kU,
                                       scaled(host(f, dxmag), 1.01 * 2.0 * gamma_n(kd + 1) * (1 + 2 * kU)), "dx");
      (void)expect_within(host(f, dwref), host(f, dw), 1.01 * kU, scaled(host(f, dwmag), 2.02 * gamma_n(kw + 1)),
                          "dw");
      if (native && bnative) MESSAGE("y differs from the reference somewhere: ", fdiff, "; dx: ", ddiff);
    }
  }

  TEST_CASE("bf16 BatchNorm (+residual, +ReLU) forward and backward match the widening reference") {
    if (ddp::test::skip_without_gpu()) return;
    using namespace test_cuda_bf16_native;
    struct Case {
      bool training, residual, relu, fused;
      std::int64_t ch;  // 37: scalar loads; 64: 8 bf16 values per 16-byte load
    };
    for (const Case c : {Case{true, true, true, true, 37}, Case{true, true, true, true, 64},
                         Case{true, false, true, true, 64}, Case{true, false, false, false, 64},
                         Case{true, false, false, false, 37}, Case{false, true, true, true, 64},
                         Case{false, false, false, false, 37}}) {
      Fixture f;
      INFO("seed ", f.seed, " training ", c.training, " residual ", c.residual, " relu ", c.relu, " fused ", c.fused,
           " channels ", c.ch);
      const Shape xs{3, 7, 9, c.ch}, cs{c.ch};
      const auto x = f.up(to_bf16(f.random(xs, -2.0, 3.0))), res = f.up(to_bf16(f.random(xs))),
                 dy = f.up(to_bf16(f.random(xs)));
      const auto gamma = f.up(f.random(cs, 0.5, 1.5)), beta = f.up(f.random(cs));
      const Tensor<float, Cpu> rm0 = f.random(cs), rv0 = f.random(cs, 0.5, 2.0);
      struct Out {
        Tensor<B, Cuda> y, dx, dres;
        Tensor<float, Cuda> rm, rv, sm, si, dg, db;
      };
      const auto outs = [&] {
        return Out{poisoned_bf16(f, xs), poisoned_bf16(f, xs), poisoned_bf16(f, xs), f.up(rm0), f.up(rv0),
                   f.poisoned(cs), f.poisoned(cs), f.poisoned(cs), f.poisoned(cs)};
      };
      Out nat = outs(), ref = outs();
      const auto fwd = [&](Out& o) {
        return kn::BatchNormActForwardArgs<float, Cuda, B>{
            .bn = {.x = x.cview(), .gamma = gamma.cview(), .beta = beta.cview(), .running_mean = o.rm.view(),
                   .running_var = o.rv.view(), .y = o.y.view(), .save_mean = o.sm.view(),
                   .save_invstd = o.si.view(), .training = c.training},
            .residual = c.residual ? res.cview() : ddp::TensorView<const B, Cuda>(),
            .relu = c.relu};
      };
      if (c.fused) {
        KC::batchnorm_act_forward(f.gpu, fwd(nat));
        BS::batchnorm_act_forward(f.gpu, fwd(ref));
      } else {
        KC::batchnorm_forward(f.gpu, fwd(nat).bn);
        BS::batchnorm_forward(f.gpu, fwd(ref).bn);
      }
      constexpr double kStats = 1.5e-4;  // see the header comment
      const auto yr = host(f, ref.y);
      (void)expect_within(yr, host(f, nat.y), 2.01 * kU, uniform(yr.size(), kStats * max_abs(yr)), "y");
      for (const auto& [r, g, what] : {std::tuple{&ref.sm, &nat.sm, "save_mean"}, std::tuple{&ref.si, &nat.si, "save_invstd"},
                                std::tuple{&ref.rm, &nat.rm, "running_mean"},
                                std::tuple{&ref.rv, &nat.rv, "running_var"}}) {
        const auto rv = host(f, *r);
        (void)expect_within(rv, host(f, *g), kStats, uniform(rv.size(), kStats * max_abs(rv)), what);
      }
      if (!c.training) continue;

      // Backward on common inputs (the reference's y and statistics).
      const auto bwd = [&](Out& o) {
        return kn::BatchNormActBackwardArgs<float, Cuda, B>{
            .bn = {.x = x.cview(), .dy = dy.cview(), .gamma = gamma.cview(), .save_mean = ref.sm.cview(),
                   .save_invstd = ref.si.cview(), .dx = o.dx.view(), .dgamma = o.dg.view(), .dbeta = o.db.view(),
                   .training = true},
            .y = ref.y.cview(),
            .dresidual = c.residual ? o.dres.view() : ddp::TensorView<B, Cuda>(),
            .relu = c.relu};
      };
      if (c.fused) {
        KC::batchnorm_act_backward(f.gpu, bwd(nat));
        BS::batchnorm_act_backward(f.gpu, bwd(ref));
      } else {
        KC::batchnorm_backward(f.gpu, bwd(nat).bn);
        BS::batchnorm_backward(f.gpu, bwd(ref).bn);
      }
      const auto dxr = host(f, ref.dx);
      (void)expect_within(dxr, host(f, nat.dx), 2.01 * kU, uniform(dxr.size(), kStats * max_abs(dxr)), "dx");
      for (const auto& [r, g, what] : {std::tuple{&ref.dg, &nat.dg, "dgamma"}, std::tuple{&ref.db, &nat.db, "dbeta"}}) {
        const auto rv = host(f, *r);
        (void)expect_within(rv, host(f, *g), kStats, uniform(rv.size(), kStats * max_abs(rv)), what);
      }
      if (c.residual) {  // dy where y > 0, else 0: no arithmetic, the same bits
        const auto dr = host(f, ref.dres);
        CHECK(host(f, nat.dres) == dr);
      }
    }
  }

  TEST_CASE("bf16 max and adaptive average pooling match the widening reference bit for bit") {
    if (ddp::test::skip_without_gpu()) return;
    using namespace test_cuda_bf16_native;
    Fixture f;
    INFO("seed ", f.seed);
    const Shape xs{2, 9, 11, 24}, ys{2, 5, 6, 24};
    const auto x = f.up(to_bf16(f.random(xs, -2.0, 2.0))), dy = f.up(to_bf16(f.random(ys)));
    auto y = poisoned_bf16(f, ys), yref = poisoned_bf16(f, ys), dx = poisoned_bf16(f, xs),
         dxref = poisoned_bf16(f, xs);
    Tensor<std::int32_t, Cuda> am(ys), amref(ys);
    KC::max_pool2d_forward(f.gpu, kn::MaxPool2dForwardArgs<B, Cuda>{.x = x.cview(), .y = y.view(), .argmax = am.view()});
    BS::max_pool2d_forward(f.gpu,
                           kn::MaxPool2dForwardArgs<B, Cuda>{.x = x.cview(), .y = yref.view(), .argmax = amref.view()});
    CHECK(host(f, y) == host(f, yref));
    const Tensor<std::int32_t, Cpu> a1 = f.down(am), a2 = f.down(amref);
    CHECK(std::memcmp(a1.data(), a2.data(), a1.bytes()) == 0);
    KC::max_pool2d_backward(f.gpu,
                            kn::MaxPool2dBackwardArgs<B, Cuda>{.dy = dy.cview(), .argmax = am.cview(), .dx = dx.view()});
    BS::max_pool2d_backward(
        f.gpu, kn::MaxPool2dBackwardArgs<B, Cuda>{.dy = dy.cview(), .argmax = am.cview(), .dx = dxref.view()});
    CHECK(host(f, dx) == host(f, dxref));

    for (const Shape& os : {Shape{2, 1, 1, 24}, Shape{2, 4, 3, 24}}) {  // global, and overlapping cells
      INFO("output ", os);
      const auto dyo = f.up(to_bf16(f.random(os)));
      auto yo = poisoned_bf16(f, os), yoref = poisoned_bf16(f, os), dxo = poisoned_bf16(f, xs),
           dxoref = poisoned_bf16(f, xs);
      KC::adaptive_avg_pool2d_forward(f.gpu, kn::AdaptiveAvgPool2dForwardArgs<B, Cuda>{.x = x.cview(), .y = yo.view()});
      BS::adaptive_avg_pool2d_forward(f.gpu,
                                      kn::AdaptiveAvgPool2dForwardArgs<B, Cuda>{.x = x.cview(), .y = yoref.view()});
      CHECK(host(f, yo) == host(f, yoref));
      KC::adaptive_avg_pool2d_backward(f.gpu,
                                       kn::AdaptiveAvgPool2dBackwardArgs<B, Cuda>{.dy = dyo.cview(), .dx = dxo.view()});
      BS::adaptive_avg_pool2d_backward(
          f.gpu, kn::AdaptiveAvgPool2dBackwardArgs<B, Cuda>{.dy = dyo.cview(), .dx = dxoref.view()});
      CHECK(host(f, dxo) == host(f, dxoref));
    }
  }
}
