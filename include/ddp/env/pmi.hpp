// Pmi: launcher policy for PMI-based process managers: MPICH's and Intel MPI's Hydra mpiexec, and Cray PALS.
// SPDX-License-Identifier: MIT
//
// What Hydra (MPICH 3/4, Intel MPI) exports to each process:
//   PMI_RANK=1 PMI_SIZE=4 MPI_LOCALRANKID=1 MPI_LOCALNRANKS=2 PMI_FD=... (PMI_PORT with -bootstrap)
// Cray PALS (aprun/mpiexec on HPE Cray EX) names the local pair PMI_LOCAL_RANK / PMI_LOCAL_SIZE.
// MPICH 4 built with PMIx exports PMIX_RANK instead of PMI_RANK; it is used when PMI_RANK is absent.
//
// The marker is the local process count (MPI_LOCALNRANKS or PMI_LOCAL_SIZE), not PMI_RANK: Slurm's own
// PMI plugins (srun --mpi=pmi2 / --mpi=pmix) also export PMI_RANK or PMIX_RANK but no local count, and
// such a job is better read by the Slurm policy, whose SLURM_LOCALID gives the local rank. Open MPI also
// exports PMIX_RANK; the OpenMpi policy comes first in detect() and wins.
//
// nnodes and node_rank are not exported; they are derived assuming the same number of processes per node
// (detail::derive_nodes) and are informational. MASTER_ADDR / MASTER_PORT come from the environment when
// set (mpiexec -genv MASTER_ADDR <host> -genv MASTER_PORT <port> ...).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/env/env.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/env/policy.hpp"

namespace ddp::env {

struct Pmi {
  static constexpr std::string_view name = "pmi";
  static constexpr std::string_view launcher = "MPICH/Intel MPI mpiexec (PMI)";

  static bool detected(const Env& env) { return env.has("MPI_LOCALNRANKS") || env.has("PMI_LOCAL_SIZE"); }

  // The variable names this environment uses: Hydra's or Cray's local pair, PMI_RANK or PMIX_RANK.
  static VarNames names(const Env& env) {
    bool hydra = env.has("MPI_LOCALNRANKS");
    return {.rank = env.has("PMI_RANK") || !env.has("PMIX_RANK") ? "PMI_RANK" : "PMIX_RANK",
            .world_size = "PMI_SIZE",
            .local_rank = hydra ? "MPI_LOCALRANKID" : "PMI_LOCAL_RANK",
            .local_world_size = hydra ? "MPI_LOCALNRANKS" : "PMI_LOCAL_SIZE",
            .node_rank = "PMI_RANK / MPI_LOCALNRANKS",
            .nnodes = "PMI_SIZE / MPI_LOCALNRANKS"};
  }

  static LaunchInfo read(const Env& env) {
    VarNames vars = names(env);
    LaunchInfo info = detail::read_mpi_style(env, vars, launcher, name);
    return validate(info, vars, launcher);
  }
};

}  // namespace ddp::env
