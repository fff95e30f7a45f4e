// CPU BatchNorm + ReLU (+ residual add): the reference for kernels/cuda/bn_act.cuh, composed of CPU kernels.
// SPDX-License-Identifier: MIT
//
// forward:  y = bn(x); y += residual; y = relu(y)                        (three passes on the CPU)
// backward: g = relu_backward(y, dy); dresidual = g; bn_backward(g)     (what BasicBlock does unfused)
// The CPU modules keep their unfused code paths (bit-identical results either way); the GPU, where one
// pass instead of three pays, runs the fused kernel. Same Args (kernels/fused_args.hpp), same checks.
#pragma once

#include <algorithm>
#include <cstddef>

#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cpu {

template <class T>
void batchnorm_act_forward(const Exec<Cpu>& e, const BatchNormActForwardArgs<T, Cpu>& a) {
  validate(a);
  using K = Kernels<Cpu>;
  K::batchnorm_forward(e, a.bn);
  if (!a.residual.empty()) K::add(e, TensorView<const T, Cpu>(a.bn.y), a.residual, a.bn.y);
  if (a.relu) K::relu_forward(e, TensorView<const T, Cpu>(a.bn.y), a.bn.y);
}

template <class T>
void batchnorm_act_backward(const Exec<Cpu>& e, const BatchNormActBackwardArgs<T, Cpu>& a) {
  validate(a);
  using K = Kernels<Cpu>;
  Tensor<T, Cpu> g(a.bn.dy.shape());
  if (a.relu)
    K::relu_backward(e, a.y, a.bn.dy, g.view());
  else
    std::copy_n(a.bn.dy.data(), a.bn.dy.numel(), g.data());
  if (!a.dresidual.empty()) std::copy_n(g.data(), g.numel(), a.dresidual.data());
  BatchNormBackwardArgs<T, Cpu> b = a.bn;
  b.dy = g.cview();
  K::batchnorm_backward(e, b);
}

}  // namespace ddp::kernels::cpu
