// clip_grad_norm: torch.nn.utils.clip_grad_norm_ (L2 norm over every gradient, scaled down to
// max_norm).
// SPDX-License-Identifier: MIT
//
// torch 1.13's clip_grad_norm_ with norm_type 2:
//   total     = sqrt(sum over parameters with a gradient of sum(g^2))   (accumulated in double)
//   clip_coef = min(max_norm / (total + 1e-6), 1)
//   g        *= clip_coef for every gradient (skipped when clip_coef is 1)
// returning total, the norm before clipping. Parameters without a gradient (has_grad() false:
// torch's .grad is None) are left out of the norm and untouched. As with torch's default
// (error_if_nonfinite=False), a NaN or infinite total is returned as is and the gradients are
// scaled by the resulting NaN / 0 factor. Example: gradients (3, 4) and (0), max_norm 1: total 5,
// clip_coef 1 / 5.000001, gradients (0.6, 0.8), (0).
//
// Call it after backward and before step(). Under DDP the gradients are already averaged and
// identical on every rank, so this local norm is the global one and every rank clips by the same
// factor without communicating (ZeRO-1 keeps whole gradients too). An optimizer that sharded the
// gradients would have to all-reduce sum_of_squares() before the square root. On the GPU this
// waits for exec's stream once (the norm is needed on the host), as torch's .item() would.
#pragma once

#include <cmath>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::optim {

namespace detail {
// The gradients clip_grad_norm works on: those of parameters that have one.
template <class T, Device D>
std::vector<kernels::TensorPtr<T>> grads_of(const std::vector<nn::Parameter<T, D>*>& params) {
  std::vector<kernels::TensorPtr<T>> out;
  for (auto* p : params)
    if (p->has_grad()) out.push_back({.data = p->grad().data(), .numel = p->numel()});
  return out;
}
}  // namespace detail

// Sum of g^2 over every gradient of `params`, in double.
template <class T, Device D>
double sum_of_squares(Exec<D>& exec, const std::vector<nn::Parameter<T, D>*>& params) {
  const auto grads = detail::grads_of(params);
  return Kernels<D>::sum_squares_multi(exec, kernels::MultiTensorArgs<T, D>{.tensors = grads});
}

// Scales the gradients of `params`, whose total L2 norm is `total` (e.g. GradScaler::unscale's),
// to at most max_norm; returns total. clip_grad_norm's second half, for callers with the norm.
template <class T, Device D>
double clip_to_norm(Exec<D>& exec, const std::vector<nn::Parameter<T, D>*>& params, double max_norm,
                    double total) {
  if (!(max_norm >= 0.0))
    throw ValueError(ddp::detail::str("ddp: clip_grad_norm: max_norm ", max_norm,
                                      " must be >= 0 (--clip-grad-norm)"));
  const double clip_coef = max_norm / (total + 1e-6);
  if (!(clip_coef >= 1.0)) {  // also scales by a NaN factor, as torch does
    const auto grads = detail::grads_of(params);
    Kernels<D>::scale_multi(exec,
                            kernels::MultiScaleArgs<T, D>{.tensors = grads, .alpha = clip_coef});
  }
  return total;
}

// Clips the gradients of `params` in place to a total L2 norm of at most max_norm; returns the norm
// before. Throws ValueError for a negative or NaN max_norm.
template <class T, Device D>
double clip_grad_norm(Exec<D>& exec, const std::vector<nn::Parameter<T, D>*>& params,
                      double max_norm) {
  return clip_to_norm(exec, params, max_norm, std::sqrt(sum_of_squares(exec, params)));
}

}  // namespace ddp::optim
