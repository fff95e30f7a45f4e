// CPU BatchNorm + ReLU (+ residual add): the bn kernel followed by element-wise passes; the
// reference for kernels/cuda/bn_act.cuh.
// SPDX-License-Identifier: MIT
//
// forward: y = bn(x); y += residual; y = relu(y) (three passes, as forward + add + relu) backward:
// g = dy * (y > 0); dresidual = g; bn_backward(g) (g is written straight into dresidual
//           when the caller wants it, else into dx, which bn_backward overwrites element by
//             element)
// The results are bit-identical to running batchnorm_forward, add and relu_forward (and
// relu_backward, batchnorm_backward) one after the other: the same functors on the same values in
// the same order. On the CPU one pass instead of three would gain little (the convolutions
// dominate); the GPU, where it pays, runs the fused kernel. Same Args (kernels/fused_args.hpp),
// same checks.
#pragma once

#include <algorithm>
#include <cstddef>

#include "ddp/kernels/cpu/batchnorm.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cpu {

template <class T>
void batchnorm_act_forward(const Exec<Cpu>& e, const BatchNormActForwardArgs<T, Cpu>& a) {
  validate(a);
  batchnorm_forward(e, a.bn);
  const auto n = static_cast<std::size_t>(a.bn.y.numel());
  T* y = a.bn.y.data();
  if (!a.residual.empty()) for_each_index(e, n, Add<T>{.a = y, .b = a.residual.data(), .out = y});
  if (a.relu) for_each_index(e, n, ReluForward<T>{.x = y, .y = y});
}

template <class T>
void batchnorm_act_backward(const Exec<Cpu>& e, const BatchNormActBackwardArgs<T, Cpu>& a) {
  validate(a);
  BatchNormBackwardArgs<T, Cpu> b = a.bn;
  if (a.relu || !a.dresidual.empty()) {
    // Where g lives: dresidual when the caller wants it; else dx, which batchnorm_backward may take
    // as dy too (it reads all of dy before writing dx); a scratch tensor only when there is
    // neither.
    Tensor<T, Cpu> scratch;
    TensorView<T, Cpu> g = !a.dresidual.empty() ? a.dresidual : a.bn.dx;
    if (g.empty()) {
      scratch = Tensor<T, Cpu>(a.bn.dy.shape());
      g = scratch.view();
    }
    const auto n = static_cast<std::size_t>(a.bn.dy.numel());
    if (a.relu)
      for_each_index(e, n, ReluBackward<T>{.y = a.y.data(), .dy = a.bn.dy.data(), .dx = g.data()});
    else
      std::copy_n(a.bn.dy.data(), n, g.data());
    b.dy = TensorView<const T, Cpu>(g);
    batchnorm_backward(e, b);  // scratch lives until here
    return;
  }
  batchnorm_backward(e, b);  // no ReLU, no residual: plain BatchNorm
}

}  // namespace ddp::kernels::cpu
