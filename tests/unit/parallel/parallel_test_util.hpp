// What the parallel unit tests share: every rank's outcome checked, and parameters compared by name.
// SPDX-License-Identifier: MIT
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include <ddp/nn/loss.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

#include "../comm/comm_harness.hpp"

namespace ddp::test {

// Every rank of run_ranks() finished without an exception (the message of each one that did not).
inline void check_all_ok(const std::vector<std::exception_ptr>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank ", r, ": ", message(errors[r]));
    CHECK(!errors[r]);
  }
}

// Parameter values by name.
using Params = std::map<std::string, std::vector<float>>;

template <class M>
Params snapshot_params(M& m) {
  Params out;
  for (auto* p : m.parameters()) out[p->name()] = std::vector<float>(p->value().data(), p->value().data() + p->numel());
  return out;
}

// max |a - b| / max(1e-3, max |b|) over each tensor; the worst tensor's value.
inline double max_rel_diff(const Params& a, const Params& b) {
  double worst = 0;
  for (const auto& [name, vb] : b) {
    const auto& va = a.at(name);
    double diff = 0, scale = 1e-3;
    for (std::size_t i = 0; i < vb.size(); ++i) {
      diff = std::max(diff, std::abs(double(va[i]) - double(vb[i])));
      scale = std::max(scale, std::abs(double(vb[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// A seeded regression problem: x [n, in] and y [n, out], uniform in [-1, 1] (seed 42, the data stream).
struct RegressionData {
  Tensor<float, Cpu> x, y;
  RegressionData(std::int64_t n, std::int64_t in, std::int64_t out) : x(Shape{n, in}), y(Shape{n, out}) {
    Generator g(42, 0, kStreamData);
    g.fill_uniform(x.view(), -1.0, 1.0);
    g.fill_uniform(y.view(), -1.0, 1.0);
  }
};

// Rows [from, from + n) of a 2-d tensor, as a tensor of their own.
inline Tensor<float, Cpu> rows(const Tensor<float, Cpu>& t, std::int64_t from, std::int64_t n) {
  const std::int64_t w = t.shape()[1];
  Tensor<float, Cpu> r(Shape{n, w});
  std::memcpy(r.data(), t.data() + from * w, static_cast<std::size_t>(n * w) * sizeof(float));
  return r;
}

// forward + MSE + backward of `model` (a module or its DDP wrapper) on rows [from, from + n) of d, with the
// loss gradient scaled by `scale` (1 / world turns a sum over ranks into the mean a reference takes).
template <class M>
void mse_pass(Exec<Cpu>& exec, M& model, const RegressionData& d, std::int64_t from, std::int64_t n,
              float scale = 1.0f) {
  auto x = rows(d.x, from, n);
  auto t = rows(d.y, from, n);
  nn::MSELoss<float, Cpu> mse;
  auto y = model.forward(exec, x.cview());
  mse.forward(exec, y.cview(), t.cview());
  auto dy = mse.backward(exec);
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] *= scale;
  model.backward(exec, dy.cview());
}

}  // namespace ddp::test
