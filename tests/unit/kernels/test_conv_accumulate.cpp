// conv2d_backward with accumulate_dx (docs/decisions/0061): dx += the input gradient must give, bit for bit, what
// the separate add gave before: the gradient computed into a tensor of its own by the overwriting call, then
// Kernels<Cpu>::add with the residual. The reference uses only the overwriting call and add, so it does not run
// the code under test. Also the CUDA dgrad maps' accumulating store, evaluated on the host (conv_gemm_maps.hpp):
// dx += v in every phase, and the phases no tap reaches keep the residual.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ddp/kernels/conv_gemm_maps.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

#include "support/same_bits.hpp"

namespace test_conv_accumulate {

using ddp::Cpu;
using ddp::Exec;
using ddp::Tensor;
namespace kn = ddp::kernels;

struct Geo {
  std::int64_t n, h, w, c, k, r;
  std::int64_t stride, pad;
};

// ResNet's first convs of a block: bottleneck conv1 (1x1, the pointwise GEMM path), basic-block conv1 (3x3, stride
// 1 or 2: the col2im path); a 1x1 stride-2 conv (the downsample's) and layer4 at small input (P = 1: one col
// block spans many images); N below and above the thread counts used.
const Geo kGeos[] = {
    {5, 6, 7, 24, 16, 1, 1, 0},  // 1x1 stride 1: one GEMM over the batch
    {1, 9, 8, 20, 12, 1, 1, 0},  // the same with one image (GEMM split by columns across threads)
    {3, 9, 8, 7, 5, 3, 1, 1},    // 3x3 same
    {4, 8, 9, 6, 8, 3, 2, 1},    // 3x3 stride 2
    {3, 6, 5, 4, 6, 1, 2, 0},    // 1x1 stride 2: three quarters of dx get no gradient
    {37, 2, 2, 16, 9, 3, 2, 1},  // P = 1
};

using ddp::test::same_bits;

template <class T>
void check_accumulate(const Geo& g, int threads) {
  CAPTURE(g.n);
  CAPTURE(g.r);
  CAPTURE(g.stride);
  CAPTURE(threads);
  ddp::kernels::cpu::ThreadPool pool(threads);
  const Exec<Cpu> exec{.pool = &pool};
  const std::int64_t ho = (g.h + 2 * g.pad - g.r) / g.stride + 1, wo = (g.w + 2 * g.pad - g.r) / g.stride + 1;
  Tensor<T, Cpu> x({g.n, g.h, g.w, g.c}), w({g.k, g.r, g.r, g.c}), dy({g.n, ho, wo, g.k}), res(x.shape());
  ddp::Generator gen(static_cast<std::uint64_t>(g.n * 100 + g.r * 10 + g.stride));
  gen.fill_normal(x.view(), 0.0, 1.0);
  gen.fill_normal(w.view(), 0.0, 1.0);
  gen.fill_normal(dy.view(), 0.0, 1.0);
  gen.fill_normal(res.view(), 0.0, 1.0);
  const kn::Size2 st{g.stride, g.stride}, pd{g.pad, g.pad};

  // Before 0061: the gradient into a tensor of its own, then the residual block's add.
  Tensor<T, Cpu> dx_ref(x.shape()), dw_ref(w.shape());
  ddp::Kernels<Cpu>::conv2d_backward(exec, kn::Conv2dBackwardArgs<T, Cpu>{.x = x.cview(), .w = w.cview(),
                                                                          .dy = dy.cview(), .dx = dx_ref.view(),
                                                                          .dw = dw_ref.view(), .stride = st,
                                                                          .padding = pd});
  ddp::Kernels<Cpu>::add(exec, dx_ref.cview(), res.cview(), dx_ref.view());

  // Now: dx holds the residual and the conv adds into it (dw in the same call, as Conv2d does).
  Tensor<T, Cpu> dx(x.shape()), dw(w.shape());
  std::memcpy(dx.data(), res.data(), res.bytes());
  ddp::Kernels<Cpu>::conv2d_backward(exec, kn::Conv2dBackwardArgs<T, Cpu>{.x = x.cview(), .w = w.cview(),
                                                                          .dy = dy.cview(), .dx = dx.view(),
                                                                          .dw = dw.view(), .stride = st,
                                                                          .padding = pd, .accumulate_dx = true});
  CHECK(same_bits(dx, dx_ref));
  CHECK(same_bits(dw, dw_ref));
  // The add is not a no-op here: the residual changed dx (the comparison above could not pass by accident).
  CHECK_FALSE(same_bits(dx, res));
}

// C = A B of problem p on the host, in double, stored through p (as test_conv_maps.cpp).
template <class P>
void run(const P& p) {
  for (std::int64_t m = 0; m < p.m_size(); ++m)
    for (std::int64_t n = 0; n < p.n_size(); ++n) {
      double acc = 0.0;
      for (std::int64_t k = 0; k < p.k_size(); ++k) acc += double(p.a(m, k)) * double(p.b(k, n));
      p.store(m, n, static_cast<float>(acc));
    }
}

}  // namespace test_conv_accumulate

TEST_SUITE("kernels") {
  TEST_CASE("conv2d_backward accumulate_dx: bit for bit the gradient plus the residual (CPU, float and double)") {
    using namespace test_conv_accumulate;
    for (const Geo& g : kGeos)
      for (int threads : {1, 2, 3}) {
        check_accumulate<float>(g, threads);
        check_accumulate<double>(g, threads);
      }
  }

  TEST_CASE("CUDA dgrad maps with accumulate: dx += v per phase; phases no tap reaches keep the residual") {
    using namespace test_conv_accumulate;
    for (const Geo& g : kGeos) {
      CAPTURE(g.r);
      CAPTURE(g.stride);
      Tensor<float, Cpu> x({g.n, g.h, g.w, g.c}), w({g.k, g.r, g.r, g.c}), res(x.shape());
      const kn::ConvGeometry cs = kn::conv_geometry(x.cview(), w.cview(), {g.stride, g.stride}, {g.pad, g.pad}, {1, 1});
      Tensor<float, Cpu> dy({g.n, cs.ho, cs.wo, g.k});
      ddp::Generator gen(11);
      gen.fill_normal(w.view(), 0.0, 1.0);
      gen.fill_normal(dy.view(), 0.0, 1.0);
      gen.fill_normal(res.view(), 0.0, 1.0);
      // Reference: the overwriting maps (an empty phase's pixels cleared first, as conv2d.cuh does), then + res.
      Tensor<float, Cpu> ref(x.shape()), got(x.shape());
      std::memset(ref.data(), 0, ref.bytes());
      std::memcpy(got.data(), res.data(), res.bytes());
      for (const kn::DgradPhase& q : kn::dgrad_phases(cs)) {
        if (q.taps() == 0) continue;
        run(kn::ConvDgradPhaseMap<float>{.dy = dy.data(), .w = w.data(), .dx = ref.data(), .g = cs, .q = q});
        run(kn::ConvDgradPhaseMap<float>{.dy = dy.data(), .w = w.data(), .dx = got.data(), .g = cs, .q = q,
                                         .accumulate = true});
      }
      for (std::int64_t i = 0; i < ref.numel(); ++i) ref.data()[i] += res.data()[i];
      CHECK(same_bits(got, ref));
    }
  }
}
