// Whole ResNets on the GPU against the CPU path: identical initial weights, then one training step's
// forward (logits, loss), backward (every parameter's gradient), BatchNorm running statistics and the
// SGD update. Both run the same module code (Kernels<D>): the GPU's BatchNorm + ReLU (+ residual) is one
// fused kernel and its multi-tensor SGD one launch, the CPU's the unfused passes in a row, so this also
// checks the fused kernels' wiring.
// SPDX-License-Identifier: MIT
//
// Tolerance: each kernel matches the CPU to ~1e-6 relative (tests/unit/kernels/test_cuda_kernels.cu);
// through 20-50 layers of training-mode BatchNorm the differences grow, so whole-network values are
// compared with |gpu - cpu| <= 1e-3 * (|cpu| + max|cpu|) per tensor. Skips (exit 77) without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/random.hpp>

#include "support/gpu.hpp"
#include "support/tolerance.hpp"

namespace {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Tensor;

using ddp::test::tolerance_excess;  // <= 0: within rtol (|cpu| + max|cpu|) everywhere

void compare_one_step(const std::string& arch) {
  ddp::Stream stream;
  Exec<Cuda> gpu = stream.exec(ddp::Precision::Fp32);  // exact fp32 kernels: the 1e-3 whole-network bound
  ddp::kernels::cpu::ThreadPool pool(2);
  Exec<Cpu> cpu{.pool = &pool};
  const std::uint64_t seed = std::random_device{}();
  INFO(arch, " seed ", seed);
  const ddp::nn::ResNetOptions o{.arch = arch, .num_classes = 10, .seed = 7};
  ddp::nn::ResNet<float, Cpu> mc(o);
  ddp::nn::ResNet<float, Cuda> mg(o);
  auto pc = mc.parameters();
  auto pg = mg.parameters();
  REQUIRE(pc.size() == pg.size());
  for (std::size_t i = 0; i < pc.size(); ++i) {  // same initialisation, bit for bit
    INFO(pc[i]->name());
    CHECK(tolerance_excess(pc[i]->value(), ddp::to<Cpu>(pg[i]->value().cview(), gpu), 0.0) <= 0.0);
  }

  const std::int64_t n = 3;
  Tensor<float, Cpu> x({n, 40, 36, 3});
  ddp::Generator(seed).fill_normal(x.view(), 0.0, 1.0);
  Tensor<std::int64_t, Cpu> labels({n});
  for (std::int64_t i = 0; i < n; ++i) labels.data()[i] = (i * 7 + static_cast<std::int64_t>(seed % 10)) % 10;
  auto gx = ddp::to<Cuda>(x.cview(), gpu);
  auto glabels = ddp::to<Cuda>(labels.cview(), gpu);

  auto yc = mc.forward(cpu, x.cview());
  auto yg = mg.forward(gpu, gx.cview());
  CHECK(tolerance_excess(yc, ddp::to<Cpu>(yg.cview(), gpu), 1e-3) <= 0.0);
  Tensor<float, Cpu> dyc(yc.shape());
  Tensor<float, Cuda> dyg(yc.shape());
  const double lc = ddp::kernels::Kernels<Cpu>::cross_entropy(
      cpu, ddp::kernels::CrossEntropyArgs<float, Cpu>{.logits = yc.cview(), .labels = labels.cview(),
                                                       .dlogits = dyc.view()});
  const double lg = ddp::kernels::Kernels<Cuda>::cross_entropy(
      gpu, ddp::kernels::CrossEntropyArgs<float, Cuda>{.logits = yg.cview(), .labels = glabels.cview(),
                                                        .dlogits = dyg.view()});
  CHECK(lg == doctest::Approx(lc).epsilon(1e-4));
  mc.backward(cpu, dyc.cview());
  mg.backward(gpu, dyg.cview());
  for (std::size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i]->name());
    CHECK(tolerance_excess(pc[i]->grad(), ddp::to<Cpu>(pg[i]->grad().cview(), gpu), 1e-3) <= 0.0);
  }
  // One SGD step with momentum and weight decay: optim::SGD's multi-tensor launch against per-tensor CPU steps.
  const ddp::optim::SgdOptions so{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4};
  ddp::optim::SGD<float, Cpu> oc(mc, so);
  ddp::optim::SGD<float, Cuda> og(mg, so);
  oc.step(cpu);
  og.step(gpu);
  for (std::size_t i = 0; i < pc.size(); ++i) {
    INFO(pc[i]->name(), " after the SGD step");
    CHECK(tolerance_excess(pc[i]->value(), ddp::to<Cpu>(pg[i]->value().cview(), gpu), 1e-3) <= 0.0);
  }
  auto bc = mc.buffers();
  auto bg = mg.buffers();
  REQUIRE(bc.size() == bg.size());
  for (std::size_t i = 0; i < bc.size(); ++i) {
    INFO(bc[i]->name());
    if (bc[i]->is_integer()) {
      CHECK(ddp::to<Cpu>(bg[i]->count().cview(), gpu).data()[0] == bc[i]->count().data()[0]);
    } else {
      CHECK(tolerance_excess(bc[i]->real(), ddp::to<Cpu>(bg[i]->real().cview(), gpu), 1e-4) <= 0.0);
    }
  }
}

}  // namespace

TEST_SUITE("nn_cuda") {
  TEST_CASE("resnet18: one training step on the GPU matches the CPU") {
    if (ddp::test::skip_without_gpu()) return;
    compare_one_step("resnet18");
  }
  TEST_CASE("resnet50: one training step on the GPU matches the CPU") {
    if (ddp::test::skip_without_gpu()) return;
    compare_one_step("resnet50");
  }
}
