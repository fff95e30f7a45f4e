// CPU batch normalisation over the channel (last) dimension: training and eval forward, and backward.
// SPDX-License-Identifier: MIT
//
// How it works. x (N, H, W, C) is seen as M = N*H*W rows of C channels, so every pass is a loop over
// rows with the channel loop innermost and contiguous. Training forward:
//   mean_c = sum_m x / M;  var_c = sum_m (x - mean_c)^2 / M   (two passes: no cancellation)
//   y = (x - mean_c) * invstd_c * gamma_c + beta_c,  invstd_c = 1 / sqrt(var_c + eps)
//   running_mean = (1 - momentum) running_mean + momentum mean_c
//   running_var  = (1 - momentum) running_var + momentum var_c * M / (M - 1)   (unbiased, as PyTorch)
// Eval uses running_mean / running_var in place of the batch statistics. Backward (training), with
// xhat = (x - mean) invstd:  dbeta = sum dy,  dgamma = sum dy xhat,
//   dx = gamma invstd (dy - dbeta / M - xhat dgamma / M);   in eval: dx = gamma invstd dy.
// Example: M = 2 values {1, 3} of one channel: mean 2, var 1, invstd ~ 1/sqrt(1 + 1e-5), xhat = {-1, 1};
// running_var moves towards the unbiased 2: 0.9 * 1 + 0.1 * 2 = 1.1.
// Sums are accumulated in double per thread block and combined in block order (deterministic). Backward
// reads all of dy (the sums) before it writes dx, one element from the same element, so dx may alias dy
// (bn_act.hpp relies on that to mask dy in place).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

namespace detail {

// out[c] = sum over rows m of f(m, c, acc) accumulated per block of rows in double; returns per-channel sums.
template <class F>
std::vector<double> channel_sums(const Exec<Cpu>& exec, std::int64_t rows, std::int64_t c, int width, F&& f) {
  const int t = num_threads(exec);
  std::vector<double> part(static_cast<std::size_t>(t * width * c), 0.0);
  parallel_for(exec, rows, 256, [&](std::int64_t m0, std::int64_t m1, int chunk) {
    double* acc = part.data() + static_cast<std::size_t>(chunk) * static_cast<std::size_t>(width * c);
    for (std::int64_t m = m0; m < m1; ++m) f(m, acc);
  });
  std::vector<double> sum(static_cast<std::size_t>(width * c), 0.0);
  for (int b = 0; b < t; ++b)
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[static_cast<std::size_t>(b) * sum.size() + i];
  return sum;
}

}  // namespace detail

template <class T>
void batchnorm_forward(const Exec<Cpu>& exec, const BatchNormForwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  const T* x = a.x.data();
  std::vector<double> mean(static_cast<std::size_t>(c)), invstd(static_cast<std::size_t>(c));
  if (a.training) {
    const auto sum = detail::channel_sums(exec, rows, c, 1, [&](std::int64_t m, double* acc) {
      const T* xm = x + m * c;
      for (std::int64_t k = 0; k < c; ++k) acc[k] += static_cast<double>(xm[k]);
    });
    for (std::int64_t k = 0; k < c; ++k) mean[static_cast<std::size_t>(k)] = sum[static_cast<std::size_t>(k)] / rows;
    const auto sq = detail::channel_sums(exec, rows, c, 1, [&](std::int64_t m, double* acc) {
      const T* xm = x + m * c;
      for (std::int64_t k = 0; k < c; ++k) {
        const double d = static_cast<double>(xm[k]) - mean[static_cast<std::size_t>(k)];
        acc[k] += d * d;
      }
    });
    for (std::int64_t k = 0; k < c; ++k) {
      const auto i = static_cast<std::size_t>(k);
      const double var = sq[i] / rows;
      invstd[i] = 1.0 / std::sqrt(var + a.eps);
      const double unbiased = var * static_cast<double>(rows) / static_cast<double>(rows - 1);
      a.running_mean.data()[k] = static_cast<T>((1.0 - a.momentum) * a.running_mean.data()[k] + a.momentum * mean[i]);
      a.running_var.data()[k] = static_cast<T>((1.0 - a.momentum) * a.running_var.data()[k] + a.momentum * unbiased);
    }
  } else {
    for (std::int64_t k = 0; k < c; ++k) {
      mean[static_cast<std::size_t>(k)] = static_cast<double>(a.running_mean.data()[k]);
      invstd[static_cast<std::size_t>(k)] = 1.0 / std::sqrt(static_cast<double>(a.running_var.data()[k]) + a.eps);
    }
  }
  // y = x * scale + shift with scale = gamma invstd, shift = beta - mean scale (one FMA per element).
  std::vector<T> scale(static_cast<std::size_t>(c)), shift(static_cast<std::size_t>(c));
  for (std::int64_t k = 0; k < c; ++k) {
    const auto i = static_cast<std::size_t>(k);
    const double sc = static_cast<double>(a.gamma.data()[k]) * invstd[i];
    scale[i] = static_cast<T>(sc);
    shift[i] = static_cast<T>(static_cast<double>(a.beta.data()[k]) - mean[i] * sc);
    a.save_mean.data()[k] = static_cast<T>(mean[i]);
    a.save_invstd.data()[k] = static_cast<T>(invstd[i]);
  }
  T* y = a.y.data();
  const T* sc = scale.data();
  const T* sh = shift.data();
  parallel_for(exec, rows, 256, [&](std::int64_t m0, std::int64_t m1, int) {
    for (std::int64_t m = m0; m < m1; ++m)
      for (std::int64_t k = 0; k < c; ++k) y[m * c + k] = x[m * c + k] * sc[k] + sh[k];
  });
}

template <class T>
void batchnorm_backward(const Exec<Cpu>& exec, const BatchNormBackwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  const T* x = a.x.data();
  const T* dy = a.dy.data();
  const T* mean = a.save_mean.data();
  const T* invstd = a.save_invstd.data();
  // sums[0..c) = sum dy, sums[c..2c) = sum dy * xhat
  const auto sums = detail::channel_sums(exec, rows, c, 2, [&](std::int64_t m, double* acc) {
    const T* xm = x + m * c;
    const T* dym = dy + m * c;
    for (std::int64_t k = 0; k < c; ++k) {
      acc[k] += static_cast<double>(dym[k]);
      acc[c + k] += static_cast<double>(dym[k]) * (static_cast<double>(xm[k]) - mean[k]) * invstd[k];
    }
  });
  for (std::int64_t k = 0; k < c; ++k) {
    if (!a.dbeta.empty()) a.dbeta.data()[k] = static_cast<T>(sums[static_cast<std::size_t>(k)]);
    if (!a.dgamma.empty()) a.dgamma.data()[k] = static_cast<T>(sums[static_cast<std::size_t>(c + k)]);
  }
  if (a.dx.empty()) return;
  // dx = k1 * dy + k2 * (x - mean) + k3 per channel, the formula above folded into three coefficients:
  //   training: k1 = gamma invstd, k2 = -k1 invstd dgamma / M, k3 = -k1 dbeta / M;  eval: k2 = k3 = 0.
  std::vector<T> k1(static_cast<std::size_t>(c)), k2(static_cast<std::size_t>(c)), k3(static_cast<std::size_t>(c));
  for (std::int64_t k = 0; k < c; ++k) {
    const auto i = static_cast<std::size_t>(k);
    const double g = static_cast<double>(a.gamma.data()[k]) * invstd[k];
    double c2 = 0.0, c3 = 0.0;
    if (a.training) {
      c2 = -g * invstd[k] * sums[static_cast<std::size_t>(c + k)] / static_cast<double>(rows);
      c3 = -g * sums[i] / static_cast<double>(rows);
    }
    k1[i] = static_cast<T>(g);
    k2[i] = static_cast<T>(c2);
    k3[i] = static_cast<T>(c3);
  }
  T* dx = a.dx.data();
  const T *p1 = k1.data(), *p2 = k2.data(), *p3 = k3.data();
  parallel_for(exec, rows, 256, [&](std::int64_t m0, std::int64_t m1, int) {
    for (std::int64_t m = m0; m < m1; ++m)
      for (std::int64_t k = 0; k < c; ++k)
        dx[m * c + k] = p1[k] * dy[m * c + k] + p2[k] * (x[m * c + k] - mean[k]) + p3[k];
  });
}

}  // namespace ddp::kernels::cpu
