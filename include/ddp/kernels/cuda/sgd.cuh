// CUDA SGD step for one parameter tensor: torch.optim.SGD's rule, the shared SgdStep functor on the
// GPU.
// SPDX-License-Identifier: MIT
//
// The per-element math is kernels/elementwise.hpp's SgdStep (see SgdArgs in kernels/args.hpp), the
// same code the CPU runs, launched by for_each_index: one thread per element in a grid-stride loop,
// asynchronous on the exec's stream. Example (lr 0.1, momentum 0.9, first step, grad 1, param 1):
// buf = 1, param = 0.9; second step with grad 1: buf = 1.9, param = 0.71.
#pragma once

#include <cstddef>

#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

template <class T>
void sgd_step(const Exec<Cuda>& e, const SgdArgs<T, Cuda>& a) {
  validate(a);
  for_each_index(e, static_cast<std::size_t>(a.param.numel()),
                 SgdStep<T>{.param = a.param.data(),
                            .grad = a.grad.data(),
                            .buf = a.momentum != 0.0 ? a.momentum_buffer.data() : nullptr,
                            .lr = static_cast<T>(a.lr),
                            .momentum = static_cast<T>(a.momentum),
                            .dampening = static_cast<T>(a.dampening),
                            .weight_decay = static_cast<T>(a.weight_decay),
                            .first_step = a.first_step,
                            .nesterov = a.nesterov,
                            .use_momentum = a.momentum != 0.0,
                            .use_weight_decay = a.weight_decay != 0.0});
}

}  // namespace ddp::kernels::cuda
