// set_grad: a parameter's gradient written by hand, as backward would leave it (the optimizer tests' input).
// SPDX-License-Identifier: MIT
#pragma once

#include <vector>

#include <ddp/nn/parameter.hpp>

namespace ddp::test {

// p's gradient becomes g (zero-padded to p's size) and counts as written (has_grad(): torch's .grad is not None).
inline void set_grad(nn::Parameter<float, Cpu>& p, const std::vector<float>& g) {
  p.zero_grad();
  for (std::size_t i = 0; i < g.size(); ++i) p.grad().data()[i] = g[i];
  p.set_grad_written();
}

}  // namespace ddp::test
