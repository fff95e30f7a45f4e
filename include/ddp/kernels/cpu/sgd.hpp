// CPU SGD step for one parameter tensor, torch.optim.SGD's rule exactly (math in
// kernels/elementwise.hpp).
// SPDX-License-Identifier: MIT
//
// The per-element update is the shared SgdStep functor (see SgdArgs in kernels/args.hpp for the
// formula), so the CUDA kernel computes the same thing. Example (lr 0.1, momentum 0.9, first step,
// grad 1, param 1): buf = 1, param = 1 - 0.1 * 1 = 0.9; second step with grad 1: buf = 0.9 + 1 =
// 1.9, param = 0.71.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

namespace detail {
// SgdStep over one tensor of `numel` elements, spread over exec's threads in chunks of >= 32 Ki
// elements (small tensors run on the calling thread). Hyper-parameters are converted to T first, as
// PyTorch does for float parameters; buf is ignored when momentum == 0. Shared by sgd_step and
// sgd_step_multi.
template <class T>
void sgd_apply(const Exec<Cpu>& exec, T* param, const T* grad, T* buf, std::int64_t numel,
               bool first_step, double lr, double momentum, double dampening, double weight_decay,
               bool nesterov) {
  const SgdStep<T> f{.param = param,
                     .grad = grad,
                     .buf = momentum != 0.0 ? buf : nullptr,
                     .lr = static_cast<T>(lr),
                     .momentum = static_cast<T>(momentum),
                     .dampening = static_cast<T>(dampening),
                     .weight_decay = static_cast<T>(weight_decay),
                     .first_step = first_step,
                     .nesterov = nesterov,
                     .use_momentum = momentum != 0.0,
                     .use_weight_decay = weight_decay != 0.0};
  parallel_for(exec, numel, 1 << 15, [&](std::int64_t i0, std::int64_t i1, int) {
    for (std::int64_t i = i0; i < i1; ++i) f(static_cast<std::size_t>(i));
  });
}
}  // namespace detail

template <class T>
void sgd_step(const Exec<Cpu>& exec, const SgdArgs<T, Cpu>& a) {
  validate(a);
  detail::sgd_apply(exec, a.param.data(), a.grad.data(), a.momentum_buffer.data(), a.param.numel(),
                    a.first_step, a.lr, a.momentum, a.dampening, a.weight_decay, a.nesterov);
}

}  // namespace ddp::kernels::cpu
