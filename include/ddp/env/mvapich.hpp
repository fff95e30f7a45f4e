// Mvapich: launcher policy for MVAPICH2's mpirun_rsh / mpiexec, recognised by MV2_COMM_WORLD_SIZE.
// SPDX-License-Identifier: MIT
//
// Written from MVAPICH2's user guide, never met for real: MVAPICH is not packaged in Debian (there
// is no mvapich or mvapich2 package; it is built from source on the clusters that use it), so
// unlike Hydra's (tests/integration/mpich) this table could not be captured here. tests/unit/env
// keeps the doc-based table. What MVAPICH2 2.3 exports to each process, per that guide:
//   MV2_COMM_WORLD_RANK=1 MV2_COMM_WORLD_SIZE=4 MV2_COMM_WORLD_LOCAL_RANK=1
//     MV2_COMM_WORLD_LOCAL_SIZE=2
// (plus MPIRUN_RANK / MPIRUN_NPROCS from mpirun_rsh; with Hydra's mpiexec also PMI_RANK and
// MPI_LOCALNRANKS, in which case the Pmi policy, tried first, reads the same numbers).
// nnodes and node_rank are derived assuming the same number of processes per node (informational).
// MASTER_ADDR / MASTER_PORT come from the environment when set
// (mpirun_rsh -np 4 h1 h1 h2 h2 MASTER_ADDR=h1 MASTER_PORT=29500 ./prog).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/env/env.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/env/policy.hpp"

namespace ddp::env {

struct Mvapich {
  static constexpr std::string_view name = "mvapich";
  static constexpr std::string_view launcher = "MVAPICH2 mpirun";
  static constexpr VarNames vars = {.rank = "MV2_COMM_WORLD_RANK",
                                    .world_size = "MV2_COMM_WORLD_SIZE",
                                    .local_rank = "MV2_COMM_WORLD_LOCAL_RANK",
                                    .local_world_size = "MV2_COMM_WORLD_LOCAL_SIZE",
                                    .node_rank = "MV2_COMM_WORLD_RANK / MV2_COMM_WORLD_LOCAL_SIZE",
                                    .nnodes = "MV2_COMM_WORLD_SIZE / MV2_COMM_WORLD_LOCAL_SIZE"};

  static bool detected(const Env& env) { return env.has("MV2_COMM_WORLD_SIZE"); }

  static LaunchInfo read(const Env& env) {
    LaunchInfo info = detail::read_mpi_style(env, vars, launcher, name);
    return validate(info, vars, launcher);
  }
};

}  // namespace ddp::env
