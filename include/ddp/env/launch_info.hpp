// LaunchInfo: what a process knows about its place in the job, whichever launcher started it.
// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>
#include <string>

namespace ddp::env {

struct LaunchInfo {
  int rank = 0;  // global rank, 0 <= rank < world_size
  int world_size = 1;
  int local_rank = 0;  // rank among the processes of this node
  int local_world_size = 1;
  // index of this node (GROUP_RANK under torchrun, SLURM_NODEID under Slurm)
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr;  // host of the rendezvous store; empty for a single process
  std::uint16_t master_port = 0;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT; 0 when not restarted
  std::string run_id;     // TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ...; empty when unknown
  // torchrun's agent already hosts a TCPStore on master_addr:master_port
  bool launcher_owns_store = false;
  // the policy that produced this: "torchrun", "openmpi", "flags", ...
  std::string source = "single-process";
};

}  // namespace ddp::env
