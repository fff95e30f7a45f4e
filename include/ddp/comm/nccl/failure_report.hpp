// How nccl ranks tell each other about a failure through the store: publish a rank's error, notice
// another rank's, and explain a timeout by naming the ranks that never reached the op (DESIGN D9).
// SPDX-License-Identifier: MIT
//
// NCCL itself cannot tell a rank that a peer aborted or died (its kernels just wait), so the store is
// the side channel. Keys, under the communicator's prefix:
//   failed        counter, incremented by every failing rank (one key to poll cheaply)
//   error/<r>     rank r's first error message
//   state/<r>     "seq\tlabel" of the op rank r was in when it timed out, e.g. "5\tall_reduce #5 (F32 x 4, sum)"
// Example: rank 1 never calls all_reduce #5. Rank 0 times out, writes state/0 = "5\t...", waits a grace
// period for state/1, finds none and reports " Ranks that never reached all_reduce #5: 1 (no report ...)".
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "ddp/comm/types.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm::nccl {

inline std::string state_text(const Fingerprint& fp) { return ddp::detail::str(fp.seq, '\t', fp.full_label()); }

// Every store call below is best effort and capped (store::ScopedTimeoutCap): the store's host may be frozen
// or cut off, and a full store timeout per call would multiply the time a failing rank takes to exit.
inline constexpr std::chrono::milliseconds kReportCap{3000};
inline std::chrono::milliseconds report_budget(std::chrono::milliseconds op_timeout) {
  return std::clamp(op_timeout / 4, std::chrono::milliseconds(100), kReportCap);
}

inline bool store_has(store::Store& store, const std::string& key) {
  const std::string keys[] = {key};
  return store.check(keys);
}

// Publishes rank's first error; never throws (the store may be gone with rank 0).
inline void publish_failure(store::Store& store, const std::string& prefix, int rank, const std::string& msg) noexcept {
  store::ScopedTimeoutCap cap(kReportCap);
  try {
    store.set(ddp::detail::str(prefix, "error/", rank), msg);
    store.add(prefix + "failed", 1);
  } catch (const std::exception& e) {
    DDP_LOG_WARN("could not publish the nccl failure in the store: ", e.what());
  }
}

// "rank 1 reported: ..." when another rank published a failure, else empty.
inline std::string peer_failure(store::Store& store, const std::string& prefix, int rank, int size) {
  store::ScopedTimeoutCap cap(kReportCap);
  try {
    if (!store_has(store, prefix + "failed")) return {};
    for (int k = 0; k < size; ++k) {
      const std::string key = ddp::detail::str(prefix, "error/", k);
      if (k != rank && store_has(store, key)) return ddp::detail::str("rank ", k, " reported: ", store.get_string(key));
    }
  } catch (const std::exception& e) {  // the store's host (rank 0) may be gone: that is news too
    return ddp::detail::str("the store became unreachable (", e.what(), "); rank 0 may have died");
  }
  return {};
}

// " Ranks that never reached all_reduce #5: 1 (last in broadcast #4 ...)." (see the file comment).
inline std::string timeout_report(store::Store& store, const std::string& prefix, int rank, int size,
                                  const Fingerprint& fp, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  std::vector<int> ranks;
  for (int k = 0; k < size; ++k)
    if (k != rank) {
      keys.push_back(ddp::detail::str(prefix, "state/", k));
      ranks.push_back(k);
    }
  store::ScopedTimeoutCap cap(report_budget(timeout));
  try {
    store.set(ddp::detail::str(prefix, "state/", rank), state_text(fp));
    store.wait(keys, report_budget(timeout));
  } catch (const std::exception&) {  // ranks that never report are the finding
  }
  std::vector<std::string> behind, different;
  bool store_lost = false;  // after one failed read, do not wait on a dead store once per rank
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::string state;
    try {
      if (!store_lost && store_has(store, keys[i])) state = store.get_string(keys[i]);
    } catch (const std::exception&) {
      store_lost = true;
    }
    const auto tab = state.find('\t');
    if (tab == std::string::npos) {
      behind.push_back(ddp::detail::str(ranks[i], " (no report: busy outside ddp, stuck or dead)"));
      continue;
    }
    const std::uint64_t seq = std::stoull(state.substr(0, tab));
    const std::string what = state.substr(tab + 1);
    if (seq < fp.seq) behind.push_back(ddp::detail::str(ranks[i], " (last in ", what, ")"));
    else if (seq == fp.seq && what != fp.full_label()) different.push_back(ddp::detail::str(ranks[i], " ran ", what));
  }
  std::string out;
  if (!behind.empty())
    out += ddp::detail::str(" Ranks that never reached ", op_name(fp.kind), " #", fp.seq, ": ",
                            ddp::detail::join(behind, ", "), '.');
  if (!different.empty())
    out += ddp::detail::str(" At #", fp.seq, " rank ", ddp::detail::join(different, "; rank "), '.');
  return out;
}

}  // namespace ddp::comm::nccl
