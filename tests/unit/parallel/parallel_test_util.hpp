// What the parallel unit tests share: every rank's outcome checked, and parameters compared by name.
// SPDX-License-Identifier: MIT
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <string>
#include <vector>

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

}  // namespace ddp::test
