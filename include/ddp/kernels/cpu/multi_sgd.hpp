// CPU multi-tensor SGD: the reference for kernels/cuda/multi_sgd.cuh, one SgdStep pass per tensor.
// SPDX-License-Identifier: MIT
//
// The per-element math is kernels/elementwise.hpp's SgdStep, exactly what sgd_step runs; the GPU version
// runs the same functor over every tensor in one launch. optim::SGD on the CPU keeps calling sgd_step
// per parameter (the same arithmetic); tests compare this against the CUDA kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
void sgd_step_multi(const Exec<Cpu>&, const MultiSgdArgs<T, Cpu>& a) {
  validate(a);
  for (const SgdTensor<T>& t : a.tensors) {
    const SgdStep<T> f{.param = t.param,
                       .grad = t.grad,
                       .buf = a.momentum != 0.0 ? t.momentum_buffer : nullptr,
                       .lr = static_cast<T>(a.lr),
                       .momentum = static_cast<T>(a.momentum),
                       .dampening = static_cast<T>(a.dampening),
                       .weight_decay = static_cast<T>(a.weight_decay),
                       .first_step = t.first_step,
                       .nesterov = a.nesterov,
                       .use_momentum = a.momentum != 0.0,
                       .use_weight_decay = a.weight_decay != 0.0};
    for (std::int64_t i = 0; i < t.numel; ++i) f(static_cast<std::size_t>(i));
  }
}

}  // namespace ddp::kernels::cpu
