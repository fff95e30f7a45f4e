// kernels/cuda/op_profile.cuh on the device: ops run under a CudaOpProfiling guard come back under their
// classes and phases (which library ran a conv, BatchNorm's passes), each once, with device times that add up
// to at most the host's wall time of the span; without the guard nothing is recorded.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>

#include <ddp/kernels/cuda/op_profile.cuh>
#include <ddp/kernels/op_profile.hpp>
#include <ddp/tensor/conv_impl.hpp>

#include "support/gpu.hpp"
#include "unit/kernels/cuda_compare.hpp"

namespace test_cuda_op_profile {
using namespace ddp::test::cuda_kernels;  // NOLINT: test file
namespace kn = ddp::kernels;
}  // namespace test_cuda_op_profile

TEST_SUITE("kernels_cuda_op_profile") {
  TEST_CASE("op profile: conv, BatchNorm and add under the profiler come back by class and phase") {
    using namespace test_cuda_op_profile;
    if (ddp::test::skip_without_gpu()) return;
    Fixture f;
    const auto x = f.up(f.random({2, 8, 8, 16}));
    const auto w3 = f.up(f.random({16, 3, 3, 16})), w1 = f.up(f.random({32, 1, 1, 16}));
    auto y3 = f.poisoned({2, 8, 8, 16}), y1 = f.poisoned({2, 8, 8, 32}), yb = f.poisoned({2, 8, 8, 16});
    const auto gamma = f.up(f.random({16})), beta = f.up(f.random({16}));
    auto rm = f.up(f.random({16})), rv = f.up(f.random({16}, 0.5, 1.5));
    auto sm = f.poisoned({16}), si = f.poisoned({16});
    auto run_ops = [&] {
      KC::conv2d_forward(f.gpu, kn::Conv2dForwardArgs<float, Cuda>{
                                    .x = x.cview(), .w = w3.cview(), .y = y3.view(), .padding = {1, 1}});
      KC::conv2d_forward(f.gpu, kn::Conv2dForwardArgs<float, Cuda>{.x = x.cview(), .w = w1.cview(), .y = y1.view()});
      KC::batchnorm_forward(f.gpu, kn::BatchNormForwardArgs<float, Cuda>{.x = y3.cview(),
                                                                         .gamma = gamma.cview(),
                                                                         .beta = beta.cview(),
                                                                         .running_mean = rm.view(),
                                                                         .running_var = rv.view(),
                                                                         .y = yb.view(),
                                                                         .save_mean = sm.view(),
                                                                         .save_invstd = si.view()});
      KC::add<float>(f.gpu, yb.cview(), x.cview(), yb.view());
    };

    kn::cuda::CudaOpProfiler profiler;
    kn::OpProfile profile;
    run_ops();  // no guard: nothing recorded
    profiler.collect(profile, 1);
    CHECK(profile.steps() == 0);
    CHECK(profile.entries().empty());

    f.stream.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    {
      const kn::cuda::CudaOpProfiling on(profiler);
      run_ops();
    }
    profiler.collect(profile, 1);  // waits for the last event
    const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CHECK(kn::cuda::active_op_profiler() == nullptr);  // the guard restored "off"

    std::map<std::string, kn::OpProfile::Entry> by_label;
    double sum = 0.0;
    for (const auto& e : profile.entries()) {
      CHECK(e.ms >= 0.0);
      sum += e.ms;
      by_label[e.label] = e;
    }
    const std::string conv3 =
        ddp::resolve_conv_impl(ddp::ConvImpl::Auto) == ddp::ConvImpl::Own ? "conv.fprop.own" : "conv.fprop.cudnn";
    for (const std::string& label : {conv3, std::string("conv.fprop.cublas"), std::string("bn_forward.stats"),
                                    std::string("bn_forward.finalize"), std::string("bn_forward.apply"),
                                    std::string("add")}) {
      CAPTURE(label);
      REQUIRE(by_label.count(label) == 1);
      CHECK(by_label[label].calls == 1);
    }
    CHECK(by_label["conv"].calls == 2);  // the stretch of each conv before its library is known
    CHECK(profile.total_ms() == doctest::Approx(sum));
    CHECK(profile.total_ms() > 0.0);
    CHECK(profile.total_ms() <= wall_ms + 0.05);  // device time inside the host's span (event resolution ~0.5 us)
  }
}
