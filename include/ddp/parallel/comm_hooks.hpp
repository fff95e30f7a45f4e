// DDP communication hooks: what DistributedDataParallel does with a full gradient bucket
// (torch.distributed.algorithms.ddp_comm_hooks), and the built-in ones: allreduce, fp16 and bf16
// compression, and PowerSGD (parallel/powersgd.hpp), selected by name with --comm-hook
// (make_comm_hook in parallel/ddp_options.hpp).
// SPDX-License-Identifier: MIT
//
// The contract (GradBucket in, HookResult out) is in parallel/grad_bucket.hpp.
//
//   ddp::parallel::DistributedDataParallel<float, Cpu> model(
//       net, comm, {.comm_hook = CommHookKind::Fp16});
//   model.register_comm_hook(fp16_compress_hook<float>());   // or any hook, between steps
//
// The compression hooks follow torch's default_hooks: divide by the world size BEFORE the reduction
// and sum the 16-bit values, so the sum of W averages of values within range stays within range (an
// average of 40000 over 2 ranks is 40000, where summing first would overflow fp16's 65504 into
// inf). bf16 keeps fp32's exponent range with 8 bits of mantissa; fp16 10 bits within +-65504.
// Where hooks run: a CPU model (parallel/transport.hpp) calls any CommHook<T> on the bucket's host
// buffer. A CUDA model (parallel/cuda/transport.cuh) runs the four built-ins on the device instead,
// selected by CommHookKind (--comm-hook allreduce|fp16|bf16|powersgd): fp16/bf16 convert the device
// bucket with the element functors below (the same code and rounding as the CPU hook), all-reduce
// the 16-bit buffer and convert back, all on its communication stream; PowerSGD runs the CPU hook's
// plan (parallel/powersgd.hpp) with cuBLAS products and an orthogonalisation kernel on that stream.
// Hooks passed to register_comm_hook are host code: a CUDA model refuses them (cuda_hook_refused).
// A hook keeps its own state (compression buffers, error feedback) in its closure, or in a state
// object it shares with the caller (PowerSgdState: the counters of bytes put on the wire); hooks
// are called from the thread that drives DDP only, one bucket at a time. PowerSGD
// (docs/decisions/0029) compresses each large gradient matrix M into low-rank factors P Q^T: one
// all-reduce launched with the bucket (small tensors + P), one more (Q) in `then`, at finish.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/config.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/parallel/grad_bucket.hpp"

namespace ddp::parallel {

// torch's allreduce_hook: the average over ranks (the backend divides the sum by the world size).
template <class T>
CommHook<T> allreduce_hook() {
  return [](GradBucket<T>& b) {
    return HookResult{.work = b.comm->all_reduce(b.buffer, {.op = comm::ReduceOp::Avg}),
                      .then = {}};
  };
}

namespace detail {
// The two element steps of the compression hooks, written once for both devices (the CPU hook's
// loops and the CUDA transport's kernels run these functors, so both round alike: float -> H rounds
// to nearest even, core/dtype.hpp). i indexes the bucket's flat buffer and its 16-bit copy alike.
// Compress: wire[i] = H(float(bucket[i]) * inv_world), inv_world = compress_scale(W) (one rounding
// in the product, one to H).
template <class T, class H>
struct CompressToWire {
  const T* bucket;
  H* wire;
  float inv_world;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    wire[i] = H(static_cast<float>(bucket[i]) * inv_world);
  }
};
// Decompress: bucket[i] = T(float(wire[i])) (exact: every half and bfloat16 value is a float).
template <class T, class H>
struct DecompressFromWire {
  const H* wire;
  T* bucket;
  DDP_HOST_DEVICE void operator()(std::size_t i) const {
    bucket[i] = static_cast<T>(static_cast<float>(wire[i]));
  }
};
// 1 / W in float: the factor each rank applies before the 16-bit sum (one place, so both devices
// use the same bits).
inline float compress_scale(int world) { return 1.0f / static_cast<float>(world); }

// torch's fp16_compress_hook / bf16_compress_hook with H = half / bfloat16: buffer / W rounded to
// H, summed over ranks in H, written back as T. One H buffer per bucket index, kept across steps.
template <class T, class H>
CommHook<T> compress_hook() {
  auto bufs = std::make_shared<std::vector<std::vector<H>>>();
  return [bufs](GradBucket<T>& b) {
    if (bufs->size() <= b.index) bufs->resize(b.index + 1);
    std::vector<H>& h = (*bufs)[b.index];
    h.resize(b.buffer.size());
    const CompressToWire<T, H> compress{
        .bucket = b.buffer.data(), .wire = h.data(), .inv_world = compress_scale(b.comm->size())};
    for (std::size_t i = 0; i < h.size(); ++i) compress(i);
    comm::Work w = b.comm->all_reduce(std::span<H>(h), {.op = comm::ReduceOp::Sum});
    // The data pointer, not &h: a later bucket may grow *bufs (moving the vectors, not their
    // storage).
    const DecompressFromWire<T, H> back{.wire = h.data(), .bucket = b.buffer.data()};
    return HookResult{.work = std::move(w), .then = [back, n = h.size()] {
                        for (std::size_t i = 0; i < n; ++i) back(i);
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
enum class CommHookKind : std::uint8_t { Allreduce, Fp16, Bf16, PowerSgd };

// "allreduce" | "fp16" | "bf16" | "powersgd" (--comm-hook; "none" means allreduce); ValueError
// otherwise.
inline CommHookKind parse_comm_hook(const std::string& s) {
  if (s == "allreduce" || s == "none" || s.empty()) return CommHookKind::Allreduce;
  if (s == "fp16") return CommHookKind::Fp16;
  if (s == "bf16") return CommHookKind::Bf16;
  if (s == "powersgd") return CommHookKind::PowerSgd;
  throw ValueError(ddp::detail::str("ddp: unknown communication hook ", ddp::detail::quoted(s),
                                    "; valid: allreduce, fp16, bf16, powersgd (--comm-hook)"));
}

// The --comm-hook name of k ("allreduce", "fp16", "bf16", "powersgd"; parse_comm_hook's inverse).
inline std::string_view comm_hook_name(CommHookKind k) noexcept {
  switch (k) {
    case CommHookKind::Allreduce: return "allreduce";
    case CommHookKind::Fp16: return "fp16";
    case CommHookKind::Bf16: return "bf16";
    case CommHookKind::PowerSgd: return "powersgd";
  }
  return "?";
}

// The ValueError of a CUDA model given a hook it does not run; `what` names it ("a hook passed to
// register_comm_hook").
inline ValueError cuda_hook_refused(std::string_view what) {
  return ValueError(ddp::detail::str(
      "ddp: ", what,
      " is not supported for CUDA models: they run the built-in hooks allreduce, fp16, bf16 and "
      "powersgd on the device (--comm-hook allreduce|fp16|bf16|powersgd, DdpOptions::comm_hook; "
      "PowerSGD's "
      "options in DdpOptions::powersgd); a hook passed to register_comm_hook runs on host buffers, "
      "for CPU "
      "models only"));
}

}  // namespace ddp::parallel
