// CUDA BatchNorm + ReLU (+ residual add), forward and backward: one element-wise pass where three were.
// SPDX-License-Identifier: MIT
//
// What it saves (ResNet's blocks): unfused, the forward is bn apply (read x, write y), residual add (read
// y and the skip, write y) and ReLU (read y, write y); fused it is one pass reading x and the skip and
// writing y: 3 reads + 1 write per element instead of 7 memory passes. The backward unfused is the ReLU
// mask (read y and dy, write g), bn's sums (read x, g) and bn's dx (read x, g, write dx); fused, the mask is
// applied on the fly inside both bn passes (read x, dy, y) and g is written only when the residual needs
// it, saving a full write and read of g. Statistics are computed exactly as in batchnorm.cuh (chunked
// double sums in a fixed order: deterministic); the per-element formulas are the CPU's
// (kernels/cpu/bn_act.hpp composes the CPU kernels), so results agree to fp32 rounding.
// Example: layer1's bn2 at batch 16 (16x56x56x64, 12.25 MiB): forward ~49 MiB of traffic instead of ~86.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/cuda/batchnorm.cuh"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

namespace detail {

// y[i] = act(x[i] scale[c] + shift[c] + residual[i]), c = i % C; act = ReLU (NaN stays) or identity.
template <class T>
struct BnActApply {
  const T* x;
  const T* scale;
  const T* shift;
  const T* residual;  // nullable
  T* y;
  std::int64_t c;
  bool relu;
  __device__ void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i % static_cast<std::size_t>(c));
    T v = x[i] * scale[k] + shift[k];
    if (residual) v = v + residual[i];
    if (relu) v = ((v > T(0)) | (v != v)) ? v : T(0);
    y[i] = v;
  }
};

// g = relu ? (y > 0 ? dy : 0) : dy;  dx[i] = k1[c] g + k2[c] (x[i] - mean[c]) + k3[c];  dres[i] = g.
template <class T>
struct BnActBackwardApply {
  const T* x;
  const T* dy;
  const T* y;  // nullable when !relu
  const T* mean;
  const T* k1;
  const T* k2;
  const T* k3;
  T* dx;    // nullable
  T* dres;  // nullable
  std::int64_t c;
  __device__ void operator()(std::size_t i) const {
    const auto k = static_cast<std::int64_t>(i % static_cast<std::size_t>(c));
    const T d = dy[i];
    const T g = y ? (y[i] > T(0) ? d : T(0)) : d;
    if (dres) dres[i] = g;
    if (dx) dx[i] = k1[k] * g + k2[k] * (x[i] - mean[k]) + k3[k];
  }
};

}  // namespace detail

template <class T>
void batchnorm_act_forward(const Exec<Cuda>& e, const BatchNormActForwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t c = a.bn.x.dim(-1);
  Tensor<T, Cuda> coef;
  detail::batchnorm_coefficients(e, a.bn, coef);
  for_each_index(e, static_cast<std::size_t>(a.bn.x.numel()),
                 detail::BnActApply<T>{.x = a.bn.x.data(),
                                       .scale = coef.data(),
                                       .shift = coef.data() + c,
                                       .residual = a.residual.empty() ? nullptr : a.residual.data(),
                                       .y = a.bn.y.data(),
                                       .c = c,
                                       .relu = a.relu});
}

template <class T>
void batchnorm_act_backward(const Exec<Cuda>& e, const BatchNormActBackwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t c = a.bn.x.dim(-1);
  const T* mask = a.relu ? a.y.data() : nullptr;
  Tensor<T, Cuda> coef;
  detail::batchnorm_backward_coefficients(e, a.bn, mask, coef);
  if (a.bn.dx.empty() && a.dresidual.empty()) return;
  for_each_index(e, static_cast<std::size_t>(a.bn.x.numel()),
                 detail::BnActBackwardApply<T>{.x = a.bn.x.data(),
                                               .dy = a.bn.dy.data(),
                                               .y = mask,
                                               .mean = a.bn.save_mean.data(),
                                               .k1 = coef.data(),
                                               .k2 = coef.data() + c,
                                               .k3 = coef.data() + 2 * c,
                                               .dx = a.bn.dx.empty() ? nullptr : a.bn.dx.data(),
                                               .dres = a.dresidual.empty() ? nullptr : a.dresidual.data(),
                                               .c = c});
}

}  // namespace ddp::kernels::cuda
