// CPU SGD step for one parameter tensor, torch.optim.SGD's rule exactly (math in kernels/elementwise.hpp).
// SPDX-License-Identifier: MIT
//
// The per-element update is the shared SgdStep functor (see SgdArgs in kernels/args.hpp for the formula),
// so the CUDA kernel computes the same thing. Example (lr 0.1, momentum 0.9, first step, grad 1, param 1):
// buf = 1, param = 1 - 0.1 * 1 = 0.9; second step with grad 1: buf = 0.9 + 1 = 1.9, param = 0.71.
#pragma once

#include <cstdint>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
void sgd_step(const Exec<Cpu>& exec, const SgdArgs<T, Cpu>& a) {
  validate(a);
  const SgdStep<T> f{.param = a.param.data(),
                     .grad = a.grad.data(),
                     .buf = a.momentum != 0.0 ? a.momentum_buffer.data() : nullptr,
                     .lr = static_cast<T>(a.lr),
                     .momentum = static_cast<T>(a.momentum),
                     .dampening = static_cast<T>(a.dampening),
                     .weight_decay = static_cast<T>(a.weight_decay),
                     .first_step = a.first_step,
                     .nesterov = a.nesterov,
                     .use_momentum = a.momentum != 0.0,
                     .use_weight_decay = a.weight_decay != 0.0};
  parallel_for(exec, a.param.numel(), 1 << 15, [&](std::int64_t i0, std::int64_t i1, int) {
    for (std::int64_t i = i0; i < i1; ++i) f(static_cast<std::size_t>(i));
  });
}

}  // namespace ddp::kernels::cpu
