// DDP communication hooks: the built-in ones, allreduce, fp16 and bf16 compression (here) and
// PowerSGD (parallel/powersgd.hpp), for either device; selected by name with --comm-hook
// (make_comm_hook in parallel/ddp_options.hpp) or passed to register_comm_hook like a user's own.
// SPDX-License-Identifier: MIT
//
// The contract (GradBucket<T, D> in, HookResult out) is in parallel/grad_bucket.hpp.
//
//   ddp::parallel::DistributedDataParallel<float, Cuda> model(net, comm);
//   model.register_comm_hook(fp16_compress_hook<float, Cuda>());   // or any hook, between steps
//
// The compression hooks follow torch's default_hooks: divide by the world size BEFORE the reduction
// and sum the 16-bit values, so the sum of W averages of values within range stays within range (an
// average of 40000 over 2 ranks is 40000, where summing first would overflow fp16's 65504 into
// inf). bf16 keeps fp32's exponent range with 8 bits of mantissa; fp16 10 bits within +-65504. The
// element steps run through Kernels<D>::for_each_index on b.exec: the same functors, so the same
// rounding, on both devices.
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
#include "ddp/kernels/cpu/kernels.hpp"
#include "ddp/kernels/kernels.hpp"
#include "ddp/parallel/grad_bucket.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::parallel {

namespace detail {
// A ValueError when `hook` is empty (register_comm_hook's argument).
template <class T, Device D>
void require_hook(const CommHook<T, D>& hook) {
  if (!hook)
    throw ValueError(
        "ddp: register_comm_hook got an empty hook; pass e.g. parallel::allreduce_hook<T, D>()");
}
// The bucket's average over ranks, on b.exec (the backend divides the sum by the world size).
template <class T, Device D>
HookResult all_reduce_average(GradBucket<T, D>& b) {
  return HookResult{.work = b.comm->all_reduce(
                        b.view(), {.op = comm::ReduceOp::Avg, .stream = stream_of(b.exec)}),
                    .then = {}};
}
}  // namespace detail

// torch's allreduce_hook: the average over ranks.
template <class T, Device D = Cpu>
CommHook<T, D> allreduce_hook() {
  return [](GradBucket<T, D>& b) { return detail::all_reduce_average(b); };
}

namespace detail {
// The two element steps of the compression hooks, written once for both devices (run through
// Kernels<D>::for_each_index, so both round alike: float -> H rounds to nearest even,
// core/dtype.hpp). i indexes the bucket's flat buffer and its 16-bit copy alike.
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
// H, summed over ranks in H, written back as T; all on b.exec. One H buffer per bucket index, in
// D's memory, kept across steps (on CUDA freed in stream order, like DDP's buckets).
template <class T, class H, Device D>
CommHook<T, D> compress_hook() {
  auto wires = std::make_shared<std::vector<Tensor<H, D>>>();
  return [wires](GradBucket<T, D>& b) {
    if (wires->size() <= b.index) wires->resize(b.index + 1);
    Tensor<H, D>& wire = (*wires)[b.index];
    const auto n = static_cast<std::int64_t>(b.buffer.size());
    if (wire.numel() != n) wire = Tensor<H, D>(Shape{n});
    const Exec<D> exec = b.exec;
    Kernels<D>::for_each_index(exec, b.buffer.size(),
                               CompressToWire<T, H>{.bucket = b.buffer.data(),
                                                    .wire = wire.data(),
                                                    .inv_world = compress_scale(b.comm->size())});
    comm::Work w =
        b.comm->all_reduce(wire.view(), {.op = comm::ReduceOp::Sum, .stream = stream_of(exec)});
    // The data pointer, not the tensor: a later bucket may grow *wires (moving the tensors, not
    // their storage).
    const DecompressFromWire<T, H> back{.wire = wire.data(), .bucket = b.buffer.data()};
    return HookResult{.work = std::move(w), .then = [back, exec, n = b.buffer.size()] {
                        Kernels<D>::for_each_index(exec, n, back);
                      }};
  };
}
}  // namespace detail

template <class T, Device D = Cpu>
CommHook<T, D> fp16_compress_hook() {
  return detail::compress_hook<T, half, D>();
}
template <class T, Device D = Cpu>
CommHook<T, D> bf16_compress_hook() {
  return detail::compress_hook<T, bfloat16, D>();
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

}  // namespace ddp::parallel
