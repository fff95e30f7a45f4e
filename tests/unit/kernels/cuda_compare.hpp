// Shared helpers of the CUDA kernel tests: a fixture that uploads the same random inputs to both devices,
// NaN-poisoned GPU outputs, and the tolerance check |gpu - cpu| <= rtol * (|cpu| + max|cpu|).
// SPDX-License-Identifier: MIT
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

namespace ddp::test::cuda_kernels {

using ddp::Cpu;
using ddp::Cuda;
using ddp::Exec;
using ddp::Shape;
using ddp::Tensor;
using ddp::kernels::Kernels;
using ddp::kernels::Size2;
using KC = Kernels<Cuda>;
using KH = Kernels<Cpu>;

struct Fixture {
  ddp::Stream stream;
  Exec<Cuda> gpu = stream.exec(ddp::Precision::Fp32);  // exact fp32: the 1e-5 comparisons
  Exec<Cpu> cpu{};
  std::uint64_t seed = std::random_device{}();
  ddp::Generator gen{seed};

  Tensor<float, Cpu> random(Shape s, double lo = -1.0, double hi = 1.0) {
    Tensor<float, Cpu> t(s);
    gen.fill_uniform(t.view(), lo, hi);
    return t;
  }
  template <class T>
  Tensor<T, Cuda> up(const Tensor<T, Cpu>& t) {
    return ddp::to<Cuda>(t.cview(), gpu);
  }
  template <class T>
  Tensor<T, Cpu> down(const Tensor<T, Cuda>& t) {
    return ddp::to<Cpu>(t.cview(), gpu);
  }
  // A GPU tensor whose every element is NaN (or -1 for integers): unwritten outputs cannot pass.
  template <class T = float>
  Tensor<T, Cuda> poisoned(Shape s) {
    Tensor<T, Cuda> t(s);
    if constexpr (std::is_floating_point_v<T>)
      KC::fill(gpu, t.view(), std::numeric_limits<T>::quiet_NaN());
    else
      KC::fill(gpu, t.view(), T(-1));
    return t;
  }
};

// Every element within rtol * (|ref| + max|ref|) of the CPU's; reports the worst one.
inline void expect_close(const Tensor<float, Cpu>& ref, const Tensor<float, Cpu>& got, double rtol, const char* what) {
  REQUIRE(ref.shape() == got.shape());
  double scale = 0.0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) scale = std::max(scale, std::fabs(double(ref.data()[i])));
  std::int64_t worst = -1;
  double worst_excess = 0.0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data()[i], g = got.data()[i];
    const double excess = std::fabs(r - g) - rtol * (std::fabs(r) + scale);
    if (!(excess <= 0.0) && (worst < 0 || !(excess <= worst_excess))) {
      worst = i;
      worst_excess = excess;
    }
  }
  INFO(what, ": worst element ", worst,
       (worst >= 0 ? " cpu " + std::to_string(ref.data()[worst]) + " gpu " + std::to_string(got.data()[worst])
                   : std::string()));
  CHECK(worst == -1);
}

inline constexpr double kFp32 = 1e-5;
inline constexpr double kTf32 = 1e-3;
inline constexpr double kBf16 = 1e-2;
inline constexpr double kFp16 = 1e-3;

}  // namespace ddp::test::cuda_kernels
