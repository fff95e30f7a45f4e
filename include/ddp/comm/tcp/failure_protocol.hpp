// FailureProtocol: how a failure spreads through a tcp communicator and what each rank's message
// says (docs/decisions/0009).
// SPDX-License-Identifier: MIT
//
// The rank that sees a failure first (mismatched header, peer closed, timeout) publishes its
// message and position in the store (FailureReport), then shuts all its sockets down. Its peers
// see the close in whatever op they are in (every op polls every peer), read the message and fail
// with "rank r reported: ...", or without one "rank r closed its connection (process died?)". They
// spread it the same way, so every rank fails promptly; the communicator stays failed and later
// ops fail at once quoting the first error (FailureState). With the store gone too, a rank that
// sees a single peer close watches the others for up to kLoneCloseGrace and names every rank that
// closed, first-seen first. A rank whose collective times out also collects the others' positions
// briefly and names the ranks that never reached the op or ran a different one. Example, 3 ranks,
// rank 2 never calls all_reduce #1 (300 ms timeout): rank 0 fails with
//   "... all_reduce #1 (F32 x 4) timed out after 300 ms while receiving from rank 2
//    (0 of 16 bytes). ...
//    Ranks that never reached all_reduce #1: 2 (no report: busy outside ddp, stuck or dead)."
// and rank 1 with "... failed: rank 0 reported: <rank 0's message>".
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/failure_report.hpp"
#include "ddp/comm/failure_state.hpp"
#include "ddp/comm/tcp/mesh.hpp"
#include "ddp/comm/tcp/op_queue.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm::tcp {

class FailureProtocol {
 public:
  // Keys under `prefix`; `mesh` is closed on the first failure.
  FailureProtocol(store::Store& store, const std::string& prefix, int rank, int size, Mesh& mesh)
      : report_(store, prefix, rank, size), mesh_(mesh) {}

  bool failed() const { return state_.failed(); }
  // The error for an op not run because the communicator failed earlier; nullptr while healthy.
  std::exception_ptr not_run(const std::string& label) const { return state_.not_run(label); }

  // The user's message for a transfer failure of task t. Reads the peers' messages from the store.
  std::string describe(const Task& t, const PeerFailure& f) {
    const std::string& label = t.state->label;
    switch (f.kind) {
      case PeerFailure::Kind::Mismatch:
        return ddp::detail::str(
            label, " does not match rank ", f.peer, ", which ran ", f.theirs.full_label(),
            " at this point. Every rank must call the same collectives in the same order with "
            "the same dtype, count, root and op.");
      case PeerFailure::Kind::Protocol:
        return ddp::detail::str(label, " failed: rank ", f.peer,
                                " sent bytes that are not a ddp frame (", f.detail,
                                "); is another program connected?");
      case PeerFailure::Kind::Timeout:
        return ddp::detail::str(label, " timed out after ", t.timeout.count(), " ms while ",
                                f.detail,
                                ". Raise --timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.");
      case PeerFailure::Kind::Closed: break;
    }
    // Prefer a peer that left no message (it died: the root cause) over one that failed after it.
    std::vector<int> closed = f.closed;
    std::string reported;
    for (std::size_t i = 0; i < closed.size(); ++i) {
      const int p = closed[i];
      std::string msg = report_.message_of(p, t.timeout);
      // A lone close, no message, store gone: p may have failed because another rank died an
      // instant earlier whose close has not reached us yet (a dying process's sockets close one by
      // one). Give the other connections a moment before blaming p alone.
      if (msg.empty() && report_.store_lost() && closed.size() == 1)
        mesh_.add_hung_up_peers(closed,
                                std::min<std::chrono::milliseconds>(t.timeout, kLoneCloseGrace));
      // no messages to tell the dead from the failed
      if (msg.empty() && report_.store_lost() && closed.size() > 1) {
        std::vector<int> others;
        for (int q : closed)
          if (q != p) others.push_back(q);
        return ddp::detail::str(
            label, " failed: rank ", p, " closed its connection (process died?) [", f.detail,
            "]; rank(s) ", ddp::detail::join(others, ", "),
            " closed theirs too, and with the store unreachable which of them died first is "
            "unknown");
      }
      if (msg.empty())
        return ddp::detail::str(label, " failed: rank ", p,
                                " closed its connection (process died?) [", f.detail, "]");
      if (reported.empty())
        reported = ddp::detail::str(label, " failed: rank ", p, " reported: ", msg);
    }
    return reported;
  }

  // Marks the communicator failed, publishes msg with `seq` (the last collective this rank
  // started), closes the sockets (telling every peer) and, for a timeout, appends what the other
  // ranks were doing. Returns t's exception: TimeoutError or CommError.
  std::exception_ptr fail(const Task& t, std::string msg, bool timed_out, std::uint64_t seq) {
    state_.fail(msg);
    report_.publish(msg, seq, t.fp, t.timeout);
    mesh_.close_all();
    if (timed_out && !t.fp.is_p2p()) msg += report_.timeout_report(t.fp, t.timeout);
    if (timed_out) return std::make_exception_ptr(TimeoutError(msg));
    return std::make_exception_ptr(CommError(msg));
  }

 private:
  // A dead process's remaining sockets close within microseconds; a loaded 2-core machine can take
  // milliseconds.
  static constexpr std::chrono::milliseconds kLoneCloseGrace{250};

  FailureReport report_;
  Mesh& mesh_;
  FailureState state_;  // any issuing thread reads it
};

}  // namespace ddp::comm::tcp
