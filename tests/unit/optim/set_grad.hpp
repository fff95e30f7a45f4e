// set_grad: a parameter's gradient written by hand, as backward would leave it (the optimizer tests' input).
// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>
#include <vector>

#include <ddp/nn/parameter.hpp>

namespace ddp::test {

// p's gradient becomes g (zero-padded to p's size) and counts as written (has_grad(): torch's .grad is not None).
inline void set_grad(nn::Parameter<float, Cpu>& p, const std::vector<float>& g) {
  p.zero_grad();
  float* d = p.grad().data();
  for (std::int64_t i = 0; i < p.numel(); ++i)  // zero_grad() leaves grad()'s values as they were
    d[i] = static_cast<std::size_t>(i) < g.size() ? g[static_cast<std::size_t>(i)] : 0.f;
  p.set_grad_written();
}

}  // namespace ddp::test
