// CPU layer normalisation over the last dimension (torch.nn.LayerNorm): forward and backward.
// SPDX-License-Identifier: MIT
//
// How it works. x (M, C) is M independent rows (a (B, T, C) activation seen as (B*T, C)). Forward,
// per row:
//   mean = sum x / C;  var = sum (x - mean)^2 / C (two passes in double: no cancellation);  rstd =
//     1 / sqrt(var + eps)
//   y = (x rstd - mean rstd) * weight + bias          (torch 1.13's order of operations, in
//     LayerNormStat<T>)
// mean and rstd are kept per row for backward. Backward, with xhat = (x - mean) rstd and g = dy *
// weight:
//   dx = rstd (g - sum g / C - xhat sum (g xhat) / C)   (row sums in double)
//   dweight = sum over rows of dy xhat,  dbias = sum over rows of dy
// Example: the row x = (1, 3), eps ~ 0: mean 2, var 1, rstd 1, y = (-1, 1) * weight + bias.
// Threads: forward and dx split the rows; dweight and dbias split the columns, each thread summing
// all rows of its columns in row order, so the parameter gradients have the same bits for every
// thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/layer_norm_args.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
void layer_norm_forward(const Exec<Cpu>& exec, const LayerNormForwardArgs<T, Cpu>& a) {
  validate(a);
  using S = LayerNormStat<T>;
  const std::int64_t m = a.x.dim(0), c = a.x.dim(1);
  const T* w = a.weight.empty() ? nullptr : a.weight.data();
  const T* b = a.bias.empty() ? nullptr : a.bias.data();
  parallel_for(
      exec, m, std::max<std::int64_t>(1, 16384 / c), [&](std::int64_t r0, std::int64_t r1, int) {
        for (std::int64_t r = r0; r < r1; ++r) {
          const T* x = a.x.data() + r * c;
          T* y = a.y.data() + r * c;
          double sum = 0;
          for (std::int64_t j = 0; j < c; ++j) sum += static_cast<double>(x[j]);
          const double mean = sum / static_cast<double>(c);
          double sq = 0;
          for (std::int64_t j = 0; j < c; ++j) {
            const double d = static_cast<double>(x[j]) - mean;
            sq += d * d;
          }
          const auto mean_s = static_cast<S>(mean);
          const auto rstd_s = static_cast<S>(1.0 / std::sqrt(sq / static_cast<double>(c) + a.eps));
          a.mean.data()[r] = mean_s;
          a.rstd.data()[r] = rstd_s;
          const S shift = -rstd_s * mean_s;
          if (w && b) {
            for (std::int64_t j = 0; j < c; ++j)
              y[j] = static_cast<T>((static_cast<S>(x[j]) * rstd_s + shift) * static_cast<S>(w[j]) +
                                    static_cast<S>(b[j]));
          } else {
            for (std::int64_t j = 0; j < c; ++j) {
              S v = static_cast<S>(x[j]) * rstd_s + shift;
              if (w) v = v * static_cast<S>(w[j]);
              if (b) v = v + static_cast<S>(b[j]);
              y[j] = static_cast<T>(v);
            }
          }
        }
      });
}

template <class T>
void layer_norm_backward(const Exec<Cpu>& exec, const LayerNormBackwardArgs<T, Cpu>& a) {
  validate(a);
  using S = LayerNormStat<T>;
  const std::int64_t m = a.x.dim(0), c = a.x.dim(1);
  const T* w = a.weight.empty() ? nullptr : a.weight.data();
  const S* mean = a.mean.data();
  const S* rstd = a.rstd.data();
  if (!a.dx.empty()) {
    parallel_for(
        exec, m, std::max<std::int64_t>(1, 16384 / c), [&](std::int64_t r0, std::int64_t r1, int) {
          for (std::int64_t r = r0; r < r1; ++r) {
            const T* x = a.x.data() + r * c;
            const T* dy = a.dy.data() + r * c;
            T* dx = a.dx.data() + r * c;
            const S mu = mean[r], rs = rstd[r];
            double sum_g = 0, sum_gx = 0;
            for (std::int64_t j = 0; j < c; ++j) {
              const S g = w ? static_cast<S>(dy[j]) * static_cast<S>(w[j]) : static_cast<S>(dy[j]);
              const S xhat = (static_cast<S>(x[j]) - mu) * rs;
              sum_g += static_cast<double>(g);
              sum_gx += static_cast<double>(g) * static_cast<double>(xhat);
            }
            const auto mean_g = static_cast<S>(sum_g / static_cast<double>(c));
            const auto mean_gx = static_cast<S>(sum_gx / static_cast<double>(c));
            for (std::int64_t j = 0; j < c; ++j) {
              const S g = w ? static_cast<S>(dy[j]) * static_cast<S>(w[j]) : static_cast<S>(dy[j]);
              const S xhat = (static_cast<S>(x[j]) - mu) * rs;
              dx[j] = static_cast<T>(rs * (g - mean_g - xhat * mean_gx));
            }
          }
        });
  }
  if (a.dweight.empty() && a.dbias.empty()) return;
  // Columns [c0, c1) per thread; every thread walks all rows in order (deterministic for any thread
  // count).
  parallel_for(exec, c, 32, [&](std::int64_t c0, std::int64_t c1, int) {
    const auto width = static_cast<std::size_t>(c1 - c0);
    std::vector<double> acc_w(a.dweight.empty() ? 0 : width, 0.0),
        acc_b(a.dbias.empty() ? 0 : width, 0.0);
    for (std::int64_t r = 0; r < m; ++r) {
      const T* x = a.x.data() + r * c + c0;
      const T* dy = a.dy.data() + r * c + c0;
      const S mu = mean[r], rs = rstd[r];
      if (!acc_w.empty())
        for (std::size_t j = 0; j < width; ++j)
          acc_w[j] +=
              static_cast<double>(static_cast<S>(dy[j]) * ((static_cast<S>(x[j]) - mu) * rs));
      if (!acc_b.empty())
        for (std::size_t j = 0; j < width; ++j) acc_b[j] += static_cast<double>(dy[j]);
    }
    for (std::size_t j = 0; j < acc_w.size(); ++j)
      a.dweight.data()[c0 + static_cast<std::int64_t>(j)] = static_cast<T>(acc_w[j]);
    for (std::size_t j = 0; j < acc_b.size(); ++j)
      a.dbias.data()[c0 + static_cast<std::int64_t>(j)] = static_cast<T>(acc_b[j]);
  });
}

}  // namespace ddp::kernels::cpu
