// The DDP communication hook contract (torch.distributed.algorithms.ddp_comm_hooks): what a hook
// receives (GradBucket), what it returns (HookResult), and the CommHook type. The hooks themselves
// are in parallel/comm_hooks.hpp (allreduce, fp16, bf16) and parallel/powersgd.hpp (PowerSGD).
// SPDX-License-Identifier: MIT
//
// A hook receives a GradBucket -- the flat buffer of one bucket, holding this rank's gradients back
// to back (the sum of every backward since zero_grad(), zeros where a parameter has no gradient) --
// starts whatever communication it wants without waiting, and returns a HookResult: the Work in
// flight and a `then` step. DDP waits for the Work after backward, in bucket order, runs `then` on
// the thread that drives DDP, and copies the buffer into the parameters' grad(). When `then`
// returns, buffer must hold the gradient every rank should use (the average over ranks for the
// built-ins). That is torch's contract (a hook returns a Future whose value becomes the bucket)
// with the continuation run at finish instead of on the comm thread. `then` may start and wait for
// further collectives (PowerSGD does): those run after backward, at finish. Hooks are called from
// the thread that drives DDP only, one bucket at a time, in the same order on every rank (so
// collectives started inside a hook or its `then` match across ranks).
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/tensor/shape.hpp"

namespace ddp::parallel {

// One bucket as a hook sees it (host memory).
template <class T>
struct GradBucket {
  std::size_t index = 0;                 // bucket index (0 = the first to fill in backward)
  std::span<T> buffer;                   // layout->numel gradients, parameter after parameter
  const BucketLayout* layout = nullptr;  // which parameters, at which offsets
  comm::Communicator* comm = nullptr;    // the process group
  bool is_last = false;                  // the last bucket of this step (torch's is_last())
  // Each parameter's shape as torch has it (nn::Parameter::torch_shape(): OIHW for conv weights),
  // in bucket order (shapes[k] belongs to layout->params[k]); empty when the transport does not
  // provide them.
  std::span<const Shape> shapes;
};

// What a hook returns: the communication in flight and what to do once it completed.
struct HookResult {
  comm::Work work;             // waited for by DDP after backward (an empty Work is complete)
  std::function<void()> then;  // may be empty; runs after work, on the DDP thread
};

template <class T>
using CommHook = std::function<HookResult(GradBucket<T>&)>;

}  // namespace ddp::parallel
