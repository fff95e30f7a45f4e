// DDP communication hooks: what DistributedDataParallel does with a full gradient bucket
// (torch.distributed.algorithms.ddp_comm_hooks), and the built-in ones: allreduce, fp16 and bf16 compression.
// SPDX-License-Identifier: MIT
//
// A hook receives a GradBucket -- the flat buffer of one bucket, holding this rank's gradients back to back
// (the sum of every backward since zero_grad(), zeros where a parameter has no gradient) -- starts whatever
// communication it wants without waiting, and returns a HookResult: the Work in flight and a `then` step.
// DDP waits for the Work after backward, in bucket order, runs `then` on the thread that drives DDP, and
// copies the buffer into the parameters' grad(). When `then` returns, buffer must hold the gradient every
// rank should use (the average over ranks for the built-ins). That is torch's contract (a hook returns a
// Future whose value becomes the bucket) with the continuation run at finish instead of on the comm thread.
//
//   ddp::parallel::DistributedDataParallel<float, Cpu> model(net, comm, {.comm_hook = fp16_compress_hook<float>()});
//
// The compression hooks follow torch's default_hooks: divide by the world size BEFORE the reduction and sum
// the 16-bit values, so the sum of W averages of values within range stays within range (an average of 40000
// over 2 ranks is 40000, where summing first would overflow fp16's 65504 into inf). bf16 keeps fp32's
// exponent range with 8 bits of mantissa; fp16 10 bits within +-65504.
// Hooks run on the CPU transport (host buffers). CUDA models take the default allreduce only for now
// (parallel/cuda/transport.cuh refuses others with a message).
// A hook keeps its own state (compression buffers, error feedback) in its closure; hooks are called from
// the thread that drives DDP only, one bucket at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/parallel/bucket.hpp"

namespace ddp::parallel {

// One bucket as a hook sees it (host memory).
template <class T>
struct GradBucket {
  std::size_t index = 0;                  // bucket index (0 = the first to fill in backward)
  std::span<T> buffer;                    // layout->numel gradients, parameter after parameter
  const BucketLayout* layout = nullptr;   // which parameters, at which offsets
  comm::Communicator* comm = nullptr;     // the process group
  bool is_last = false;                   // the last bucket of this step (torch's is_last())
};

// What a hook returns: the communication in flight and what to do once it completed.
struct HookResult {
  comm::Work work;              // waited for by DDP after backward (an empty Work is complete)
  std::function<void()> then;   // may be empty; runs after work, on the DDP thread
};

template <class T>
using CommHook = std::function<HookResult(GradBucket<T>&)>;

// torch's allreduce_hook: the average over ranks (the backend divides the sum by the world size).
template <class T>
CommHook<T> allreduce_hook() {
  return [](GradBucket<T>& b) {
    return HookResult{.work = b.comm->all_reduce(b.buffer, {.op = comm::ReduceOp::Avg}), .then = {}};
  };
}

namespace detail {
// torch's fp16_compress_hook / bf16_compress_hook with H = half / bfloat16: buffer / W rounded to H, summed
// over ranks in H, written back as T. One H buffer per bucket index, kept across steps.
template <class T, class H>
CommHook<T> compress_hook() {
  auto bufs = std::make_shared<std::vector<std::vector<H>>>();
  return [bufs](GradBucket<T>& b) {
    if (bufs->size() <= b.index) bufs->resize(b.index + 1);
    std::vector<H>& h = (*bufs)[b.index];
    h.resize(b.buffer.size());
    const float inv_world = 1.0f / static_cast<float>(b.comm->size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = H(static_cast<float>(b.buffer[i]) * inv_world);
    comm::Work w = b.comm->all_reduce(std::span<H>(h), {.op = comm::ReduceOp::Sum});
    // The data pointer, not &h: a later bucket may grow *bufs (moving the vectors, not their storage).
    return HookResult{.work = std::move(w), .then = [src = h.data(), out = b.buffer] {
                        for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(static_cast<float>(src[i]));
                      }};
  };
}
}  // namespace detail

template <class T>
CommHook<T> fp16_compress_hook() {
  return detail::compress_hook<T, half>();
}
template <class T>
CommHook<T> bf16_compress_hook() {
  return detail::compress_hook<T, bfloat16>();
}

// The built-in hooks by name (--comm-hook).
enum class CommHookKind : std::uint8_t { Allreduce, Fp16, Bf16 };

// "allreduce" | "fp16" | "bf16" (--comm-hook; "none" means allreduce); ValueError otherwise.
inline CommHookKind parse_comm_hook(const std::string& s) {
  if (s == "allreduce" || s == "none" || s.empty()) return CommHookKind::Allreduce;
  if (s == "fp16") return CommHookKind::Fp16;
  if (s == "bf16") return CommHookKind::Bf16;
  throw ValueError(ddp::detail::str("ddp: unknown communication hook ", ddp::detail::quoted(s),
                                    "; valid: allreduce, fp16, bf16 (--comm-hook)"));
}

template <class T>
CommHook<T> make_comm_hook(CommHookKind k) {
  switch (k) {
    case CommHookKind::Fp16: return fp16_compress_hook<T>();
    case CommHookKind::Bf16: return bf16_compress_hook<T>();
    case CommHookKind::Allreduce:
    default: return allreduce_hook<T>();
  }
}

}  // namespace ddp::parallel
