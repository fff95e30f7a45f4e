// Kernels<Cuda> against Kernels<Cpu>: every op, forward and backward, on fresh random inputs.
// SPDX-License-Identifier: MIT
//
// Each GPU case uploads the same random inputs to both devices, poisons the GPU outputs with NaN (so an
// element the kernel forgets to write fails), runs both, and compares with |gpu - cpu| <= rtol * (|cpu| +
// max|cpu|) (fp32 SIMT: rtol 1e-5; TF32 tensor cores: 1e-3; BF16 tensor cores: 1e-2). Sizes are chosen not to divide the 64x64x16 GEMM tiles, the
// 32-channel batchnorm blocks or the 256-thread blocks. The seed is printed on failure (INFO).
// The first cases need no GPU (error texts and host-side validation); GPU cases skip (exit 77) without one.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ddp/core/cuda_check.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

#include "support/gpu.hpp"
#include "unit/kernels/cuda_compare.hpp"

using namespace ddp::test::cuda_kernels;  // NOLINT: test file

TEST_SUITE("kernels_cuda") {
  // ---- host-side behaviour: runs without a GPU ----
  TEST_CASE("DDP_CUDA_CHECK throws CudaError with CUDA's own name and text") {
    try {
      DDP_CUDA_CHECK(cudaErrorInvalidValue);
      FAIL("no throw");
    } catch (const ddp::CudaError& e) {
      const std::string w = e.what();
      CHECK(w.rfind("ddp: cudaErrorInvalidValue failed: cudaErrorInvalidValue (invalid argument) at ", 0) == 0);
      CHECK(w.find("test_cuda_kernels.cu:") != std::string::npos);
    }
  }

  TEST_CASE("DDP_CUBLAS_CHECK throws CudaError with cuBLAS's status name") {
    try {
      DDP_CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED);
      FAIL("no throw");
    } catch (const ddp::CudaError& e) {
      const std::string w = e.what();
      CHECK(w.rfind("ddp: CUBLAS_STATUS_NOT_INITIALIZED failed: CUBLAS_STATUS_NOT_INITIALIZED (", 0) == 0);
    }
  }

  TEST_CASE("CUDA kernels reject bad shapes on the host with the CPU's words, before any launch") {
    // Host memory behind Cuda views: validation must throw before anything dereferences or launches.
    std::vector<float> mem(4096);
    auto view = [&](Shape s) { return ddp::TensorView<float, Cuda>(mem.data(), s); };
    auto cview = [&](Shape s) { return ddp::TensorView<const float, Cuda>(mem.data(), s); };
    const Exec<Cuda> e{};
    CHECK_THROWS_WITH_AS(
        KC::conv2d_forward(e, ddp::kernels::Conv2dForwardArgs<float, Cuda>{
                                  .x = cview({1, 5, 5, 3}), .w = cview({4, 3, 3, 2}), .y = view({1, 3, 3, 4})}),
        "ddp: conv2d_forward: input has 3 channels but the weight (4, 3, 3, 2) expects 2 (x is NHWC (1, 5, 5, 3); "
        "is the input NCHW?)",
        ddp::ValueError);
    CHECK_THROWS_WITH_AS(KC::relu_forward(e, cview({2, 3}), view({2, 4})),
                         "ddp: relu_forward: output y has shape (2, 4) but must be (2, 3)", ddp::ValueError);
    CHECK_THROWS_WITH_AS(
        KC::linear_forward(e, ddp::kernels::LinearForwardArgs<float, Cuda>{
                                  .x = cview({2, 3}), .w = cview({4, 5}), .y = view({2, 4})}),
        "ddp: linear_forward: input has 3 features but the weight (4, 5) expects 5", ddp::ValueError);
  }

  TEST_CASE("adaptive pool: cells_covering finds exactly the cells that contain an index (host)") {
    namespace cd = ddp::kernels::cuda::detail;
    for (std::int64_t in = 1; in <= 13; ++in)
      for (std::int64_t out = 1; out <= 9; ++out)
        for (std::int64_t v = 0; v < in; ++v) {
          std::int64_t lo = 0, hi = 0;
          cd::cells_covering(v, in, out, lo, hi);
          for (std::int64_t i = 0; i < out; ++i) {
            const bool inside = ddp::kernels::pool_start(i, in, out) <= v && v < ddp::kernels::pool_end(i, in, out);
            INFO("in ", in, " out ", out, " v ", v, " cell ", i);
            REQUIRE(inside == (lo <= i && i < hi));
          }
        }
  }

  // ---- GPU against CPU ----
  TEST_CASE("element-wise ops: relu, add, axpy, scale, fill") {
    if (ddp::test::skip_without_gpu()) return;
    Fixture f;
    INFO("seed ", f.seed);
    const Shape s{3, 7, 5, 13};  // 1365 elements: not a multiple of 256
    auto x = f.random(s), d = f.random(s);
    auto gx = f.up(x), gd = f.up(d);
    Tensor<float, Cpu> y(s), dx(s), sum(s);
    auto gy = f.poisoned(s), gdx = f.poisoned(s), gsum = f.poisoned(s);
    KH::relu_forward(f.cpu, x.cview(), y.view());
    KC::relu_forward(f.gpu, gx.cview(), gy.view());
    KH::relu_backward(f.cpu, y.cview(), d.cview(), dx.view());
    KC::relu_backward(f.gpu, gy.cview(), gd.cview(), gdx.view());
    KH::add(f.cpu, x.cview(), d.cview(), sum.view());
    KC::add(f.gpu, gx.cview(), gd.cview(), gsum.view());
    KH::axpy(f.cpu, 0.5f, x.cview(), d.view());
    KC::axpy(f.gpu, 0.5f, gx.cview(), gd.view());
    KH::scale(f.cpu, -3.f, x.view());
    KC::scale(f.gpu, -3.f, gx.view());
    expect_close(y, f.down(gy), 0.0, "relu_forward");
    expect_close(dx, f.down(gdx), 0.0, "relu_backward");
    expect_close(sum, f.down(gsum), 0.0, "add");
    expect_close(d, f.down(gd), kFp32, "axpy");  // the GPU fuses a multiply-add
    expect_close(x, f.down(gx), 0.0, "scale");
    KC::fill(f.gpu, gx.view(), 2.5f);
    expect_close(Tensor<float, Cpu>::full(s, 2.5f), f.down(gx), 0.0, "fill");
  }

  // Each implementation the build has (tensor/conv_impl.hpp): ddp's implicit-GEMM kernels always, cuDNN with its
  // heuristics' algorithm and with the measured fastest where the program links ddp::cudnn (docs/decisions/0052).
  TEST_CASE("conv2d forward and backward match the CPU for assorted geometries, in every implementation") {
    if (ddp::test::skip_without_gpu()) return;
    struct Geo {
      std::int64_t n, h, w, c, k, r, s;
      Size2 stride, pad, dil;
      bool bias;
    };
    const Geo geos[] = {
        {2, 9, 11, 5, 7, 3, 3, {1, 1}, {1, 1}, {1, 1}, false},     // 3x3 same, odd sizes
        {3, 17, 15, 3, 70, 7, 7, {2, 2}, {3, 3}, {1, 1}, true},    // the stem's shape family, K > one tile
        {2, 10, 9, 66, 20, 1, 1, {1, 1}, {0, 0}, {1, 1}, false},   // pointwise, C > one tile
        {2, 9, 9, 12, 17, 1, 1, {2, 2}, {0, 0}, {1, 1}, false},    // downsample 1x1 stride 2
        {1, 12, 13, 6, 9, 3, 3, {2, 1}, {2, 1}, {2, 1}, true},     // dilation and asymmetric stride
        {4, 29, 29, 32, 33, 3, 3, {1, 1}, {1, 1}, {1, 1}, false},  // long reduction: split-K wgrad
    };
#if DDP_WITH_CUDNN
    const ddp::ConvImpl impls[] = {ddp::ConvImpl::Own, ddp::ConvImpl::Cudnn, ddp::ConvImpl::CudnnFind};
#else
    const ddp::ConvImpl impls[] = {ddp::ConvImpl::Own};
#endif
    for (const ddp::ConvImpl impl : impls)
      for (const Geo& g : geos) {
        Fixture f;
        INFO("conv ", ddp::conv_impl_name(impl), " seed ", f.seed, " geometry n", g.n, " h", g.h, " w", g.w, " c", g.c,
             " k", g.k, " r", g.r, " s", g.s);
        auto x = f.random({g.n, g.h, g.w, g.c});
        auto w = f.random({g.k, g.r, g.s, g.c});
        auto b = f.random({g.k});
        const std::int64_t ho = ddp::kernels::conv_out_size(g.h, g.r, g.stride.h, g.pad.h, g.dil.h);
        const std::int64_t wo = ddp::kernels::conv_out_size(g.w, g.s, g.stride.w, g.pad.w, g.dil.w);
        const Shape ys{g.n, ho, wo, g.k};
        auto dy = f.random(ys);
        auto gx = f.up(x), gw = f.up(w), gb = f.up(b), gdy = f.up(dy);
        Tensor<float, Cpu> y(ys), dx(x.shape()), dw(w.shape()), db(b.shape());
        KH::conv2d_forward(f.cpu, ddp::kernels::Conv2dForwardArgs<float, Cpu>{
                                      .x = x.cview(), .w = w.cview(),
                                      .bias = g.bias ? b.cview() : ddp::CpuView<const float>{}, .y = y.view(),
                                      .stride = g.stride, .padding = g.pad, .dilation = g.dil});
        KH::conv2d_backward(f.cpu, ddp::kernels::Conv2dBackwardArgs<float, Cpu>{
                                       .x = x.cview(), .w = w.cview(), .dy = dy.cview(), .dx = dx.view(),
                                       .dw = dw.view(), .dbias = db.view(), .stride = g.stride, .padding = g.pad,
                                       .dilation = g.dil});
        // fp32 (1e-5; cuDNN restricted to FMA-math algorithms), then tensor cores through the exec's precision:
        // TF32 within 1e-3, BF16 within 1e-2 (ddp's wmma kernels, cuBLAS FAST_16BF for the pointwise case; cuDNN
        // runs TF32 for bf16, which is within that too).
        for (const auto& [prec, tol, name] : {std::tuple{ddp::Precision::Fp32, kFp32, "fp32"},
                                             std::tuple{ddp::Precision::Tf32, kTf32, "tf32"},
                                             std::tuple{ddp::Precision::Bf16, kBf16, "bf16"}}) {
          INFO("precision ", name);
          const Exec<Cuda> e = f.stream.exec(prec, false, impl);
          auto gy = f.poisoned(ys), gdx = f.poisoned(x.shape()), gdw = f.poisoned(w.shape()), gdb = f.poisoned(b.shape());
          KC::conv2d_forward(e, ddp::kernels::Conv2dForwardArgs<float, Cuda>{
                                    .x = gx.cview(), .w = gw.cview(),
                                    .bias = g.bias ? gb.cview() : ddp::TensorView<const float, Cuda>{}, .y = gy.view(),
                                    .stride = g.stride, .padding = g.pad, .dilation = g.dil});
          KC::conv2d_backward(e, ddp::kernels::Conv2dBackwardArgs<float, Cuda>{
                                     .x = gx.cview(), .w = gw.cview(), .dy = gdy.cview(), .dx = gdx.view(),
                                     .dw = gdw.view(), .dbias = gdb.view(), .stride = g.stride, .padding = g.pad,
                                     .dilation = g.dil});
          expect_close(y, f.down(gy), tol, "conv2d y");
          expect_close(dx, f.down(gdx), tol, "conv2d dx");
          expect_close(dw, f.down(gdw), tol, "conv2d dw");
          expect_close(db, f.down(gdb), kFp32, "conv2d dbias (fp32 channel sums at any precision)");
        }
        // Deterministic mode: the same bits twice (cuDNN keeps to algorithms it reports deterministic).
        const Exec<Cuda> det = f.stream.exec(ddp::Precision::Tf32, true, impl);
        Tensor<float, Cpu> first;
        for (int run = 0; run < 2; ++run) {
          auto rdx = f.poisoned(x.shape()), rdw = f.poisoned(w.shape());
          KC::conv2d_backward(det, ddp::kernels::Conv2dBackwardArgs<float, Cuda>{
                                       .x = gx.cview(), .w = gw.cview(), .dy = gdy.cview(), .dx = rdx.view(),
                                       .dw = rdw.view(), .stride = g.stride, .padding = g.pad, .dilation = g.dil});
          if (run == 0)
            first = f.down(rdw);
          else
            expect_close(first, f.down(rdw), 0.0, "conv2d dw, deterministic, run 2 vs run 1");
        }
        // fp16 is for cuBLAS GEMMs only (precision.hpp): the convolutions refuse it instead of computing in fp32.
        auto fy = f.poisoned(ys);
        CHECK_THROWS_WITH_AS(KC::conv2d_forward(f.stream.exec(ddp::Precision::Fp16, false, impl),
                                                ddp::kernels::Conv2dForwardArgs<float, Cuda>{
                                                    .x = gx.cview(), .w = gw.cview(),
                                                    .bias = g.bias ? gb.cview() : ddp::TensorView<const float, Cuda>{},
                                                    .y = fy.view(), .stride = g.stride, .padding = g.pad,
                                                    .dilation = g.dil}),
                             "ddp: conv2d: fp16 arithmetic is not implemented for convolutions; use bf16 or tf32 "
                             "(--precision)",
                             ddp::ValueError);
      }
  }


  TEST_CASE("batchnorm training and eval, forward and backward, running statistics") {
    if (ddp::test::skip_without_gpu()) return;
    // 37 channels: scalar loads, a full and a partial tile; 64: 16-byte vector loads (batchnorm.cuh)
    for (const std::int64_t ch : {std::int64_t{37}, std::int64_t{64}})
      for (const bool training : {true, false}) {
        Fixture f;
        INFO("seed ", f.seed, " training ", training, " channels ", ch);
        const Shape xs{3, 11, 13, ch};
        const Shape cs{ch};
        auto x = f.random(xs, -2.0, 3.0), dy = f.random(xs), gamma = f.random(cs, 0.5, 1.5), beta = f.random(cs);
        auto rm = f.random(cs), rv = f.random(cs, 0.5, 2.0);
        auto gx = f.up(x), gdy = f.up(dy), ggamma = f.up(gamma), gbeta = f.up(beta), grm = f.up(rm), grv = f.up(rv);
        Tensor<float, Cpu> y(xs), sm(cs), si(cs), dx(xs), dg(cs), db(cs);
        auto gy = f.poisoned(xs), gsm = f.poisoned(cs), gsi = f.poisoned(cs), gdx = f.poisoned(xs),
             gdg = f.poisoned(cs), gdb = f.poisoned(cs);
        KH::batchnorm_forward(f.cpu, ddp::kernels::BatchNormForwardArgs<float, Cpu>{
                                         .x = x.cview(), .gamma = gamma.cview(), .beta = beta.cview(),
                                         .running_mean = rm.view(), .running_var = rv.view(), .y = y.view(),
                                         .save_mean = sm.view(), .save_invstd = si.view(), .training = training});
        KC::batchnorm_forward(f.gpu, ddp::kernels::BatchNormForwardArgs<float, Cuda>{
                                         .x = gx.cview(), .gamma = ggamma.cview(), .beta = gbeta.cview(),
                                         .running_mean = grm.view(), .running_var = grv.view(), .y = gy.view(),
                                         .save_mean = gsm.view(), .save_invstd = gsi.view(), .training = training});
        KH::batchnorm_backward(f.cpu, ddp::kernels::BatchNormBackwardArgs<float, Cpu>{
                                          .x = x.cview(), .dy = dy.cview(), .gamma = gamma.cview(),
                                          .save_mean = sm.cview(), .save_invstd = si.cview(), .dx = dx.view(),
                                          .dgamma = dg.view(), .dbeta = db.view(), .training = training});
        KC::batchnorm_backward(f.gpu, ddp::kernels::BatchNormBackwardArgs<float, Cuda>{
                                          .x = gx.cview(), .dy = gdy.cview(), .gamma = ggamma.cview(),
                                          .save_mean = gsm.cview(), .save_invstd = gsi.cview(), .dx = gdx.view(),
                                          .dgamma = gdg.view(), .dbeta = gdb.view(), .training = training});
        expect_close(y, f.down(gy), kFp32, "bn y");
        expect_close(sm, f.down(gsm), kFp32, "bn save_mean");
        expect_close(si, f.down(gsi), kFp32, "bn save_invstd");
        expect_close(rm, f.down(grm), kFp32, "bn running_mean");
        expect_close(rv, f.down(grv), kFp32, "bn running_var");
        expect_close(dx, f.down(gdx), kFp32, "bn dx");
        expect_close(dg, f.down(gdg), kFp32, "bn dgamma");
        expect_close(db, f.down(gdb), kFp32, "bn dbeta");
      }
  }

  TEST_CASE("max-pool with argmax and adaptive average pool, forward and backward") {
    if (ddp::test::skip_without_gpu()) return;
    Fixture f;
    INFO("seed ", f.seed);
    const Shape xs{2, 15, 13, 19};
    auto x = f.random(xs);
    auto gx = f.up(x);
    const Size2 k{3, 3}, st{2, 2}, pd{1, 1};
    const Shape ys = ddp::kernels::maxpool2d_output_shape(x.cview(), k, st, pd);
    auto dy = f.random(ys);
    auto gdy = f.up(dy);
    Tensor<float, Cpu> y(ys), dx(xs);
    Tensor<std::int32_t, Cpu> am(ys);
    auto gy = f.poisoned(ys), gdx = f.poisoned(xs);
    auto gam = f.poisoned<std::int32_t>(ys);
    KH::max_pool2d_forward(f.cpu, ddp::kernels::MaxPool2dForwardArgs<float, Cpu>{
                                      .x = x.cview(), .y = y.view(), .argmax = am.view(), .kernel = k, .stride = st,
                                      .padding = pd});
    KC::max_pool2d_forward(f.gpu, ddp::kernels::MaxPool2dForwardArgs<float, Cuda>{
                                      .x = gx.cview(), .y = gy.view(), .argmax = gam.view(), .kernel = k, .stride = st,
                                      .padding = pd});
    KH::max_pool2d_backward(
        f.cpu, ddp::kernels::MaxPool2dBackwardArgs<float, Cpu>{.dy = dy.cview(), .argmax = am.cview(), .dx = dx.view()});
    KC::max_pool2d_backward(f.gpu, ddp::kernels::MaxPool2dBackwardArgs<float, Cuda>{
                                       .dy = gdy.cview(), .argmax = gam.cview(), .dx = gdx.view(), .kernel = k,
                                       .stride = st, .padding = pd});
    expect_close(y, f.down(gy), 0.0, "max_pool y");
    const auto gam_host = f.down(gam);
    for (std::int64_t i = 0; i < am.numel(); ++i) REQUIRE(am.data()[i] == gam_host.data()[i]);
    expect_close(dx, f.down(gdx), kFp32, "max_pool dx");

    for (const Shape ps : {Shape{2, 1, 1, 19}, Shape{2, 4, 6, 19}}) {  // global, and overlapping cells
      auto pdy = f.random(ps);
      auto gpdy = f.up(pdy);
      Tensor<float, Cpu> py(ps), pdx(xs);
      auto gpy = f.poisoned(ps), gpdx = f.poisoned(xs);
      KH::adaptive_avg_pool2d_forward(f.cpu, ddp::kernels::AdaptiveAvgPool2dForwardArgs<float, Cpu>{.x = x.cview(), .y = py.view()});
      KC::adaptive_avg_pool2d_forward(f.gpu, ddp::kernels::AdaptiveAvgPool2dForwardArgs<float, Cuda>{.x = gx.cview(), .y = gpy.view()});
      KH::adaptive_avg_pool2d_backward(f.cpu, ddp::kernels::AdaptiveAvgPool2dBackwardArgs<float, Cpu>{.dy = pdy.cview(), .dx = pdx.view()});
      KC::adaptive_avg_pool2d_backward(f.gpu, ddp::kernels::AdaptiveAvgPool2dBackwardArgs<float, Cuda>{.dy = gpdy.cview(), .dx = gpdx.view()});
      expect_close(py, f.down(gpy), kFp32, "adaptive_avg_pool y");
      expect_close(pdx, f.down(gpdx), kFp32, "adaptive_avg_pool dx");
    }
  }

  TEST_CASE("linear forward and backward (cuBLAS, fp32 compute; TF32 and BF16 tensor cores)") {
    if (ddp::test::skip_without_gpu()) return;
    Fixture f;
    INFO("seed ", f.seed);
    const std::int64_t n = 5, in = 67, out = 13;
    auto x = f.random({n, in}), w = f.random({out, in}), b = f.random({out}), dy = f.random({n, out});
    auto gx = f.up(x), gw = f.up(w), gb = f.up(b), gdy = f.up(dy);
    Tensor<float, Cpu> y({n, out}), dx({n, in}), dw({out, in}), db({out});
    auto gy = f.poisoned({n, out}), gdx = f.poisoned({n, in}), gdw = f.poisoned({out, in}), gdb = f.poisoned({out});
    KH::linear_forward(f.cpu, ddp::kernels::LinearForwardArgs<float, Cpu>{.x = x.cview(), .w = w.cview(), .bias = b.cview(), .y = y.view()});
    KC::linear_forward(f.gpu, ddp::kernels::LinearForwardArgs<float, Cuda>{.x = gx.cview(), .w = gw.cview(), .bias = gb.cview(), .y = gy.view()});
    KH::linear_backward(f.cpu, ddp::kernels::LinearBackwardArgs<float, Cpu>{.x = x.cview(), .w = w.cview(), .dy = dy.cview(), .dx = dx.view(), .dw = dw.view(),
                                .dbias = db.view()});
    KC::linear_backward(f.gpu, ddp::kernels::LinearBackwardArgs<float, Cuda>{.x = gx.cview(), .w = gw.cview(), .dy = gdy.cview(), .dx = gdx.view(),
                                .dw = gdw.view(), .dbias = gdb.view()});
    expect_close(y, f.down(gy), kFp32, "linear y");
    expect_close(dx, f.down(gdx), kFp32, "linear dx");
    expect_close(dw, f.down(gdw), kFp32, "linear dw");
    expect_close(db, f.down(gdb), kFp32, "linear dbias");
    // Fp16 (cuBLAS FAST_16F: fp16 operands, 11 significant bits like tf32) is for GEMMs only: the GPT's --amp_dtype.
    for (const auto& [prec, tol] : {std::pair{ddp::Precision::Tf32, kTf32}, std::pair{ddp::Precision::Bf16, kBf16},
                                    std::pair{ddp::Precision::Fp16, kFp16}}) {
      INFO("precision ", ddp::precision_name(prec));
      const Exec<Cuda> tc = f.stream.exec(prec);
      auto ty = f.poisoned({n, out}), tdx = f.poisoned({n, in}), tdw = f.poisoned({out, in});
      KC::linear_forward(tc, ddp::kernels::LinearForwardArgs<float, Cuda>{.x = gx.cview(), .w = gw.cview(),
                                                                          .bias = gb.cview(), .y = ty.view()});
      KC::linear_backward(tc, ddp::kernels::LinearBackwardArgs<float, Cuda>{
                                  .x = gx.cview(), .w = gw.cview(), .dy = gdy.cview(), .dx = tdx.view(), .dw = tdw.view()});
      expect_close(y, f.down(ty), tol, "linear y (tensor cores)");
      expect_close(dx, f.down(tdx), tol, "linear dx (tensor cores)");
      expect_close(dw, f.down(tdw), tol, "linear dw (tensor cores)");
    }
  }

  TEST_CASE("cross-entropy (label smoothing) and MSE: value and gradient; bad labels named") {
    if (ddp::test::skip_without_gpu()) return;
    Fixture f;
    INFO("seed ", f.seed);
    const std::int64_t n = 7, c = 1001;  // C not a multiple of the 256-thread block
    auto z = f.random({n, c}, -5.0, 5.0);
    Tensor<std::int64_t, Cpu> labels({n});
    for (std::int64_t i = 0; i < n; ++i) labels.data()[i] = static_cast<std::int64_t>(f.gen.uniform_int(c));
    auto gz = f.up(z);
    auto glabels = f.up(labels);
    for (const double s : {0.0, 0.1}) {
      Tensor<float, Cpu> dz({n, c});
      auto gdz = f.poisoned({n, c});
      const double l_cpu = KH::cross_entropy(
          f.cpu, ddp::kernels::CrossEntropyArgs<float, Cpu>{.logits = z.cview(), .labels = labels.cview(), .dlogits = dz.view(), .label_smoothing = s});
      const double l_gpu = KC::cross_entropy(
          f.gpu, ddp::kernels::CrossEntropyArgs<float, Cuda>{.logits = gz.cview(), .labels = glabels.cview(), .dlogits = gdz.view(), .label_smoothing = s});
      CHECK(l_gpu == doctest::Approx(l_cpu).epsilon(1e-9));
      expect_close(dz, f.down(gdz), kFp32, "cross_entropy dlogits");
    }
    labels.data()[3] = c + 4;
    auto gbad = f.up(labels);
    CHECK_THROWS_WITH_AS(KC::cross_entropy(f.gpu, ddp::kernels::CrossEntropyArgs<float, Cuda>{.logits = gz.cview(), .labels = gbad.cview()}),
                         "ddp: cross_entropy: label 1005 of sample 3 is out of range for 1001 classes (labels must be "
                         "in [0, 1000]); check the dataset's labels against --num-classes",
                         ddp::ValueError);

    const Shape ms{3, 333};
    auto x = f.random(ms), t = f.random(ms);
    auto gxm = f.up(x), gt = f.up(t);
    Tensor<float, Cpu> dxm(ms);
    auto gdxm = f.poisoned(ms);
    const double m_cpu = KH::mse(f.cpu, ddp::kernels::MseArgs<float, Cpu>{.x = x.cview(), .target = t.cview(), .dx = dxm.view()});
    const double m_gpu = KC::mse(f.gpu, ddp::kernels::MseArgs<float, Cuda>{.x = gxm.cview(), .target = gt.cview(), .dx = gdxm.view()});
    CHECK(m_gpu == doctest::Approx(m_cpu).epsilon(1e-9));
    expect_close(dxm, f.down(gdxm), kFp32, "mse dx");
  }

  TEST_CASE("SGD step with momentum, nesterov and weight decay over two steps") {
    if (ddp::test::skip_without_gpu()) return;
    Fixture f;
    INFO("seed ", f.seed);
    const Shape s{1000, 3};
    auto p = f.random(s), g = f.random(s);
    Tensor<float, Cpu> buf(s);
    auto gp = f.up(p), gg = f.up(g);
    auto gbuf = f.poisoned(s);  // the first step must overwrite the buffer
    for (const bool first : {true, false}) {
      const ddp::kernels::SgdArgs<float, Cpu> a{.param = p.view(), .grad = g.cview(), .momentum_buffer = buf.view(),
                                                .first_step = first, .lr = 0.05, .momentum = 0.9,
                                                .weight_decay = 1e-4, .nesterov = true};
      KH::sgd_step(f.cpu, a);
      KC::sgd_step(f.gpu, ddp::kernels::SgdArgs<float, Cuda>{.param = gp.view(), .grad = gg.cview(),
                                                             .momentum_buffer = gbuf.view(), .first_step = first,
                                                             .lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4,
                                                             .nesterov = true});
    }
    expect_close(p, f.down(gp), kFp32, "sgd param");  // FMA on the GPU
    expect_close(buf, f.down(gbuf), kFp32, "sgd momentum buffer");
  }
}
