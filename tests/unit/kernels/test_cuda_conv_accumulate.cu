// conv2d_backward with accumulate_dx on the GPU (docs/decisions/0061): dx holds a residual and each implementation
// adds the input gradient into it (cuBLAS beta = 1 for 1x1 stride-1 convs, cuDNN beta = 1, ddp's implicit-GEMM
// dgrad maps through their accumulating store). Compared with the CPU's dx + residual; ddp's own kernels must also
// give, bit for bit, their own overwriting dx plus the residual (the store adds the rounded float, as add did).
// GPU cases skip (exit 77) without a GPU.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <tuple>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/kernels/cuda/kernels.cuh>

#include "support/gpu.hpp"
#include "unit/kernels/cuda_compare.hpp"

namespace test_cuda_conv_accumulate {

using namespace ddp::test::cuda_kernels;  // NOLINT: test file

struct Geo {
  std::int64_t n, h, w, c, k, r;
  std::int64_t stride, pad;
};
// ResNet's first convs of a block (1x1 on cuBLAS, 3x3 stride 1 and 2), a 1x1 stride-2 conv (three quarters of dx
// get no gradient: their phases run nothing and must keep the residual) and a dgrad long enough to split K.
const Geo kGeos[] = {
    {2, 9, 10, 66, 20, 1, 1, 0},
    {2, 9, 11, 5, 7, 3, 1, 1},
    {3, 10, 9, 6, 9, 3, 2, 1},
    {2, 9, 9, 12, 17, 1, 2, 0},
    {1, 4, 4, 3, 600, 3, 1, 1},
};

}  // namespace test_cuda_conv_accumulate

TEST_SUITE("kernels_cuda") {
  TEST_CASE("conv2d_backward accumulate_dx adds the input gradient into dx, in every implementation") {
    using namespace test_cuda_conv_accumulate;
    if (ddp::test::skip_without_gpu()) return;
#if DDP_WITH_CUDNN
    const ddp::ConvImpl impls[] = {ddp::ConvImpl::Own, ddp::ConvImpl::Cudnn, ddp::ConvImpl::CudnnFind};
#else
    const ddp::ConvImpl impls[] = {ddp::ConvImpl::Own};
#endif
    for (const ddp::ConvImpl impl : impls)
      for (const Geo& g : kGeos) {
        Fixture f;
        INFO("conv ", ddp::conv_impl_name(impl), " seed ", f.seed, " geometry n", g.n, " h", g.h, " c", g.c, " k",
             g.k, " r", g.r, " stride ", g.stride);
        const Size2 st{g.stride, g.stride}, pd{g.pad, g.pad};
        auto x = f.random({g.n, g.h, g.w, g.c});
        auto w = f.random({g.k, g.r, g.r, g.c});
        auto res = f.random(x.shape());
        const std::int64_t ho = ddp::kernels::conv_out_size(g.h, g.r, g.stride, g.pad, 1);
        const std::int64_t wo = ddp::kernels::conv_out_size(g.w, g.r, g.stride, g.pad, 1);
        auto dy = f.random({g.n, ho, wo, g.k});
        Tensor<float, Cpu> dx(x.shape()), dw(w.shape());
        KH::conv2d_backward(f.cpu, ddp::kernels::Conv2dBackwardArgs<float, Cpu>{
                                       .x = x.cview(), .w = w.cview(), .dy = dy.cview(), .dx = dx.view(),
                                       .dw = dw.view(), .stride = st, .padding = pd});
        KH::add(f.cpu, dx.cview(), res.cview(), dx.view());
        auto gx = f.up(x), gw = f.up(w), gdy = f.up(dy);
        for (const auto& [prec, tol, name] : {std::tuple{ddp::Precision::Fp32, kFp32, "fp32"},
                                             std::tuple{ddp::Precision::Bf16, kBf16, "bf16"}}) {
          INFO("precision ", name);
          const Exec<Cuda> e = f.stream.exec(prec, false, impl);
          auto gdx = f.up(res), gdw = f.poisoned(w.shape());
          KC::conv2d_backward(e, ddp::kernels::Conv2dBackwardArgs<float, Cuda>{
                                     .x = gx.cview(), .w = gw.cview(), .dy = gdy.cview(), .dx = gdx.view(),
                                     .dw = gdw.view(), .stride = st, .padding = pd, .accumulate_dx = true});
          expect_close(dx, f.down(gdx), tol, "conv2d dx + residual");
          expect_close(dw, f.down(gdw), tol, "conv2d dw beside it");
        }
        const bool own_kernels = impl == ddp::ConvImpl::Own && !(g.r == 1 && g.stride == 1);  // 1x1 s1: cuBLAS
        if (!own_kernels) continue;
        // ddp's implicit GEMM: the same bits as its overwriting dx plus the residual.
        const Exec<Cuda> e = f.stream.exec(ddp::Precision::Fp32, false, impl);
        auto apart = f.poisoned(x.shape()), folded = f.up(res), gres = f.up(res);
        KC::conv2d_backward(e, ddp::kernels::Conv2dBackwardArgs<float, Cuda>{
                                   .x = gx.cview(), .w = gw.cview(), .dy = gdy.cview(), .dx = apart.view(),
                                   .stride = st, .padding = pd});
        KC::add(e, apart.cview(), gres.cview(), apart.view());
        KC::conv2d_backward(e, ddp::kernels::Conv2dBackwardArgs<float, Cuda>{
                                   .x = gx.cview(), .w = gw.cview(), .dy = gdy.cview(), .dx = folded.view(),
                                   .stride = st, .padding = pd, .accumulate_dx = true});
        expect_close(f.down(apart), f.down(folded), 0.0, "own kernels: folded vs apart + add, bit for bit");
      }
  }
}
