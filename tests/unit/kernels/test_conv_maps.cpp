// The implicit-GEMM operand maps of kernels/conv_gemm_maps.hpp (what the CUDA conv kernels run), evaluated on the
// host as a plain triple loop, must reproduce the CPU conv's y, dx and dw: this checks every index formula without
// a GPU (the tiled kernels that run them on the device are checked by unit_kernels_cuda). The backward-data
// phases must also cover every dx pixel exactly once and multiply only by taps that reach their pixel.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <ddp/kernels/conv_gemm_maps.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

namespace {

using ddp::Cpu;
using ddp::Tensor;
using ddp::kernels::ConvGeometry;
using ddp::kernels::Size2;

struct Geo {
  std::int64_t n, h, w, c, k, r, s;
  Size2 stride, pad, dil;
};

// Every stride, padding and dilation shape the ResNets use, and odd ones: asymmetric stride, dilation that
// shares a factor with the stride (some phases reached by no tap), stride larger than the kernel.
const Geo kGeos[] = {
    {2, 7, 6, 3, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}},   // 3x3 same
    {1, 11, 9, 2, 4, 7, 7, {2, 2}, {3, 3}, {1, 1}},  // the stem's shape family
    {2, 5, 6, 4, 3, 1, 1, {2, 2}, {0, 0}, {1, 1}},   // downsample 1x1 stride 2: three empty phases
    {2, 8, 7, 3, 4, 3, 3, {2, 2}, {1, 1}, {1, 1}},   // layer2's first 3x3, stride 2
    {1, 9, 10, 3, 2, 3, 3, {2, 1}, {2, 1}, {2, 1}},  // dilation 2 with stride 2: only even phases reached
    {1, 10, 11, 2, 3, 2, 3, {3, 4}, {1, 0}, {1, 2}}, // stride larger than the kernel
};

void expect_near(const Tensor<float, Cpu>& ref, const Tensor<float, Cpu>& got, const char* what) {
  REQUIRE(ref.shape() == got.shape());
  double worst = 0.0;
  for (std::int64_t i = 0; i < ref.numel(); ++i)
    worst = std::max(worst, std::fabs(double(ref.data()[i]) - double(got.data()[i])) /
                                (1.0 + std::fabs(double(ref.data()[i]))));
  INFO(what, ": worst relative difference ", worst);
  CHECK(worst < 1e-5);
}

// C = A B of problem p on the host, in double.
template <class P>
void run(const P& p) {
  for (std::int64_t m = 0; m < p.m_size(); ++m)
    for (std::int64_t n = 0; n < p.n_size(); ++n) {
      double acc = 0.0;
      for (std::int64_t k = 0; k < p.k_size(); ++k) acc += double(p.a(m, k)) * double(p.b(k, n));
      p.store(m, n, static_cast<float>(acc));
    }
}

}  // namespace

TEST_SUITE("kernels") {
  TEST_CASE("conv2d implicit-GEMM operand maps reproduce the CPU conv (forward, dgrad by phase, wgrad)") {
    namespace kn = ddp::kernels;
    for (const Geo& g : kGeos) {
      INFO("geometry h", g.h, " w", g.w, " r", g.r, " s", g.s, " stride ", g.stride.h, "x", g.stride.w, " pad ",
           g.pad.h, "x", g.pad.w, " dil ", g.dil.h, "x", g.dil.w);
      ddp::Generator gen(static_cast<std::uint64_t>(g.n * 1000 + g.r * 10 + g.stride.h));
      Tensor<float, Cpu> x({g.n, g.h, g.w, g.c}), w({g.k, g.r, g.s, g.c});
      gen.fill_uniform(x.view(), -1.0, 1.0);
      gen.fill_uniform(w.view(), -1.0, 1.0);
      const ConvGeometry cs = kn::conv_geometry(x.cview(), w.cview(), g.stride, g.pad, g.dil);  // the kernels' too
      Tensor<float, Cpu> dy({g.n, cs.ho, cs.wo, g.k});
      gen.fill_uniform(dy.view(), -1.0, 1.0);
      Tensor<float, Cpu> y(dy.shape()), dx(x.shape()), dw(w.shape()), y2(dy.shape()), dw2(w.shape());
      const ddp::Exec<Cpu> cpu{};
      ddp::Kernels<Cpu>::conv2d_forward(cpu, kn::Conv2dForwardArgs<float, Cpu>{
                                                 .x = x.cview(), .w = w.cview(), .y = y.view(), .stride = g.stride,
                                                 .padding = g.pad, .dilation = g.dil});
      ddp::Kernels<Cpu>::conv2d_backward(
          cpu, kn::Conv2dBackwardArgs<float, Cpu>{.x = x.cview(), .w = w.cview(), .dy = dy.cview(), .dx = dx.view(),
                                                  .dw = dw.view(), .stride = g.stride, .padding = g.pad,
                                                  .dilation = g.dil});
      run(kn::ConvFpropMap<float>{.x = x.data(), .w = w.data(), .bias = nullptr, .y = y2.data(), .g = cs});
      run(kn::ConvWgradMap<float>{.x = x.data(), .dy = dy.data(), .dw = dw2.data(), .g = cs});
      expect_near(y, y2, "fprop map");
      expect_near(dw, dw2, "wgrad map");

      // dgrad: NaN everywhere first, then the phases; an empty phase's pixels are 0 (conv2d.cuh clears dx).
      const std::vector<kn::DgradPhase> phases = kn::dgrad_phases(cs);
      Tensor<float, Cpu> dx2(x.shape());
      bool empty_phase = false;
      for (const kn::DgradPhase& q : phases) empty_phase = empty_phase || q.taps() == 0;
      for (std::int64_t i = 0; i < dx2.numel(); ++i) dx2.data()[i] = empty_phase ? 0.f : std::nanf("");
      std::vector<int> written(static_cast<std::size_t>(g.h * g.w), 0);
      std::int64_t products = 0, reaching = 0;
      for (const kn::DgradPhase& q : phases) {
        for (std::int64_t i = 0; i < q.nh; ++i)
          for (std::int64_t j = 0; j < q.nw; ++j)
            ++written[static_cast<std::size_t>((q.qh + i * g.stride.h) * g.w + q.qw + j * g.stride.w)];
        if (q.taps() == 0) continue;
        const kn::ConvDgradPhaseMap<float> p{.dy = dy.data(), .w = w.data(), .dx = dx2.data(), .g = cs, .q = q};
        run(p);
        products += p.m_size() * p.k_size();
      }
      for (int v : written) REQUIRE(v == 1);  // every dx pixel in exactly one phase
      expect_near(dx, dx2, "dgrad phase maps");
      // Products by a tap whose offset is a multiple of the stride, counted by brute force: the phases do no more.
      for (std::int64_t h = 0; h < g.h; ++h)
        for (std::int64_t ww = 0; ww < g.w; ++ww)
          for (std::int64_t r = 0; r < g.r; ++r)
            for (std::int64_t s = 0; s < g.s; ++s)
              if ((h + g.pad.h - r * g.dil.h) % g.stride.h == 0 && (ww + g.pad.w - s * g.dil.w) % g.stride.w == 0)
                reaching += g.n * g.k;
      CHECK(products == reaching);
      CHECK(products <= g.n * g.h * g.w * g.r * g.s * g.k);  // never more than one walk over every tap
    }
  }

  TEST_CASE("dgrad phases of ResNet's strided convs: which taps, and the work saved") {
    namespace kn = ddp::kernels;
    // 3x3 stride 2 pad 1 (torchvision's bottleneck conv2 and basic block conv1 when downsampling).
    ConvGeometry g{.n = 1, .h = 56, .w = 56, .c = 1, .k = 1, .r = 3, .s = 3, .ho = 28, .wo = 28,
                   .stride = {2, 2}, .pad = {1, 1}, .dil = {1, 1}};
    std::vector<kn::DgradPhase> ph = kn::dgrad_phases(g);
    REQUIRE(ph.size() == 4);
    CHECK((ph[0].th.r0 == 1 && ph[0].th.count == 1));                          // even rows: the middle tap
    CHECK((ph[3].th.r0 == 0 && ph[3].th.step == 2 && ph[3].th.count == 2));  // odd rows: taps 0 and 2
    std::int64_t work = 0;
    for (const auto& q : ph) work += q.nh * q.nw * q.taps();
    CHECK(work * 4 == 56 * 56 * 9);  // 2.25 taps per pixel instead of 9
    // 1x1 stride 2 (the downsample): one phase with the tap, three with none.
    g = {.n = 1, .h = 56, .w = 56, .c = 1, .k = 1, .r = 1, .s = 1, .ho = 28, .wo = 28, .stride = {2, 2},
         .pad = {0, 0}, .dil = {1, 1}};
    ph = kn::dgrad_phases(g);
    REQUIRE(ph.size() == 4);
    CHECK(ph[0].taps() == 1);
    CHECK((ph[1].taps() == 0 && ph[2].taps() == 0 && ph[3].taps() == 0));
    // Stride 1: one phase, every tap, the whole image.
    g.stride = {1, 1};
    g.ho = g.wo = 56;
    ph = kn::dgrad_phases(g);
    REQUIRE(ph.size() == 1);
    CHECK((ph[0].nh == 56 && ph[0].nw == 56 && ph[0].taps() == 1));
  }
}
