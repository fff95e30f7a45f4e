// mpi::ShmWatch: how the mpi backend's shared-memory all-reduce (comm/shm/collectives.hpp) watches
// its peers (docs/decisions/0055). There is no socket to poll: a peer is alive while its pid is, a
// mismatch is handed back to the communicator as ShmMismatch (which reports it through the
// fingerprint exchange, so that every rank raises the same message as for any other mismatch), a
// timeout is a TimeoutError.
// SPDX-License-Identifier: MIT
#pragma once

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <string>

#include "ddp/comm/shm/collectives.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::mpi {

// Rank `peer` announced `theirs` where this rank runs a shared-memory all-reduce.
struct ShmMismatch {
  int peer = -1;
  Fingerprint theirs;
};

class ShmWatch {
 public:
  ShmWatch(const Fingerprint& fp, Clock::time_point deadline, const shm::Collectives& shm)
      : fp_(fp), deadline_(deadline), shm_(shm) {}

  const Fingerprint& fp() const noexcept { return fp_; }
  Clock::time_point deadline() const noexcept { return deadline_; }

  // The ranks share one kernel (shm::Segment checked the boot id); where they also share a pid
  // namespace (as under mpirun or srun) a pid that no longer exists is a rank that died (mpirun
  // usually ends the job first). A peer in another pid namespace has no pid here (pid_of is 0):
  // only the deadline catches its death.
  void check(int peer) const {
    const auto pid = shm_.pid_of(peer);
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
      throw CommError(ddp::detail::str("rank ", peer, " (pid ", pid,
                                       ") exited while this rank waited for it in ",
                                       fp_.full_label(), " (shared memory)"));
  }
  [[noreturn]] void mismatch(int peer, const Fingerprint& theirs) const {
    throw ShmMismatch{peer, theirs};
  }
  [[noreturn]] void timed_out(int, const std::string& what) const { throw TimeoutError(what); }

 private:
  const Fingerprint& fp_;
  Clock::time_point deadline_;
  const shm::Collectives& shm_;
};

}  // namespace ddp::comm::mpi
