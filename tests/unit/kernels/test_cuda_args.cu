// Host-side checks of the GPU-path additions (no GPU needed): the --precision flag, Exec<Cuda>'s defaults,
// and the argument checks of the fused, multi-tensor and max-pool kernels, which throw before any launch.
// SPDX-License-Identifier: MIT
//
// The file name sorts before test_cuda_kernels.cu on purpose: doctest runs files in name order and the
// first GPU case exits 77 without a device, so host-only cases must come first to run everywhere.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <ddp/kernels/fused_args.hpp>
#include <ddp/tensor/precision.hpp>

#include "support/gpu.hpp"
#include "unit/kernels/cuda_compare.hpp"

using namespace ddp::test::cuda_kernels;  // NOLINT: test file
namespace kn = ddp::kernels;

TEST_SUITE("kernels_cuda_args") {
  // ---- host-side behaviour: runs without a GPU ----
  TEST_CASE("--precision parses fp32, tf32, bf16 and names the flag otherwise; the GPU default is tf32") {
    CHECK(ddp::parse_precision("fp32") == ddp::Precision::Fp32);
    CHECK(ddp::parse_precision("tf32") == ddp::Precision::Tf32);
    CHECK(ddp::parse_precision("bf16") == ddp::Precision::Bf16);
    CHECK(ddp::precision_name(ddp::Precision::Bf16) == "bf16");
    CHECK(ddp::precision_name(ddp::Precision::Fp16) == "fp16");
    CHECK_THROWS_AS(ddp::parse_precision("fp16"), ddp::ConfigError);  // GEMMs only: not a --precision for convs
    CHECK_THROWS_WITH_AS(ddp::parse_precision("fp16"),
                         "ddp: unknown --precision 'fp16'; valid: fp32, tf32 (the GPU default), bf16",
                         ddp::ConfigError);
    CHECK(Exec<Cuda>{}.precision == ddp::Precision::Tf32);
    CHECK(!Exec<Cuda>{}.deterministic);
  }

  TEST_CASE("fused and multi-tensor ops reject bad arguments on the host before any launch") {
    std::vector<float> mem(4096);
    auto view = [&](Shape s) { return ddp::TensorView<float, Cuda>(mem.data(), s); };
    auto cview = [&](Shape s) { return ddp::TensorView<const float, Cuda>(mem.data(), s); };
    const Exec<Cuda> e{};
    const Shape xs{2, 3, 3, 4}, cs{4};
    const kn::BatchNormForwardArgs<float, Cuda> bn{.x = cview(xs),
                                                   .gamma = cview(cs),
                                                   .beta = cview(cs),
                                                   .running_mean = view(cs),
                                                   .running_var = view(cs),
                                                   .y = view(xs),
                                                   .save_mean = view(cs),
                                                   .save_invstd = view(cs)};
    CHECK_THROWS_WITH_AS(KC::batchnorm_act_forward(
                             e, kn::BatchNormActForwardArgs<float, Cuda>{.bn = bn, .residual = cview({2, 3, 3, 5})}),
                         "ddp: batchnorm_act_forward: residual has shape (2, 3, 3, 5) but must be (2, 3, 3, 4)",
                         ddp::ValueError);
    const kn::BatchNormBackwardArgs<float, Cuda> bb{.x = cview(xs),
                                                    .dy = cview(xs),
                                                    .gamma = cview(cs),
                                                    .save_mean = cview(cs),
                                                    .save_invstd = cview(cs),
                                                    .dx = view(xs)};
    CHECK_THROWS_WITH_AS(KC::batchnorm_act_backward(e, kn::BatchNormActBackwardArgs<float, Cuda>{.bn = bb}),
                         "ddp: batchnorm_act_backward: relu = true needs the forward output y (the ReLU mask)",
                         ddp::ValueError);
    const kn::SgdTensor<float> t{.param = mem.data(), .grad = mem.data(), .momentum_buffer = nullptr, .numel = 10};
    CHECK_THROWS_WITH_AS(
        KC::sgd_step_multi(e, kn::MultiSgdArgs<float, Cuda>{.tensors = {&t, 1}, .lr = 0.1, .momentum = 0.9}),
        "ddp: sgd_step_multi: tensor 0 (10 elements) needs param and grad pointers, and a momentum buffer when "
        "momentum != 0",
        ddp::ValueError);
    CHECK_THROWS_WITH_AS(
        KC::max_pool2d_backward(
            e,
            kn::MaxPool2dBackwardArgs<float, Cuda>{.dy = cview({1, 4, 4, 2}),
                                                   .argmax = ddp::TensorView<const std::int32_t, Cuda>(
                                                       reinterpret_cast<std::int32_t*>(mem.data()), Shape{1, 4, 4, 2}),
                                                   .dx = view({1, 8, 8, 2}),
                                                   .kernel = {3, 3},
                                                   .stride = {1, 1},
                                                   .padding = {1, 1}}),
        "ddp: max_pool2d_backward: kernel (3, 3), stride (1, 1) and padding (1, 1) give a 8x8 output for dx (1, 8, 8, "
        "2) but dy is (1, 4, 4, 2); pass the forward's window geometry",
        ddp::ValueError);
  }
}
