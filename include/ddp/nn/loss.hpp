// Losses as objects that keep their gradient: CrossEntropyLoss (softmax + NLL, mean) and MSELoss
// (mean).
// SPDX-License-Identifier: MIT
//
//   nn::CrossEntropyLoss<float, Cpu> ce({.label_smoothing = 0.0});
//   double loss = ce.forward(exec, logits.cview(), labels.cview());   // logits (N, C), labels (N)
//     int64
//   Tensor<float, Cpu> dlogits = ce.backward(exec);                     // d(mean loss)/d(logits),
//     (N, C)
//   model.backward(exec, dlogits.cview());
// Same formulas as torch.nn.functional.cross_entropy / mse_loss with reduction='mean'
// (kernels/args.hpp). A label outside [0, C) is a ValueError naming the sample and the class count.
#pragma once

#include <cstdint>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::nn {

struct CrossEntropyOptions {
  double label_smoothing = 0.0;
};

template <class T, Device D>
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(const CrossEntropyOptions& o = {}) : o_(o) {}

  // Mean loss over the batch; computes and keeps d(loss)/d(logits) for backward().
  double forward(Exec<D>& exec, TensorView<const T, D> logits,
                 TensorView<const std::int64_t, D> labels) {
    check_batch(logits, labels);
    dlogits_ = Tensor<T, D>(logits.shape());
    return Kernels<D>::cross_entropy(
        exec, kernels::CrossEntropyArgs<T, D>{.logits = logits,
                                              .labels = labels,
                                              .dlogits = dlogits_.view(),
                                              .label_smoothing = o_.label_smoothing});
  }
  // The mean loss alone, for evaluation: no gradient is computed or kept (backward() is not
  // affected).
  double value(Exec<D>& exec, TensorView<const T, D> logits,
               TensorView<const std::int64_t, D> labels) const {
    check_batch(logits, labels);
    return Kernels<D>::cross_entropy(
        exec, kernels::CrossEntropyArgs<T, D>{.logits = logits,
                                              .labels = labels,
                                              .dlogits = {},
                                              .label_smoothing = o_.label_smoothing});
  }
  // d(loss)/d(logits) of the last forward (moved out: call once per forward).
  Tensor<T, D> backward(Exec<D>& /*exec*/) {
    if (dlogits_.empty())
      throw ValueError(
          "ddp: CrossEntropyLoss.backward called without a preceding forward (or twice for one "
          "forward)");
    return std::move(dlogits_);
  }

 private:
  static void check_batch(const TensorView<const T, D>& logits,
                          const TensorView<const std::int64_t, D>& labels) {
    if (logits.rank() == 2 && labels.rank() == 1 && logits.dim(0) != labels.dim(0))
      throw ValueError(ddp::detail::str("ddp: CrossEntropyLoss: ", logits.dim(0),
                                        " rows of logits ", logits.shape(), " but ", labels.dim(0),
                                        " labels; the batch and its labels must match"));
  }

  CrossEntropyOptions o_;
  Tensor<T, D> dlogits_;  // (N, C)
};

template <class T, Device D>
class MSELoss {
 public:
  double forward(Exec<D>& exec, TensorView<const T, D> x, TensorView<const T, D> target) {
    dx_ = Tensor<T, D>(x.shape());
    return Kernels<D>::mse(exec,
                           kernels::MseArgs<T, D>{.x = x, .target = target, .dx = dx_.view()});
  }
  Tensor<T, D> backward(Exec<D>& /*exec*/) {
    if (dx_.empty())
      throw ValueError(
          "ddp: MSELoss.backward called without a preceding forward (or twice for one forward)");
    return std::move(dx_);
  }

 private:
  Tensor<T, D> dx_;
};

}  // namespace ddp::nn
