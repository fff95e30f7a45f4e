// run_p2p_batch: how the tcp backend runs send and recv ops, batched in one poll loop.
// SPDX-License-Identifier: MIT
//
// How it works: consecutive send/recv ops (up to the next collective) run as one batch in one poll
// loop, and ops issued while the batch runs join it (OpQueue::wake_fd wakes the loop). So a rank
// may post an irecv before its own send, as in MPI: "irecv from left; send to right" around a ring
// completes. Per (peer, direction) ops still run one after another, in issue order, as the byte
// stream requires: only the oldest op of each (peer, direction) is active, and each active transfer
// carries its own op's fingerprint (Transfer::fp), which the receiver checks against its own.
// Example, 3 ranks in a ring: rank 1 issues irecv from 0, then send to 2. The batch starts with the
// irecv alone; the send joins it when issued; both are active at once (different peers), so rank
// 1's send to 2 proceeds while it waits for rank 0.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/comm/tcp/failure_protocol.hpp"
#include "ddp/comm/tcp/mesh.hpp"
#include "ddp/comm/tcp/op_queue.hpp"

namespace ddp::comm::tcp {

// Runs `first` and every send/recv that joins it until none is left; completes each op's Work. On a
// failure every op of the batch fails with it. `position`: the last collective this rank started
// (for the failure report).
inline void run_p2p_batch(Task first, OpQueue& queue, Mesh& mesh, FailureProtocol& failure,
                          std::uint64_t position) {
  std::vector<Task> live;
  auto admit = [&](Task t) {
    t.deadline = Clock::now() + t.timeout;
    t.xfer.fp = nullptr;
    live.push_back(std::move(t));
    mesh.start(live.back().xfer,
               OpContext{.fp = live.back().fp, .deadline = {}, .strict_hangup = true});
  };
  admit(std::move(first));
  while (!live.empty()) {
    queue.take_p2p(admit);
    if (const auto err = failure.not_run(live.front().state->label)) {
      for (auto& t : live) t.state->complete(failure.not_run(t.state->label));
      return;
    }
    // The first op of each (peer, direction) is active; Transfer::fp points at its own fingerprint.
    std::vector<std::size_t> active;
    std::vector<Transfer> xs;
    auto deadline = Clock::time_point::max();
    for (std::size_t i = 0; i < live.size(); ++i) {
      bool blocked = false;
      for (std::size_t j : active)
        blocked = blocked || (live[j].xfer.peer == live[i].xfer.peer &&
                              live[j].xfer.is_send == live[i].xfer.is_send);
      if (blocked) continue;
      active.push_back(i);
      xs.push_back(live[i].xfer);
      xs.back().fp = &live[i].fp;
      deadline = std::min(deadline, live[i].deadline);
    }
    const OpContext ctx{.fp = live[active.front()].fp, .deadline = deadline, .strict_hangup = true};
    try {
      mesh.run_until_any(xs, ctx, queue.wake_fd());
    } catch (const PeerFailure& f) {
      std::size_t culprit = active.front();
      for (std::size_t k = 0; k < active.size(); ++k)
        if (xs[k].peer == f.peer && !xs[k].finished()) culprit = active[k];
      const auto err = failure.fail(live[culprit], failure.describe(live[culprit], f),
                                    f.kind == PeerFailure::Kind::Timeout, position);
      for (auto& t : live) t.state->complete(err);
      return;
    }
    // back to front, so erasing keeps indices valid
    for (std::size_t k = active.size(); k-- > 0;) {
      live[active[k]].xfer = xs[k];
      if (xs[k].finished()) {
        live[active[k]].state->complete();
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(active[k]));
      }
    }
  }
}

}  // namespace ddp::comm::tcp
