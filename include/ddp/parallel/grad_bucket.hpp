// The DDP communication hook contract (torch.distributed.algorithms.ddp_comm_hooks), one for both
// devices: what a hook receives (GradBucket<T, D>), what it returns (HookResult), and CommHook<T,
// D>. The built-in hooks are in parallel/comm_hooks.hpp (allreduce, fp16, bf16) and
// parallel/powersgd.hpp (PowerSGD); built-in and user hooks go through the same call.
// SPDX-License-Identifier: MIT
//
// A hook receives one bucket -- its flat buffer in D's memory, this rank's gradients back to back
// (the sum of every backward since zero_grad(), zeros where a parameter has no gradient) -- starts
// its communication without waiting, and returns a HookResult: the Work in flight and a `then`
// step that DDP runs after backward, on the thread that drives DDP. When `then` has run, buffer
// holds the gradient every rank should use (the average over ranks for the built-ins). That is
// c10d's runHook(GradBucket&) returning a Future, with the continuation run at finish:
// - Cpu: DDP waits for `work`, then runs `then`.
// - Cuda: the hook's work is stream-ordered on b.exec (DDP's communication stream, after the
//   bucket's copies): launch kernels on b.exec, pass `.stream = stream_of(b.exec)` to collectives.
//   DDP does not wait for `work` on the host; `then` enqueues its work on the same stream, and the
//   optimizer's stream waits for all of it on the device (docs/decisions/0079).
// A Work started in `then` and not waited for there (on CUDA waiting blocks the host) goes to
// b.defer(w): DDP waits for it (CPU: before the bucket's gradients are copied back; CUDA: at the
// next step) and raises its error. Hooks are called one bucket at a time, in the same order on
// every rank, so collectives started in a hook or its `then` match across ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {

// One bucket as a hook sees it.
template <class T, Device D = Cpu>
struct GradBucket {
  std::size_t index = 0;                 // bucket index (0 = the first to fill in backward)
  std::span<T> buffer;                   // layout->numel gradients in D's memory, param by param
  const BucketLayout* layout = nullptr;  // which parameters, at which offsets
  comm::Communicator* comm = nullptr;    // the process group
  bool is_last = false;                  // the last bucket of this step (torch's is_last())
  // Each parameter's torch shape (nn::Parameter::torch_shape(): OIHW for conv weights), in bucket
  // order: shapes[k] belongs to layout->params[k].
  std::span<const Shape> shapes;
  Exec<D> exec{};  // where the hook's device work goes (CUDA: DDP's communication stream)
  // Hands DDP a Work to wait for later (see the file comment); set by DDP.
  std::function<void(comm::Work)> defer;

  // buffer as a tensor view, what comm::Communicator's collectives take on either device.
  TensorView<T, D> view() const {
    return TensorView<T, D>(buffer.data(), Shape{static_cast<std::int64_t>(buffer.size())});
  }
};

// What a hook returns: the communication in flight and what to do once it completed.
struct HookResult {
  comm::Work work;             // see the file comment for when DDP waits (empty: complete)
  std::function<void()> then;  // may be empty; runs after backward, on the DDP thread
};

template <class T, Device D = Cpu>
using CommHook = std::function<HookResult(GradBucket<T, D>&)>;

}  // namespace ddp::parallel
