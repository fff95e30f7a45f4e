// CPU batch normalisation over the channel (last) dimension: training and eval forward, backward.
// SPDX-License-Identifier: MIT
//
// x (N, H, W, C) is seen as M = N*H*W rows of C channels: every pass loops over rows with the
// channel loop innermost and contiguous. Training forward:
//   mean_c = sum_m x / M;  var_c = sum_m (x - mean_c)^2 / M   (two passes: no cancellation)
//   y = (x - mean_c) * invstd_c * gamma_c + beta_c,  invstd_c = 1 / sqrt(var_c + eps)
//   running_mean = (1 - momentum) running_mean + momentum mean_c
//   running_var  = (1 - momentum) running_var + momentum var_c * M / (M - 1)  (unbiased, as torch)
// Eval uses running_mean / running_var in place of the batch statistics. Backward (training), with
// xhat = (x - mean) invstd:  dbeta = sum dy,  dgamma = sum dy xhat,
//   dx = gamma invstd (dy - dbeta / M - xhat dgamma / M);   in eval: dx = gamma invstd dy.
// Example: one channel, M = 2 values {1, 3}: mean 2, var 1, xhat ~ {-1, 1}; running_var (1,
// momentum 0.1) moves towards the unbiased 2: 0.9 * 1 + 0.1 * 2 = 1.1.
// Sums are accumulated in double per thread block and combined in block order (deterministic).
// Backward reads all of dy (the sums) before writing dx, each dx element from its own dy element,
// so dx may alias dy (bn_act.hpp masks dy in place). Synchronised (Args::sync, training): one pass
// of sum x and sum x^2, an all-reduce, then the global statistics (kernels/batchnorm_sync.hpp);
// backward all-reduces sum dy and sum dy xhat before dx.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/batchnorm_sync.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

namespace detail {

// Per-channel sums (width * c doubles): f(m, acc) adds row m into its block's acc.
template <class F>
std::vector<double> channel_sums(const Exec<Cpu>& exec, std::int64_t rows, std::int64_t c,
                                 int width, F&& f) {
  const int t = num_threads(exec);
  std::vector<double> part(static_cast<std::size_t>(t * width * c), 0.0);
  parallel_for(exec, rows, 256, [&](std::int64_t m0, std::int64_t m1, int chunk) {
    double* acc =
        part.data() + static_cast<std::size_t>(chunk) * static_cast<std::size_t>(width * c);
    for (std::int64_t m = m0; m < m1; ++m) f(m, acc);
  });
  std::vector<double> sum(static_cast<std::size_t>(width * c), 0.0);
  for (int b = 0; b < t; ++b)
    for (std::size_t i = 0; i < sum.size(); ++i)
      sum[i] += part[static_cast<std::size_t>(b) * sum.size() + i];
  return sum;
}

// y = x * scale + shift per channel (one FMA per element).
template <class T>
void bn_apply(const Exec<Cpu>& exec, const T* x, T* y, std::int64_t rows, std::int64_t c,
              const T* sc, const T* sh) {
  parallel_for(exec, rows, 256, [&](std::int64_t m0, std::int64_t m1, int) {
    for (std::int64_t m = m0; m < m1; ++m)
      for (std::int64_t k = 0; k < c; ++k) y[m * c + k] = x[m * c + k] * sc[k] + sh[k];
  });
}

// dx = k1 * dy + k2 * (x - mean) + k3 per channel.
template <class T>
void bn_backward_apply(const Exec<Cpu>& exec, const T* x, const T* dy, const T* mean, const T* p1,
                       const T* p2, const T* p3, T* dx, std::int64_t rows, std::int64_t c) {
  parallel_for(exec, rows, 256, [&](std::int64_t m0, std::int64_t m1, int) {
    for (std::int64_t m = m0; m < m1; ++m)
      for (std::int64_t k = 0; k < c; ++k)
        dx[m * c + k] = p1[k] * dy[m * c + k] + p2[k] * (x[m * c + k] - mean[k]) + p3[k];
  });
}

// Synchronised training forward (docs/decisions/0027): this rank's sum x and sum x^2 in one pass,
// one all-reduce of 2C + 1 doubles (the last: row count), then the global statistics and apply.
template <class T>
void batchnorm_forward_sync(const Exec<Cpu>& exec, const BatchNormForwardArgs<T, Cpu>& a) {
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  const T* x = a.x.data();
  const auto local = channel_sums(exec, rows, c, 2, [&](std::int64_t m, double* acc) {
    const T* xm = x + m * c;
    for (std::int64_t k = 0; k < c; ++k) {
      const double v = static_cast<double>(xm[k]);
      acc[k] += v;
      acc[c + k] += v * v;
    }
  });
  std::vector<double> sums(local.begin(), local.end());
  sums.push_back(static_cast<double>(rows));
  a.sync->all_reduce_sum(exec, TensorView<double, Cpu>(sums.data(), Shape{2 * c + 1}));
  check_sync_count(sums[static_cast<std::size_t>(2 * c)], "batchnorm_forward");
  std::vector<T> coef(static_cast<std::size_t>(2 * c));  // scale, shift
  for_each_index(
      exec, static_cast<std::size_t>(c),
      BnSyncStatistics<T>{
          .sums = sums.data(), .out = channel_outputs(a, coef.data(), coef.data() + c), .c = c});
  bn_apply(exec, x, a.y.data(), rows, c, coef.data(), coef.data() + c);
}

// Synchronised training backward: local sums give dgamma and dbeta; their all-reduce gives dx.
template <class T>
void batchnorm_backward_sync(const Exec<Cpu>& exec, const BatchNormBackwardArgs<T, Cpu>& a,
                             const std::vector<double>& local, std::int64_t rows) {
  const std::int64_t c = a.x.dim(-1);
  std::vector<double> sums(local.begin(), local.end());
  sums.push_back(static_cast<double>(rows));
  for_each_index(exec, static_cast<std::size_t>(c),
                 BnLocalGrads<T>{.sums = sums.data(),
                                 .dgamma = a.dgamma.empty() ? nullptr : a.dgamma.data(),
                                 .dbeta = a.dbeta.empty() ? nullptr : a.dbeta.data(),
                                 .c = c});
  // every rank, even without dx
  a.sync->all_reduce_sum(exec, TensorView<double, Cpu>(sums.data(), Shape{2 * c + 1}));
  if (a.dx.empty()) return;
  std::vector<T> coef(static_cast<std::size_t>(3 * c));  // k1, k2, k3
  for_each_index(exec, static_cast<std::size_t>(c),
                 BnSyncBackwardCoefficients<T>{.sums = sums.data(),
                                               .gamma = a.gamma.data(),
                                               .invstd = a.save_invstd.data(),
                                               .k1 = coef.data(),
                                               .k2 = coef.data() + c,
                                               .k3 = coef.data() + 2 * c,
                                               .c = c});
  bn_backward_apply(exec, a.x.data(), a.dy.data(), a.save_mean.data(), coef.data(), coef.data() + c,
                    coef.data() + 2 * c, a.dx.data(), rows, c);
}

}  // namespace detail

template <class T>
void batchnorm_forward(const Exec<Cpu>& exec, const BatchNormForwardArgs<T, Cpu>& a) {
  validate(a);
  if (a.training && a.sync) return detail::batchnorm_forward_sync(exec, a);
  const std::int64_t c = a.x.dim(-1), rows = a.x.numel() / c;
  const T* x = a.x.data();
  std::vector<T> scale(static_cast<std::size_t>(c)), shift(static_cast<std::size_t>(c));
  const BnChannelOutputs<T> out = channel_outputs(a, scale.data(), shift.data());
  if (a.training) {
    const auto sum = detail::channel_sums(exec, rows, c, 1, [&](std::int64_t m, double* acc) {
      const T* xm = x + m * c;
      for (std::int64_t k = 0; k < c; ++k) acc[k] += static_cast<double>(xm[k]);
    });
    std::vector<double> mean(static_cast<std::size_t>(c));
    for (std::int64_t k = 0; k < c; ++k)
      mean[static_cast<std::size_t>(k)] = sum[static_cast<std::size_t>(k)] / rows;
    const auto sq = detail::channel_sums(exec, rows, c, 1, [&](std::int64_t m, double* acc) {
      const T* xm = x + m * c;
      for (std::int64_t k = 0; k < c; ++k) {
        const double d = static_cast<double>(xm[k]) - mean[static_cast<std::size_t>(k)];
        acc[k] += d * d;
      }
    });
    for (std::int64_t k = 0; k < c; ++k) {
      const auto i = static_cast<std::size_t>(k);
      out.finish(k, mean[i], sq[i] / rows, static_cast<double>(rows));
    }
  } else {
    for (std::int64_t k = 0; k < c; ++k) out.finish_eval(k);
  }
  detail::bn_apply(exec, x, a.y.data(), rows, c, scale.data(), shift.data());
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
      acc[c + k] +=
          static_cast<double>(dym[k]) * (static_cast<double>(xm[k]) - mean[k]) * invstd[k];
    }
  });
  if (a.training && a.sync) return detail::batchnorm_backward_sync(exec, a, sums, rows);
  for (std::int64_t k = 0; k < c; ++k) {
    if (!a.dbeta.empty()) a.dbeta.data()[k] = static_cast<T>(sums[static_cast<std::size_t>(k)]);
    if (!a.dgamma.empty())
      a.dgamma.data()[k] = static_cast<T>(sums[static_cast<std::size_t>(c + k)]);
  }
  if (a.dx.empty()) return;
  // dx = k1 * dy + k2 * (x - mean) + k3 per channel (the formula above); training:
  // k1 = gamma invstd, k2 = -k1 invstd dgamma / M, k3 = -k1 dbeta / M; eval: k2 = k3 = 0.
  std::vector<T> k1(static_cast<std::size_t>(c)), k2(static_cast<std::size_t>(c)),
      k3(static_cast<std::size_t>(c));
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
  detail::bn_backward_apply(exec, x, dy, mean, k1.data(), k2.data(), k3.data(), a.dx.data(), rows,
                            c);
}

}  // namespace ddp::kernels::cpu
