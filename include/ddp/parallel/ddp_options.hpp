// DdpOptions: every knob of DistributedDataParallel, passed once: DDP reads its own
// (broadcast_buffers), the reducer the bucket schedule's, the device's transport the hook and
// bucket-view ones. make_comm_hook builds the hook a transport runs from them.
// SPDX-License-Identifier: MIT
#pragma once

#include <concepts>
#include <cstddef>
#include <optional>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/comm_hooks.hpp"
#include "ddp/parallel/grad_bucket.hpp"
#include "ddp/parallel/powersgd.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::parallel {

struct DdpOptions {
  std::size_t bucket_cap_bytes = kDefaultBucketCapBytes;             // --bucket-cap-mb (25)
  std::size_t first_bucket_cap_bytes = kDefaultFirstBucketCapBytes;  // 1 MiB
  // rank 0's buffers before a forward that follows a synchronised one
  bool broadcast_buffers = true;
  // true: parameters without a gradient are allowed (reducer.hpp)
  bool find_unused_parameters = false;
  // rebuild buckets in gradient arrival order after the first step
  bool rebuild_buckets = true;
  // --comm-hook allreduce|fp16|bf16|powersgd (CPU and CUDA)
  CommHookKind comm_hook = CommHookKind::Allreduce;
  // comm_hook == PowerSgd: --powersgd-rank, --powersgd-start-iter (parallel/powersgd.hpp)
  PowerSgdOptions powersgd;
  // Every step uses the same parameters (torch's static_graph): unused ones are found in the first
  // synchronised step, then reused without the flag all-reduce (reducer.hpp). --static-graph
  bool static_graph = false;
  // Gradients live in the buckets (torch's gradient_as_bucket_view): grad() is a view of the
  // parameter's slot, so no copy into the bucket before the all-reduce nor back after it
  // (parallel/grad_views.hpp). --gradient-as-bucket-view[=true|false]. Unset: on for CPU models,
  // off for CUDA ones until a GPU run has verified it there (docs/decisions/0054; torch's default
  // is off because its users may replace or detach .grad, which ddp's grad() does not allow).
  std::optional<bool> gradient_as_bucket_view;

  template <Device D>
  bool grads_in_buckets() const {
    return gradient_as_bucket_view.value_or(std::same_as<D, Cpu>);
  }
};

// Bytes from a --bucket-cap-mb value (fractions allowed: 0.25 = 256 KiB).
inline std::size_t bucket_cap_bytes_from_mb(double mb) {
  if (!(mb > 0.0)) throw ValueError(ddp::detail::str("ddp: --bucket-cap-mb must be > 0, got ", mb));
  return static_cast<std::size_t>(mb * static_cast<double>(kMiB));
}

// The built-in hook k for device D (what a transport runs until register_comm_hook replaces it);
// `powersgd`: the options of CommHookKind::PowerSgd (ValueError when invalid:
// validate_powersgd_options).
template <class T, Device D = Cpu>
CommHook<T, D> make_comm_hook(CommHookKind k, const PowerSgdOptions& powersgd = {}) {
  switch (k) {
    case CommHookKind::Fp16: return fp16_compress_hook<T, D>();
    case CommHookKind::Bf16: return bf16_compress_hook<T, D>();
    case CommHookKind::PowerSgd: return powersgd_hook<T, D>(powersgd);
    case CommHookKind::Allreduce:
    default: return allreduce_hook<T, D>();
  }
}

}  // namespace ddp::parallel
