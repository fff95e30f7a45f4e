// The modules that compose without backward code (issue 39) on the GPU against the CPU: SiLU, Tanh, Sigmoid,
// Identity and Flatten on their own, then the residual CNN of compose_model.hpp (Sequential, Residual with and
// without a shortcut, Conv2d, BatchNorm2d, ReLU, Dropout, Flatten, Linear, nested Sequential): one training
// forward and backward from the same weights and input.
// SPDX-License-Identifier: MIT
//
// Tolerances: the element-wise activations |gpu - cpu| <= 1e-6 (|cpu| + max|cpu|) (the device's expf/tanhf
// against glibc's, a few ulps); Identity and Flatten are copies, exact. The CNN as tests/unit/nn/test_cuda_resnet.cu:
// both fp32 paths against a float64 CPU model, the GPU's norm-wise relative error within 2x the CPU's plus 1e-4
// per tensor (a wrong kernel or wiring is off by O(1)). Dropout is on (p = 0.5): its mask is a function of (seed,
// rank, stream, step, index), the same on both devices (docs/decisions/0043). Skips (exit 77) without a GPU;
// without one CI compiles this file to PTX only (tests/CMakeLists.txt).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/stream.hpp>

#include "compose_model.hpp"
#include "random_tensor.hpp"
#include "support/gpu.hpp"
#include "support/tolerance.hpp"

namespace test_cuda_compose {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Shape;
using ddp::Tensor;

struct Devices {
  ddp::Stream stream;
  Exec<Cuda> gpu = stream.exec(ddp::Precision::Fp32);  // exact fp32 kernels
  ddp::kernels::cpu::ThreadPool pool{2};
  Exec<Cpu> cpu{.pool = &pool};

  template <class T>
  Tensor<T, Cuda> up(const Tensor<T, Cpu>& t) {
    return ddp::to<Cuda>(t.cview(), gpu);
  }
  template <class T>
  Tensor<T, Cpu> down(const Tensor<T, Cuda>& t) {
    return ddp::to<Cpu>(t.cview(), gpu);
  }
};

// Forward and backward of the same module type on both devices, on x and dy of the output's shape.
template <template <class, ddp::Device, class...> class M, class... A>
void check_module(Devices& d, const Tensor<float, Cpu>& x, double rtol, A... args) {
  M<float, Cpu> mc(args...);
  M<float, Cuda> mg(args...);
  CAPTURE(mc.describe());
  auto gx = d.up(x);
  auto yc = mc.forward(d.cpu, x.cview());
  auto yg = mg.forward(d.gpu, gx.cview());
  REQUIRE(yg.shape() == yc.shape());
  CHECK(ddp::test::tolerance_excess(yc, d.down(yg), rtol) <= 0.0);
  const auto dy = ddp::test::randn<float>(yc.shape(), 5);
  auto gdy = d.up(dy);
  auto dxc = mc.backward(d.cpu, dy.cview());
  auto dxg = mg.backward(d.gpu, gdy.cview());
  REQUIRE(dxg.shape() == x.shape());
  CHECK(ddp::test::tolerance_excess(dxc, d.down(dxg), rtol) <= 0.0);
}

// ||got - ref|| / ||ref|| (0 when both are zero).
template <class T>
double relative_error(const Tensor<T, Cpu>& got, const Tensor<double, Cpu>& ref) {
  double num = 0.0, den = 0.0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double e = static_cast<double>(got.data()[i]) - ref.data()[i];
    num += e * e;
    den += ref.data()[i] * ref.data()[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}
void compare(const std::string& what, const Tensor<float, Cpu>& gpu, const Tensor<float, Cpu>& cpu,
             const Tensor<double, Cpu>& f64) {
  const double eg = relative_error(gpu, f64), ec = relative_error(cpu, f64);
  INFO(what, ": GPU ", eg, ", CPU ", ec, " from float64");
  CHECK(eg <= 2.0 * ec + 1e-4);
}

void check_model() {
  Devices d;
  auto mc = ddp::test::make_compose_model<float, Cpu>(0.5);
  auto mg = ddp::test::make_compose_model<float, Cuda>(0.5);
  auto md = ddp::test::make_compose_model<double, Cpu>(0.5);
  auto pc = mc->parameters();
  auto pg = mg->parameters();
  auto pd = md->parameters();
  REQUIRE(pc.size() == pg.size());
  REQUIRE(pc.size() == pd.size());
  for (std::size_t i = 0; i < pc.size(); ++i) {  // the same weights: float, and float64 of those floats
    const auto w = ddp::test::randn<float>(pc[i]->shape(), 200 + i, 0.0, 0.5);
    std::copy(w.data(), w.data() + w.numel(), pc[i]->value().data());
    pg[i]->value() = d.up(w);
    for (std::int64_t j = 0; j < w.numel(); ++j) pd[i]->value().data()[j] = w.data()[j];
  }
  const auto x = ddp::test::randn<float>({2, 8, 8, 3}, 210);
  Tensor<double, Cpu> xd(x.shape());
  for (std::int64_t j = 0; j < x.numel(); ++j) xd.data()[j] = x.data()[j];
  auto gx = d.up(x);
  mc->zero_grad();
  mg->zero_grad();
  md->zero_grad();
  auto yc = mc->forward(d.cpu, x.cview());
  auto yg = mg->forward(d.gpu, gx.cview());
  auto yd = md->forward(d.cpu, xd.cview());
  compare("y", d.down(yg), yc, yd);
  const auto dy = ddp::test::randn<float>(yc.shape(), 211);
  Tensor<double, Cpu> dyd(dy.shape());
  for (std::int64_t j = 0; j < dy.numel(); ++j) dyd.data()[j] = dy.data()[j];
  auto gdy = d.up(dy);
  auto dxc = mc->backward(d.cpu, dy.cview());
  auto dxg = mg->backward(d.gpu, gdy.cview());
  auto dxd = md->backward(d.cpu, dyd.cview());
  compare("dx", d.down(dxg), dxc, dxd);
  for (std::size_t i = 0; i < pc.size(); ++i)
    compare(pc[i]->name() + " gradient", d.down(pg[i]->grad()), pc[i]->grad(), pd[i]->grad());
  auto bc = mc->buffers();
  auto bg = mg->buffers();
  auto bd = md->buffers();
  REQUIRE(bc.size() == bg.size());
  for (std::size_t i = 0; i < bc.size(); ++i) {
    INFO(bc[i]->name());
    if (bc[i]->is_integer())
      CHECK(d.down(bg[i]->count()).data()[0] == bc[i]->count().data()[0]);
    else
      compare(bc[i]->name(), d.down(bg[i]->real()), bc[i]->real(), bd[i]->real());
  }
}

}  // namespace test_cuda_compose

namespace tcc = test_cuda_compose;

TEST_SUITE("nn_cuda") {
  TEST_CASE("SiLU, Tanh, Sigmoid, Mish, Identity and Flatten on the GPU match the CPU") {
    if (ddp::test::skip_without_gpu()) return;
    tcc::Devices d;
    const auto x = ddp::test::randn<float>({3, 5, 7, 6}, 1, 0.0, 3.0);  // NHWC images
    tcc::check_module<ddp::nn::SiLU>(d, x, 1e-6);
    tcc::check_module<ddp::nn::Tanh>(d, x, 1e-6);
    tcc::check_module<ddp::nn::Sigmoid>(d, x, 1e-6);
    tcc::check_module<ddp::nn::Mish>(d, x, 1e-6);
    tcc::check_module<ddp::nn::Identity>(d, x, 0.0);
    tcc::check_module<ddp::nn::Flatten>(d, x, 0.0);        // permuted to NCHW order
    tcc::check_module<ddp::nn::Flatten>(d, x, 0.0, 2, 3);  // (N, C, H * W)
    const auto seq = ddp::test::randn<float>({4, 6, 9}, 2);
    tcc::check_module<ddp::nn::Flatten>(d, seq, 0.0, 0, 1);  // a plain reshape
  }

  TEST_CASE("a residual CNN of composed modules: one training forward and backward on the GPU match the CPU") {
    if (ddp::test::skip_without_gpu()) return;
    tcc::check_model();
  }
}
