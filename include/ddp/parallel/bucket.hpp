// Bucket assignment for DistributedDataParallel: which parameters' gradients share one flat
// all-reduce buffer.
// SPDX-License-Identifier: MIT
//
// How it works (PyTorch's compute_bucket_assignment_by_size, single dtype): walk the parameters in
// the given order (initially reverse registration order, since backward produces the last layer's
// gradients first; after the first iteration the order in which gradients actually arrived) and
// append each one to the open bucket; close the bucket once it holds at least `cap` bytes. The
// first bucket uses the small `first_cap` so that the first all-reduce starts as early as possible
// during backward; every later bucket uses `cap`. Worked example: parameters of 600 KiB, 600 KiB,
// 10 MiB, 20 MiB, 4 KiB (in that order), first_cap 1 MiB, cap 25 MiB -> buckets {0, 1} (1.2 MiB >=
// 1 MiB), {2, 3} (30 MiB >= 25 MiB), {4}. A bucket's flat buffer holds its parameters' gradients
// back to back in bucket order: offsets[k] is the element offset of params[k].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::parallel {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
// PyTorch's bucket_cap_mb = 25
inline constexpr std::size_t kDefaultBucketCapBytes = 25 * kMiB;
// PyTorch's first bucket (1 MiB)
inline constexpr std::size_t kDefaultFirstBucketCapBytes = 1 * kMiB;

// One bucket: parameter indices (into the module's parameters() list) in flat-buffer order.
struct BucketLayout {
  std::vector<std::size_t> params;    // indices into the parameter list
  std::vector<std::int64_t> offsets;  // element offset of each parameter in the flat buffer
  std::int64_t numel = 0;             // total elements
};

// Groups parameters into buckets. `order` lists every parameter index exactly once (the order in
// which gradients are expected); `numel[i]` is parameter i's element count; `element_bytes` the
// gradient dtype's size. Throws ValueError when `order` is not a permutation of 0..numel.size()-1
// or a cap is 0.
inline std::vector<BucketLayout> assign_buckets(const std::vector<std::size_t>& order,
                                                const std::vector<std::int64_t>& numel,
                                                std::size_t element_bytes, std::size_t cap_bytes,
                                                std::size_t first_cap_bytes) {
  if (cap_bytes == 0 || first_cap_bytes == 0)
    throw ValueError(ddp::detail::str("ddp: bucket caps must be > 0 bytes, got cap ", cap_bytes,
                                      " and first cap ", first_cap_bytes,
                                      "; check --bucket-cap-mb"));
  if (order.size() != numel.size())
    throw ValueError(ddp::detail::str("ddp: bucket order lists ", order.size(),
                                      " parameters but the model has ", numel.size()));
  std::vector<bool> seen(numel.size(), false);
  std::vector<BucketLayout> out;
  BucketLayout open;
  std::size_t open_bytes = 0;
  for (std::size_t idx : order) {
    if (idx >= numel.size() || seen[idx])
      throw ValueError(ddp::detail::str("ddp: bucket order is not a permutation: index ", idx,
                                        " is ", idx >= numel.size() ? "out of range" : "repeated"));
    seen[idx] = true;
    open.params.push_back(idx);
    open.offsets.push_back(open.numel);
    open.numel += numel[idx];
    open_bytes += static_cast<std::size_t>(numel[idx]) * element_bytes;
    const std::size_t cap = out.empty() ? first_cap_bytes : cap_bytes;
    if (open_bytes >= cap) {
      out.push_back(std::move(open));
      open = BucketLayout{};
      open_bytes = 0;
    }
  }
  if (!open.params.empty()) out.push_back(std::move(open));
  return out;
}

// Reverse registration order: n-1, n-2, ..., 0 (the order a sequential model's backward produces
// gradients).
inline std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> o(n);
  for (std::size_t i = 0; i < n; ++i) o[i] = n - 1 - i;
  return o;
}

}  // namespace ddp::parallel
