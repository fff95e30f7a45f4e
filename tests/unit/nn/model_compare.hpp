// Comparing whole models across element types: the same parameters in, flat double vectors out.
// SPDX-License-Identifier: MIT
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <doctest/doctest.h>

#include <ddp/core/dtype.hpp>
#include <ddp/tensor/tensor.hpp>

namespace ddp::test {

// A host tensor's values as doubles (bfloat16, float or double).
template <class T>
std::vector<double> as_doubles(const Tensor<T, Cpu>& x) {
  std::vector<double> out(static_cast<std::size_t>(x.numel()));
  for (std::int64_t i = 0; i < x.numel(); ++i) out[static_cast<std::size_t>(i)] = static_cast<double>(float(x.data()[i]));
  return out;
}
inline std::vector<double> as_doubles(const Tensor<double, Cpu>& x) { return {x.data(), x.data() + x.numel()}; }

// ||got - ref|| / ||ref|| (the plain norm of got - ref when ref is zero).
inline double rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Every parameter of host model `from` into host model `to` (same architecture, any parameter types).
template <class M1, class M2>
void copy_parameters(M1& from, M2& to) {
  auto pf = from.parameters();
  auto pt = to.parameters();
  REQUIRE(pf.size() == pt.size());
  for (std::size_t i = 0; i < pf.size(); ++i) {
    REQUIRE(pf[i]->value().shape() == pt[i]->value().shape());
    for (std::int64_t j = 0; j < pf[i]->value().numel(); ++j)
      pt[i]->value().data()[j] = static_cast<typename M2::value_type>(pf[i]->value().data()[j]);
  }
}

}  // namespace ddp::test
