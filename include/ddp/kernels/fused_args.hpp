// Argument structs of the fused and multi-tensor kernels (BatchNorm + ReLU (+ residual), multi-tensor SGD).
// SPDX-License-Identifier: MIT
//
// Both Kernels<D> have these ops; they exist for the GPU, where one pass over memory instead of two or
// three (one launch instead of one per tensor) is what pays:
//   batchnorm_act_forward   y  = relu(bn(x) + residual)            (residual and relu optional)
//   batchnorm_act_backward  g  = dy * (y > 0); dresidual = g; dx, dgamma, dbeta = bn_backward(g)
//   sgd_step_multi          SgdStep (kernels/elementwise.hpp) over every parameter tensor in one launch
// The CPU versions (kernels/cpu/bn_act.hpp, kernels/cpu/multi_sgd.hpp) run the unfused CPU passes in a
// row and are the reference the GPU tests compare against. validate() throws ValueError like args.hpp's.
#pragma once

#include <cstdint>
#include <span>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

// ---- BatchNorm + ReLU (+ residual add) ----
template <class T, Device D>
struct BatchNormActForwardArgs {
  BatchNormForwardArgs<T, D> bn;    // as batchnorm_forward; bn.y receives relu(bn(x) + residual)
  TensorView<const T, D> residual;  // optional, x's shape: the block's skip path, added before the ReLU
  bool relu = true;                 // false: y = bn(x) + residual
};

template <class T, Device D>
struct BatchNormActBackwardArgs {
  BatchNormBackwardArgs<T, D> bn;  // as batchnorm_backward, with bn.dy the gradient of the activated output
  TensorView<const T, D> y;        // the forward's output (its sign is the ReLU mask); required when relu
  TensorView<T, D> dresidual;      // optional, x's shape: receives dy * (y > 0), the residual's gradient
  bool relu = true;
};

template <class T, Device D>
void validate(const BatchNormActForwardArgs<T, D>& a) {
  validate(a.bn);
  if (!a.residual.empty()) expect_shape(a.residual, a.bn.x.shape(), "residual", "batchnorm_act_forward");
}

template <class T, Device D>
void validate(const BatchNormActBackwardArgs<T, D>& a) {
  validate(a.bn);
  const char* op = "batchnorm_act_backward";
  if (a.relu && a.bn.x.numel() > 0) {  // a synchronised rank without rows has no mask to read
    if (a.y.empty())
      throw ValueError(detail::str("ddp: ", op, ": relu = true needs the forward output y (the ReLU mask)"));
    expect_shape(a.y, a.bn.x.shape(), "forward output y", op);
  }
  if (!a.dresidual.empty()) expect_shape(a.dresidual, a.bn.x.shape(), "residual gradient dresidual", op);
}

// ---- multi-tensor SGD: torch.optim.SGD's rule (SgdArgs in args.hpp) over many tensors at once ----
template <class T>
struct SgdTensor {
  T* param = nullptr;
  const T* grad = nullptr;
  T* momentum_buffer = nullptr;  // required when momentum != 0
  std::int64_t numel = 0;
  bool first_step = true;  // this tensor's buffer starts as g (PyTorch's "buf is None")
};

// Hyper-parameters shared by every tensor (as in SgdArgs); tensors are raw device (or host) pointers.
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
      throw ValueError(
          detail::str("ddp: ", op, ": tensor ", i, " (", t.numel,
                      " elements) needs param and grad pointers, and a momentum buffer when momentum != 0"));
  }
}

}  // namespace ddp::kernels
