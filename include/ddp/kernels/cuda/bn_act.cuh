// CUDA BatchNorm + ReLU (+ residual add), forward and backward: one element-wise pass where three
// were.
// SPDX-License-Identifier: MIT
//
// What it saves (ResNet's blocks): unfused, the forward is bn apply (read x, write y), residual add
// (read y and the skip, write y) and ReLU (read y, write y); fused it is one pass reading x and the
// skip and writing y: 3 reads + 1 write per element instead of 7 memory passes. The backward
// unfused is the ReLU mask (read y and dy, write g), bn's sums (read x, g) and bn's dx (read x, g,
// write dx); fused, the mask is applied on the fly inside both bn passes (read x, dy, y) and g is
// written only when the residual needs it, saving a full write and read of g. Statistics and the
// 2-D apply grid are batchnorm.cuh's (one statistics pass, fixed merge order: deterministic;
// bn_act_apply_kernel and bn_act_backward_apply_kernel take the residual, the ReLU and the mask);
// the per-element formulas are the CPU's (kernels/cpu/bn_act.hpp composes the CPU kernels), so
// results agree to fp32 rounding.
// Example: layer1's bn2 at batch 16 (16x56x56x64, 12.25 MiB): forward ~49 MiB of traffic instead of
//   ~86.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/cuda/batchnorm.cuh"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/cuda/op_profile.cuh"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

template <class T, class A>
void batchnorm_act_forward(const Exec<Cuda>& e, const BatchNormActForwardArgs<T, Cuda, A>& a) {
  validate(a);
  Tensor<T, Cuda> coef;
  detail::batchnorm_coefficients(e, a.bn, coef);
  op_phase(e, "apply");  // op_profile.cuh
  detail::batchnorm_apply(e, a.bn.x, coef, a.residual.empty() ? nullptr : a.residual.data(),
                          a.bn.y.data(), a.relu);
}

template <class T, class A>
void batchnorm_act_backward(const Exec<Cuda>& e, const BatchNormActBackwardArgs<T, Cuda, A>& a) {
  validate(a);
  const A* mask = a.relu ? a.y.data() : nullptr;
  Tensor<T, Cuda> coef;
  detail::batchnorm_backward_coefficients(e, a.bn, mask, coef);
  if (a.bn.dx.empty() && a.dresidual.empty()) return;
  op_phase(e, "apply");
  detail::batchnorm_backward_apply(e, a.bn, mask, coef, a.bn.dx.empty() ? nullptr : a.bn.dx.data(),
                                   a.dresidual.empty() ? nullptr : a.dresidual.data());
}

}  // namespace ddp::kernels::cuda
