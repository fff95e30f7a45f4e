// Argument structs of the fused and multi-tensor kernels.
// SPDX-License-Identifier: MIT
//
// Both Kernels<D> have these ops; they exist for the GPU, where one pass over memory instead of two
// or three (one launch instead of one per tensor) is what pays:
//   batchnorm_act_forward   y = relu(bn(x) + residual)       (residual and relu optional)
//   batchnorm_act_backward  g = dy * (y > 0); dresidual = g; dx, dgamma, dbeta = bn_backward(g)
//   sgd_step_multi          SgdStep over every parameter tensor in one launch
//   adamw_step_multi        AdamwStep likewise (per-tensor lr, weight decay and step count)
//   sum_squares_multi       sum of x^2 over many tensors, in double (clip_grad_norm's norm)
//   scale_multi             x *= alpha over many tensors (clip_grad_norm's clipping)
// The CPU versions (kernels/cpu/) run the unfused passes and are the GPU tests' reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

// ---- BatchNorm + ReLU (+ residual add) ----
template <class T, Device D, class A = T>
struct BatchNormActForwardArgs {
  BatchNormForwardArgs<T, D, A> bn;  // as batchnorm_forward; bn.y receives relu(bn(x) + residual)
  // optional, x's shape: the block's skip path, added before the ReLU
  TensorView<const A, D> residual;
  bool relu = true;  // false: y = bn(x) + residual
};

template <class T, Device D, class A = T>
struct BatchNormActBackwardArgs {
  // as batchnorm_backward, with bn.dy the gradient of the activated output
  BatchNormBackwardArgs<T, D, A> bn;
  // the forward's output (its sign is the ReLU mask); required when relu
  TensorView<const A, D> y;
  // optional, x's shape: receives dy * (y > 0), the residual's gradient
  TensorView<A, D> dresidual;
  bool relu = true;
};

template <class T, Device D, class A>
void validate(const BatchNormActForwardArgs<T, D, A>& a) {
  validate(a.bn);
  if (!a.residual.empty())
    expect_shape(a.residual, a.bn.x.shape(), "residual", "batchnorm_act_forward");
}

template <class T, Device D, class A>
void validate(const BatchNormActBackwardArgs<T, D, A>& a) {
  validate(a.bn);
  const char* op = "batchnorm_act_backward";
  if (a.relu && a.bn.x.numel() > 0) {  // a synchronised rank without rows has no mask to read
    if (a.y.empty())
      throw ValueError(
          detail::str("ddp: ", op, ": relu = true needs the forward output y (the ReLU mask)"));
    expect_shape(a.y, a.bn.x.shape(), "forward output y", op);
  }
  if (!a.dresidual.empty())
    expect_shape(a.dresidual, a.bn.x.shape(), "residual gradient dresidual", op);
}

// ---- multi-tensor SGD: torch.optim.SGD's rule (SgdArgs in args.hpp) over many tensors at once
template <class T>
struct SgdTensor {
  T* param = nullptr;
  const T* grad = nullptr;
  T* momentum_buffer = nullptr;  // required when momentum != 0
  std::int64_t numel = 0;
  bool first_step = true;  // this tensor's buffer starts as g (PyTorch's "buf is None")
};

// Hyper-parameters shared by every tensor, as in SgdArgs; tensors hold raw device/host pointers.
template <class T, Device D>
struct MultiSgdArgs {
  std::span<const SgdTensor<T>> tensors;
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

template <class T, Device D>
void validate(const MultiSgdArgs<T, D>& a) {
  const char* op = "sgd_step_multi";
  validate_sgd_hyperparameters(op, a.lr, a.momentum, a.dampening, a.weight_decay, a.nesterov);
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const SgdTensor<T>& t = a.tensors[i];
    if (t.numel < 0 || (t.numel > 0 && (!t.param || !t.grad)) ||
        (t.numel > 0 && a.momentum != 0.0 && !t.momentum_buffer))
      throw ValueError(detail::str(
          "ddp: ", op, ": tensor ", i, " (", t.numel,
          " elements) needs param and grad pointers, and a momentum buffer when momentum != 0"));
  }
}

// ---- multi-tensor AdamW: torch.optim.AdamW's rule (AdamwStep) over many tensors
// lr, weight decay and step count are per tensor (parameter groups; a parameter skipped while it
// had no gradient has a smaller step count); betas and eps are shared.
template <class T>
struct AdamwTensor {
  T* param = nullptr;
  const T* grad = nullptr;
  T* exp_avg = nullptr;     // zeros before the first step (torch's state initialisation)
  T* exp_avg_sq = nullptr;  // likewise
  std::int64_t numel = 0;
  double lr = 1e-3;
  double weight_decay = 1e-2;
  // this tensor's step count including this step (torch's state['step'] after += 1)
  std::int64_t step = 1;
};

template <class T, Device D>
struct MultiAdamwArgs {
  std::span<const AdamwTensor<T>> tensors;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

template <class T, Device D>
void validate(const MultiAdamwArgs<T, D>& a) {
  const char* op = "adamw_step_multi";
  if (!(a.beta1 >= 0.0 && a.beta1 < 1.0) || !(a.beta2 >= 0.0 && a.beta2 < 1.0) || !(a.eps >= 0.0))
    throw ValueError(detail::str("ddp: ", op, ": betas must be in [0, 1) and eps >= 0, got betas (",
                                 a.beta1, ", ", a.beta2, ") and eps ", a.eps));
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const AdamwTensor<T>& t = a.tensors[i];
    if (t.numel < 0 || (t.numel > 0 && (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq)))
      throw ValueError(
          detail::str("ddp: ", op, ": tensor ", i, " (", t.numel,
                      " elements) needs param, grad, exp_avg and exp_avg_sq pointers"));
    if (!(t.lr >= 0.0) || !(t.weight_decay >= 0.0) || t.step < 1)
      throw ValueError(detail::str("ddp: ", op, ": tensor ", i, ": lr (", t.lr,
                                   ") and weight_decay (", t.weight_decay,
                                   ") must be >= 0 and step (", t.step, ") >= 1"));
  }
}

// Tensor t's update functor: bias corrections and decay factor in double (as torch computes them
// in Python), then converted to T. Shared by the CPU loop and the CUDA kernel.
template <class T>
AdamwStep<T> adamw_step_for(const AdamwTensor<T>& t, double beta1, double beta2, double eps) {
  const double step = static_cast<double>(t.step);
  const double bias_correction1 = 1.0 - std::pow(beta1, step);
  const double bias_correction2 = 1.0 - std::pow(beta2, step);
  return AdamwStep<T>{.param = t.param,
                      .grad = t.grad,
                      .exp_avg = t.exp_avg,
                      .exp_avg_sq = t.exp_avg_sq,
                      .decay = static_cast<T>(1.0 - t.lr * t.weight_decay),
                      .beta1 = static_cast<T>(beta1),
                      .one_minus_beta1 = static_cast<T>(1.0 - beta1),
                      .beta2 = static_cast<T>(beta2),
                      .one_minus_beta2 = static_cast<T>(1.0 - beta2),
                      .step_size = static_cast<T>(t.lr / bias_correction1),
                      .bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2)),
                      .eps = static_cast<T>(eps)};
}

// ---- multi-tensor reductions and scaling (clip_grad_norm) ----
template <class T>
struct TensorPtr {
  T* data = nullptr;
  std::int64_t numel = 0;
};

// sum_squares_multi: returns sum over every tensor of sum(x^2), accumulated in double in a fixed
// order (deterministic on each device; CPU and CUDA differ in the order, so by rounding).
template <class T, Device D>
struct MultiTensorArgs {
  std::span<const TensorPtr<T>> tensors;
};

// scale_multi: x *= alpha (converted to T) for every tensor.
template <class T, Device D>
struct MultiScaleArgs {
  std::span<const TensorPtr<T>> tensors;
  double alpha = 1.0;
};

template <class T>
void validate_tensor_ptrs(const char* op, std::span<const TensorPtr<T>> tensors) {
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].numel < 0 || (tensors[i].numel > 0 && !tensors[i].data))
      throw ValueError(detail::str("ddp: ", op, ": tensor ", i, " (", tensors[i].numel,
                                   " elements) has no data"));
}
template <class T, Device D>
void validate(const MultiTensorArgs<T, D>& a) {
  validate_tensor_ptrs("sum_squares_multi", a.tensors);
}
template <class T, Device D>
void validate(const MultiScaleArgs<T, D>& a) {
  validate_tensor_ptrs("scale_multi", a.tensors);
}

}  // namespace ddp::kernels
