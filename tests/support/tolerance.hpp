// The tolerance of the GPU-against-CPU tests: |got - ref| <= rtol * (|ref| + max|ref|) per element.
// SPDX-License-Identifier: MIT
//
// The max|ref| term lets elements near zero (whose relative error means nothing) pass at the tensor's scale.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <ddp/tensor/tensor.hpp>

namespace ddp::test {

// Largest |got - ref| - rtol (|ref| + max|ref|) over the tensors (same shape); <= 0 means every element is within
// tolerance, +inf that one is NaN.
template <class T>
double tolerance_excess(const Tensor<T, Cpu>& ref, const Tensor<T, Cpu>& got, double rtol) {
  double scale = 0.0, worst = -1.0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) scale = std::max(scale, std::fabs(double(ref.data()[i])));
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data()[i], g = got.data()[i];
    const double e = std::fabs(r - g) - rtol * (std::fabs(r) + scale);
    if (!(e <= worst)) worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
  }
  return worst;
}

}  // namespace ddp::test
