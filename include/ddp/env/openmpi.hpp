// OpenMpi: launcher policy for Open MPI's mpirun / mpiexec (and srun with Open MPI's PMIx wire-up,
// which exports the same variables), recognised by OMPI_COMM_WORLD_SIZE.
// SPDX-License-Identifier: MIT
//
// What Open MPI 4.1 mpirun exports (seen with `mpirun -np 2 -x MASTER_ADDR=localhost env` on one
// host):
//   OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1
//     OMPI_COMM_WORLD_LOCAL_SIZE=2
//   OMPI_COMM_WORLD_NODE_RANK=1 OMPI_MCA_orte_num_nodes=1 OMPI_UNIVERSE_SIZE=2 PMIX_RANK=1 ...
// OMPI_COMM_WORLD_NODE_RANK is NOT a node index: it is the rank among this node's processes counted
// over all app contexts (for one app context it equals the local rank). So:
//   nnodes    = OMPI_MCA_orte_num_nodes when exported (Open MPI 4.x), else WORLD_SIZE / LOCAL_SIZE
//   node_rank = rank / LOCAL_SIZE, exact for by-slot mapping with the same count per node (the
//     default,
//               and the tutorials' `-map-by slot`); 0 when the counts differ between nodes. It is
//               informational (logs, JSON): nothing in ddp depends on it.
// Open MPI has no rendezvous address of its own: MASTER_ADDR and MASTER_PORT are taken from the
// environment when set (mpirun -x MASTER_ADDR=... -x MASTER_PORT=...), otherwise left empty for
// detect().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/env/env.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/env/policy.hpp"

namespace ddp::env {

struct OpenMpi {
  static constexpr std::string_view name = "openmpi";
  static constexpr std::string_view launcher = "Open MPI mpirun";
  static constexpr VarNames vars = {
      .rank = "OMPI_COMM_WORLD_RANK",
      .world_size = "OMPI_COMM_WORLD_SIZE",
      .local_rank = "OMPI_COMM_WORLD_LOCAL_RANK",
      .local_world_size = "OMPI_COMM_WORLD_LOCAL_SIZE",
      .node_rank = "OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_LOCAL_SIZE",
      .nnodes = "OMPI_MCA_orte_num_nodes"};

  static bool detected(const Env& env) { return env.has("OMPI_COMM_WORLD_SIZE"); }

  static LaunchInfo read(const Env& env) {
    LaunchInfo info = detail::read_mpi_style(env, vars, launcher, name);
    if (auto nnodes = env.int_get("OMPI_MCA_orte_num_nodes", launcher)) info.nnodes = *nnodes;
    // Non-uniform layouts (mpirun -H a:3,b:1) leave the node index unknown: report node 0. In 64
    // bits: both counts come straight from the environment, so their product may not fit an int.
    bool uniform =
        info.local_world_size >= 1 &&
        std::int64_t{info.nnodes} * info.local_world_size == std::int64_t{info.world_size};
    info.node_rank = uniform ? info.rank / info.local_world_size : 0;
    return validate(info, vars, launcher);
  }
};

}  // namespace ddp::env
