// The fault hook of the exact-resume tests, linked into test builds of the multinode and mingpt examples
// (tests/integration/examples/CMakeLists.txt: multinode_faults, mingpt_faults; the programs themselves carry no test code).
// With DDP_TEST_DIE_AFTER_EPOCH=E, every rank meets in a barrier right after epoch E's snapshot (E as the program
// counts epochs: from 0 in multinode, from 1 in mingpt), so the snapshot is on disk, and then global rank 1 kills
// itself with SIGKILL -- on the launcher's first attempt only (TORCHELASTIC_RESTART_COUNT unset or 0), so the
// restarted job (--max-restarts) resumes from that snapshot and runs to the end.
// SPDX-License-Identifier: MIT
#include <csignal>

#include <ddp/comm/communicator.hpp>
#include <ddp/env/env.hpp>
#include <ddp/train/bookkeeper.hpp>

namespace die_after_epoch {

// Installs the hook before main (train::after_snapshot_hook); a value that is not a number fails at start-up.
[[maybe_unused]] const bool installed = [] {
  const ddp::env::Env env = ddp::env::Env::process();
  const auto epoch = env.int_get("DDP_TEST_DIE_AFTER_EPOCH", "the fault tests");
  if (!epoch || env.int_get("TORCHELASTIC_RESTART_COUNT", "the launcher").value_or(0) != 0) return false;
  ddp::train::after_snapshot_hook() = [die_after = *epoch](ddp::comm::Communicator& comm, long epoch_done) {
    if (epoch_done != die_after) return;
    comm.barrier().wait();  // the snapshot is on disk before the simulated crash
    if (comm.rank() == 1) std::raise(SIGKILL);
  };
  return true;
}();

}  // namespace die_after_epoch
