// tcp::ShmWatch: how the tcp backend's shared-memory collectives (comm/shm/collectives.hpp) watch
// their peers: through the TCP mesh, which stays open beside the segment, and with Mesh::run's
// PeerFailure, so that TcpCommunicator reports shm failures exactly like socket ones.
// SPDX-License-Identifier: MIT
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <span>
#include <string>
#include <thread>

#include "ddp/comm/shm/collectives.hpp"
#include "ddp/comm/tcp/mesh.hpp"
#include "ddp/core/fd.hpp"

namespace ddp::comm::tcp {

class ShmWatch {
 public:
  // `wake` is an eventfd the liveness probe signals itself (one per communicator, reused by every
  // op).
  ShmWatch(Mesh& mesh, const OpContext& ctx, const Fd& wake)
      : mesh_(mesh), ctx_(ctx), wake_(wake) {}

  const Fingerprint& fp() const noexcept { return ctx_.fp; }
  Clock::time_point deadline() const noexcept { return ctx_.deadline; }

  // Liveness through the mesh: with no transfers and the eventfd already signalled, run_until_any
  // polls every peer socket once and throws PeerFailure::Closed for one that hung up (a failing
  // rank closes them).
  void check(int) {
    const std::uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
    OpContext probe = ctx_;
    probe.deadline = Clock::time_point::max();
    mesh_.run_until_any(std::span<Transfer>(), probe, wake_.get());
  }

  // Both sides of a mismatch see it. So that the messages read like the socket path's (one rank
  // names the mismatch, the others quote it), the higher rank reports it when its op also runs in
  // shared memory; the lower one waits for it to fail and close its sockets, which check() turns
  // into "rank j reported".
  [[noreturn]] void mismatch(int peer, const Fingerprint& theirs) {
    const bool peer_here = theirs.kind == OpKind::AllReduce || theirs.kind == OpKind::Broadcast ||
                           theirs.kind == OpKind::AllGather || theirs.kind == OpKind::Barrier;
    if (peer > mesh_.rank() && peer_here && theirs.seq == ctx_.fp.seq)
      while (Clock::now() < ctx_.deadline) {
        check(peer);
        std::this_thread::sleep_for(shm::kNapTime);
      }
    PeerFailure f;
    f.kind = PeerFailure::Kind::Mismatch;
    f.peer = peer;
    f.theirs = theirs;
    throw f;
  }

  [[noreturn]] void timed_out(int peer, std::string what) {
    PeerFailure f;
    f.kind = PeerFailure::Kind::Timeout;
    f.peer = peer;
    f.detail = std::move(what);
    throw f;
  }

  static Fd make_wake() { return Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)); }

 private:
  Mesh& mesh_;
  const OpContext& ctx_;
  const Fd& wake_;
};

}  // namespace ddp::comm::tcp
