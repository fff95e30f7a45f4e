// CPU multi-tensor SGD: every parameter tensor's step in one call; the reference for
// kernels/cuda/multi_sgd.cuh.
// SPDX-License-Identifier: MIT
//
// The per-element math is kernels/elementwise.hpp's SgdStep, run tensor after tensor exactly as
// sgd_step runs it (same chunking over the pool), so one sgd_step_multi call gives the same bits as
// one sgd_step per tensor. The GPU version runs the same functor over every tensor in one launch.
#pragma once

#include "ddp/kernels/cpu/sgd.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
void sgd_step_multi(const Exec<Cpu>& exec, const MultiSgdArgs<T, Cpu>& a) {
  validate(a);
  for (const SgdTensor<T>& t : a.tensors)
    detail::sgd_apply(exec, t.param, t.grad, t.momentum_buffer, t.numel, t.first_step, a.lr,
                      a.momentum, a.dampening, a.weight_decay, a.nesterov);
}

}  // namespace ddp::kernels::cpu
