// CPU losses with mean reduction: softmax cross-entropy (optional label smoothing) and MSE; value
// and gradient.
// SPDX-License-Identifier: MIT
//
// Cross-entropy, PyTorch's formula (see CrossEntropyArgs): per row i with logits z and label y,
//   lse = max(z) + log sum_c exp(z_c - max(z))           (stable log-sum-exp)
//   nll_i = lse - z_y;  smooth_i = sum_c (lse - z_c) = C lse - sum_c z_c
//   loss = mean_i [(1 - s) nll_i + (s / C) smooth_i],   dz_c = (softmax_c - (1 - s) [c == y] - s /
//     C) / N
// Example: C = 2, z = (0, 0), y = 1, s = 0: softmax (0.5, 0.5), loss = log 2, dz = (0.5, -0.5) / N.
// Every label is checked before any math: the first one outside [0, C) is a ValueError naming it.
// Rows are spread over threads; each row's terms are summed in double, the mean in row order.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
double cross_entropy(const Exec<Cpu>& exec, const CrossEntropyArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t n = a.logits.dim(0), c = a.logits.dim(1);
  for (std::int64_t i = 0; i < n; ++i)
    if (a.labels.data()[i] < 0 || a.labels.data()[i] >= c)
      throw label_out_of_range(a.labels.data()[i], i, c);
  const double s = a.label_smoothing;
  std::vector<double> row_loss(static_cast<std::size_t>(n));
  parallel_for(exec, n, 16, [&](std::int64_t i0, std::int64_t i1, int) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const T* z = a.logits.data() + i * c;
      const std::int64_t y = a.labels.data()[i];
      double mx = static_cast<double>(z[0]);
      for (std::int64_t k = 1; k < c; ++k) mx = std::max(mx, static_cast<double>(z[k]));
      double sum_exp = 0.0, sum_z = 0.0;
      for (std::int64_t k = 0; k < c; ++k) {
        sum_exp += std::exp(static_cast<double>(z[k]) - mx);
        sum_z += static_cast<double>(z[k]);
      }
      const double lse = mx + std::log(sum_exp);
      const double nll = lse - static_cast<double>(z[y]);
      const double smooth = static_cast<double>(c) * lse - sum_z;
      row_loss[static_cast<std::size_t>(i)] = (1.0 - s) * nll + s / static_cast<double>(c) * smooth;
      if (!a.dlogits.empty()) {
        T* dz = a.dlogits.data() + i * c;
        for (std::int64_t k = 0; k < c; ++k) {
          const double p = std::exp(static_cast<double>(z[k]) - lse);
          const double target = (k == y ? 1.0 - s : 0.0) + s / static_cast<double>(c);
          dz[k] = static_cast<T>((p - target) / static_cast<double>(n));
        }
      }
    }
  });
  double total = 0.0;
  for (double l : row_loss) total += l;
  return total / static_cast<double>(n);
}

template <class T>
double mse(const Exec<Cpu>& exec, const MseArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t n = a.x.numel();
  const T* x = a.x.data();
  const T* t = a.target.data();
  std::vector<double> part(static_cast<std::size_t>(num_threads(exec)), 0.0);
  parallel_for(exec, n, 4096, [&](std::int64_t i0, std::int64_t i1, int chunk) {
    double acc = 0.0;
    for (std::int64_t i = i0; i < i1; ++i) {
      const double d = static_cast<double>(x[i]) - static_cast<double>(t[i]);
      acc += d * d;
      if (!a.dx.empty()) a.dx.data()[i] = static_cast<T>(2.0 * d / static_cast<double>(n));
    }
    part[static_cast<std::size_t>(chunk)] = acc;
  });
  double total = 0.0;
  for (double p : part) total += p;
  return total / static_cast<double>(n);
}

}  // namespace ddp::kernels::cpu
