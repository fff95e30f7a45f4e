// CPU multi-tensor AdamW: every parameter tensor's step in one call; the reference for kernels/cuda/multi_adamw.cuh.
// SPDX-License-Identifier: MIT
//
// Per tensor, adamw_step_for (kernels/fused_args.hpp) turns the tensor's lr, weight decay and step count into
// the AdamwStep functor of kernels/elementwise.hpp, which runs over the tensor's elements in chunks of >= 32 Ki
// on exec's pool (small tensors on the calling thread). The GPU runs the same functors in one launch.
#pragma once

#include <cstdint>

#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

template <class T>
void adamw_step_multi(const Exec<Cpu>& exec, const MultiAdamwArgs<T, Cpu>& a) {
  validate(a);
  for (const AdamwTensor<T>& t : a.tensors) {
    const AdamwStep<T> f = adamw_step_for(t, a.beta1, a.beta2, a.eps);
    parallel_for(exec, t.numel, 1 << 15, [&](std::int64_t i0, std::int64_t i1, int) {
      for (std::int64_t i = i0; i < i1; ++i) f(static_cast<std::size_t>(i));
    });
  }
}

}  // namespace ddp::kernels::cpu
