// A CPU tensor of normal samples for the nn tests, drawn from the data stream of Generator(seed).
// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>

#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

namespace ddp::test {

template <class T = float>
Tensor<T, Cpu> randn(Shape s, std::uint64_t seed, double mean = 0.0, double stddev = 1.0) {
  Tensor<T, Cpu> t(s);
  Generator g(seed, 0, kStreamData);
  g.fill_normal(t.view(), mean, stddev);
  return t;
}

}  // namespace ddp::test
