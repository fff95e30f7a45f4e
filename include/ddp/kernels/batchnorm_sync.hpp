// Per-channel arithmetic of BatchNorm for both devices: every forward's finish of the statistics
// (BnChannelOutputs) and the synchronised BatchNorm's functors, run by Kernels<D>::for_each_index
// over the C channels between the kernels' own "sums" and "apply" passes.
// SPDX-License-Identifier: MIT
//
// A synchronised training step (docs/decisions/0027):
//   forward   sums [sum x (C), sum x^2 (C), M] -> all-reduce -> BnSyncStatistics
//             -> y = x scale + shift
//   backward  sums [sum g (C), sum g xhat (C), M] -> BnLocalGrads (this rank's dbeta, dgamma)
//             -> all-reduce -> BnSyncBackwardCoefficients -> dx = k1 g + k2 (x - mean) + k3
// With the global M, mean = sum x / M and var = sum x^2 / M - mean^2 (biased, for normalising);
// running_var takes var M / (M - 1), as torch. The sums are doubles: x^2 of a float is exact in
// double, so the one-pass variance loses nothing next to float's rounding unless |mean| / std
// exceeds ~1e5 (the non-synchronised kernels keep a stable variance, kernels/bn_stats.hpp).
// Example: two ranks with x = {1, 3} and {5, 7} (one channel): s = {4, 10, 2} + {12, 74, 2} =
// {16, 84, 4} -> mean 4, var 84/4 - 16 = 5, running_var moves towards 5 * 4/3.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ddp/config.hpp"

namespace ddp::kernels {

// One channel's statistics -> everything any forward writes for it: with `rows` > 0 (training) the
// running statistics move towards mu and var * rows / (rows - 1), as torch; rows == 0 (eval)
// leaves them (mu and var are then the running ones). Then save_mean = mu, save_invstd =
// 1 / sqrt(var + eps), scale = gamma invstd, shift = beta - mu scale, so y = x scale + shift is one
// FMA per element. Channel 0 of a training finish counts num_batches_tracked (when given), saving
// the counter a launch.
template <class T>
struct BnChannelOutputs {
  const T* gamma;
  const T* beta;
  T* running_mean;
  T* running_var;
  T* save_mean;
  T* save_invstd;
  T* scale;
  T* shift;
  double momentum;
  double eps;
  std::int64_t* num_batches_tracked;  // () nullable
  DDP_HOST_DEVICE void finish(std::int64_t k, double mu, double var, double rows) const {
    const double is = 1.0 / ::sqrt(var + eps);
    if (rows > 0.0) {
      if (k == 0 && num_batches_tracked) *num_batches_tracked += 1;
      const double unbiased = var * rows / (rows - 1.0);
      running_mean[k] =
          static_cast<T>((1.0 - momentum) * static_cast<double>(running_mean[k]) + momentum * mu);
      running_var[k] = static_cast<T>((1.0 - momentum) * static_cast<double>(running_var[k]) +
                                      momentum * unbiased);
    }
    const double sc = static_cast<double>(gamma[k]) * is;
    scale[k] = static_cast<T>(sc);
    shift[k] = static_cast<T>(static_cast<double>(beta[k]) - mu * sc);
    save_mean[k] = static_cast<T>(mu);
    save_invstd[k] = static_cast<T>(is);
  }
  // Eval: the running statistics normalise, and nothing is updated.
  DDP_HOST_DEVICE void finish_eval(std::int64_t k) const {
    finish(k, static_cast<double>(running_mean[k]), static_cast<double>(running_var[k]), 0.0);
  }
};

// The outputs of a forward's arguments (BatchNormForwardArgs<T, D> of kernels/args.hpp), with scale
// and shift (C each) in the caller's scratch.
template <class Args, class T>
BnChannelOutputs<T> channel_outputs(const Args& a, T* scale, T* shift) {
  return {.gamma = a.gamma.data(),
          .beta = a.beta.data(),
          .running_mean = a.running_mean.data(),
          .running_var = a.running_var.data(),
          .save_mean = a.save_mean.data(),
          .save_invstd = a.save_invstd.data(),
          .scale = scale,
          .shift = shift,
          .momentum = a.momentum,
          .eps = a.eps,
          .num_batches_tracked =
              a.num_batches_tracked.empty() ? nullptr : a.num_batches_tracked.data()};
}

// Global sums (2C + 1: sum x, sum x^2, M) -> mean, biased variance -> finish; one index a channel.
template <class T>
struct BnSyncStatistics {
  const double* sums;  // (2C + 1), summed over the ranks
  BnChannelOutputs<T> out;
  std::int64_t c;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i);
    const double m = sums[2 * c];
    const double mu = sums[k] / m;
    double var = sums[c + k] / m - mu * mu;
    var = var > 0.0 ? var : 0.0;  // rounding can push a constant channel's variance below zero
    out.finish(k, mu, var, m);
  }
};

// This rank's backward sums (before the all-reduce) -> dbeta = sum g, dgamma = sum g xhat
// (either nullable).
template <class T>
struct BnLocalGrads {
  const double* sums;  // (2C + 1)
  T* dgamma;
  T* dbeta;
  std::int64_t c;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i);
    if (dbeta) dbeta[k] = static_cast<T>(sums[k]);
    if (dgamma) dgamma[k] = static_cast<T>(sums[c + k]);
  }
};

// One channel's dx = k1 g + k2 (x - mean) + k3 from gamma, invstd, sg = sum g, sgx = sum g xhat
// over m rows: k1 = gamma invstd, k2 = -k1 invstd sgx / m, k3 = -k1 sg / m in training; k2 = k3 = 0
// in eval.
template <class T>
DDP_HOST_DEVICE void bn_dx_coefficients(double gamma, double is, double sg, double sgx, double m,
                                        bool training, T& k1, T& k2, T& k3) {
  const double g = gamma * is;
  k1 = static_cast<T>(g);
  k2 = static_cast<T>(training ? -g * is * sgx / m : 0.0);
  k3 = static_cast<T>(training ? -g * sg / m : 0.0);
}

// Global backward sums (2C + 1: sum g, sum g xhat, M) -> k1, k2, k3 of bn_dx_coefficients' formula.
template <class T>
struct BnSyncBackwardCoefficients {
  const double* sums;  // (2C + 1), summed over the ranks
  const T* gamma;
  const T* invstd;
  T* k1;
  T* k2;
  T* k3;
  std::int64_t c;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i);
    bn_dx_coefficients(static_cast<double>(gamma[k]), static_cast<double>(invstd[k]), sums[k],
                       sums[c + k], sums[2 * c], true, k1[k], k2[k], k3[k]);
  }
};

}  // namespace ddp::kernels
