// FailureReport: how a communicator's ranks tell each other about a failure through the store
// (tcp, nccl): publish a rank's error and position, read another rank's, and explain a timeout by
// naming the ranks that never reached the op (docs/decisions/0009).
// SPDX-License-Identifier: MIT
//
// The store is the side channel: NCCL cannot tell a rank that a peer aborted (its kernels just
// wait), and a tcp rank that sees a peer's socket close needs that peer's message. Keys, under the
// communicator's prefix:
//   failed      counter, incremented by every failing rank (one key to poll cheaply)
//   error/<r>   rank r's first error message
//   state/<r>   "seq\tlabel" of the collective rank r was in when it failed, e.g.
//               "5\tall_reduce #5 (F32 x 4, sum)"
// Example: rank 1 never calls all_reduce #5. Rank 0 times out, publishes state/0, waits a grace
// period for state/1, finds none and reports " Ranks that never reached all_reduce #5: 1 (...)".
//
// Budget: the store's host may be frozen (SIGSTOP) or cut off, and a full store timeout per call
// would multiply a failing rank's exit time. Every store call here, and the grace period, is
// capped at budget(T) = T/4 within [0.1 s, 3 s] for an op timeout T (store::ScopedTimeoutCap).
// After one failed call the store counts as lost and later calls skip it. Thread-safe: the store
// is, and the "lost" flag is atomic.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "ddp/comm/types.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm {

class FailureReport {
 public:
  // Keys live under `prefix` ("ddp/tcp/0/"); rank and size are the communicator's.
  FailureReport(store::Store& store, std::string prefix, int rank, int size)
      : store_(store), prefix_(std::move(prefix)), rank_(rank), size_(size) {}

  // See the file comment.
  static std::chrono::milliseconds budget(std::chrono::milliseconds op_timeout) {
    return std::clamp(op_timeout / 4, std::chrono::milliseconds(100),
                      std::chrono::milliseconds(3000));
  }
  // What state/<r> holds: the collective sequence number reached and the label of the op at hand.
  static std::string state_text(std::uint64_t seq, const Fingerprint& at) {
    return ddp::detail::str(seq, '\t', at.full_label());
  }

  // Publishes this rank's first error and its position (state_text(seq, at)). Never throws. On
  // return every rank can read both: PyTorch's SET has no reply, so the final ADD on the same
  // connection proves the server applied the SETs.
  void publish(const std::string& msg, std::uint64_t seq, const Fingerprint& at,
               std::chrono::milliseconds op_timeout) noexcept {
    if (store_lost_) return;
    store::ScopedTimeoutCap cap(budget(op_timeout));
    try {
      store_.set(key("error/", rank_), msg);
      store_.set(key("state/", rank_), state_text(seq, at));
      store_.add(prefix_ + "failed", 1);
    } catch (const std::exception& e) {
      DDP_LOG_WARN("could not publish the failure in the store: ", e.what());
      store_lost_ = true;
    }
  }

  // Rank p's published error; empty when it published none or the store is unreachable.
  std::string message_of(int p, std::chrono::milliseconds op_timeout) {
    if (store_lost_) return {};
    store::ScopedTimeoutCap cap(budget(op_timeout));
    try {
      if (store_.check(key("error/", p))) return store_.get_string(key("error/", p));
    } catch (const std::exception&) {  // the store may have died with its host rank
      store_lost_ = true;
    }
    return {};
  }

  // "rank k reported: ..." for the first other rank that published, a sentence saying so when the
  // store is unreachable (its host may be dead: news too), else empty. Cheap while nobody failed:
  // one CHECK of `failed`.
  std::string any_peer_failure(std::chrono::milliseconds op_timeout) {
    if (store_lost_) return "the store became unreachable; rank 0 may have died";
    store::ScopedTimeoutCap cap(budget(op_timeout));
    try {
      if (!store_.check(prefix_ + "failed")) return {};
      for (int k = 0; k < size_; ++k)
        if (k != rank_ && store_.check(key("error/", k)))
          return ddp::detail::str("rank ", k, " reported: ", store_.get_string(key("error/", k)));
    } catch (const std::exception& e) {
      store_lost_ = true;
      return ddp::detail::str("the store became unreachable (", e.what(),
                              "); rank 0 may have died");
    }
    return {};
  }

  // After `fp` timed out here, e.g.
  //   " Ranks that never reached all_reduce #5: 1 (last in all_reduce #4 (...)), 3 (no report:
  //   busy outside ddp, stuck or dead). At #5 rank 2 ran all_reduce #5 (F32 x 9, sum)."
  // or " Every other rank reached #5 too." Waits up to the budget for the others' positions
  // (published once this rank's failure reaches them).
  std::string timeout_report(const Fingerprint& fp, std::chrono::milliseconds op_timeout) {
    if (store_lost_) return " The store is unreachable, so the other ranks' positions are unknown.";
    std::vector<std::string> keys;
    std::vector<int> ranks;
    for (int k = 0; k < size_; ++k)
      if (k != rank_) {
        keys.push_back(key("state/", k));
        ranks.push_back(k);
      }
    store::ScopedTimeoutCap cap(budget(op_timeout));
    try {
      store_.wait(keys, budget(op_timeout));
    } catch (const std::exception&) {  // ranks that never report are the finding
    }
    std::vector<std::string> behind, different;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::string state;
      try {
        if (!store_lost_ && store_.check(keys[i])) state = store_.get_string(keys[i]);
      } catch (const std::exception&) {
        store_lost_ = true;  // its host exited: do not wait out the budget once per rank
      }
      const auto tab = state.find('\t');
      if (tab == std::string::npos) {
        behind.push_back(
            ddp::detail::str(ranks[i], " (no report: busy outside ddp, stuck or dead)"));
        continue;
      }
      const std::uint64_t seq = std::stoull(state.substr(0, tab));
      const std::string what = state.substr(tab + 1);
      if (seq < fp.seq)
        behind.push_back(ddp::detail::str(ranks[i], " (last in ", what, ")"));
      else if (seq == fp.seq && what != fp.full_label())
        different.push_back(ddp::detail::str(ranks[i], " ran ", what));
    }
    std::string out;
    if (!behind.empty())
      out += ddp::detail::str(" Ranks that never reached ", op_name(fp.kind), " #", fp.seq, ": ",
                              ddp::detail::join(behind, ", "), '.');
    if (!different.empty())
      out +=
          ddp::detail::str(" At #", fp.seq, " rank ", ddp::detail::join(different, "; rank "), '.');
    if (out.empty()) out = ddp::detail::str(" Every other rank reached #", fp.seq, " too.");
    return out;
  }

  // True once a store call of a report failed (the store's host is probably gone).
  bool store_lost() const noexcept { return store_lost_; }

 private:
  std::string key(std::string_view what, int r) const { return ddp::detail::str(prefix_, what, r); }

  store::Store& store_;
  std::string prefix_;
  int rank_, size_;
  std::atomic<bool> store_lost_{false};
};

}  // namespace ddp::comm
