// Pmi: launcher policy for PMI-based process managers: MPICH's and Intel MPI's Hydra mpiexec, and
// Cray PALS.
// SPDX-License-Identifier: MIT
//
// What Hydra exports to each process, captured from Debian's MPICH 4.0.2 (tests/integration/mpich,
// docs/MPICH.md):
//   PMI_RANK=3 PMI_SIZE=4 MPI_LOCALRANKID=1 MPI_LOCALNRANKS=2 PMI_FD=7 HYDI_CONTROL_FD=9
//   MPIR_CVAR_CH3_INTERFACE_HOSTNAME=<this rank's name in -hosts>
//     GFORTRAN_UNBUFFERED_PRECONNECTED=y
// (`mpiexec.mpich -launcher fork -hosts ddp-node-a,ddp-node-b -ppn 2 -n 4 env`, rank 3). Intel
// MPI's Hydra exports the same PMI_* and MPI_LOCAL* names. With `mpiexec -pmi-port` Hydra exports
// PMI_PORT=<host>:<port> and PMI_ID=<rank> INSTEAD of PMI_FD, PMI_RANK and PMI_SIZE: the world size
// then reaches a process only through the PMI wire protocol, so read() refuses that mode with a
// message naming the fix. Cray PALS (aprun/mpiexec on HPE Cray EX) names the local pair
// PMI_LOCAL_RANK / PMI_LOCAL_SIZE. MPICH 4 built with PMIx exports PMIX_RANK instead of PMI_RANK;
// it is used when PMI_RANK is absent.
//
// The marker is the local process count (MPI_LOCALNRANKS or PMI_LOCAL_SIZE), not PMI_RANK: Slurm's
// own PMI plugins (srun --mpi=pmi2 / --mpi=pmix) also export PMI_RANK or PMIX_RANK but no local
// count, and such a job is better read by the Slurm policy, whose SLURM_LOCALID gives the local
// rank. Open MPI also exports PMIX_RANK; the OpenMpi policy comes first in detect() and wins.
//
// nnodes and node_rank are not exported (MPIR_CVAR_CH3_INTERFACE_HOSTNAME names the host, not its
// index); they are derived assuming the same number of processes per node (detail::derive_nodes)
// and are informational: with an uneven layout they are wrong (captured: `-hosts a:1,b:3 -n 4`
// gives rank 0 MPI_LOCALNRANKS=1, so nnodes=4). No field that rendezvous or training uses depends
// on them. MASTER_ADDR / MASTER_PORT come from the environment when set (mpiexec -genv MASTER_ADDR
// <host> -genv MASTER_PORT <port> ...); Hydra exports no address of its own.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/env/env.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/env/policy.hpp"

namespace ddp::env {

struct Pmi {
  static constexpr std::string_view name = "pmi";
  static constexpr std::string_view launcher = "MPICH/Intel MPI mpiexec (PMI)";

  static bool detected(const Env& env) {
    return env.has("MPI_LOCALNRANKS") || env.has("PMI_LOCAL_SIZE");
  }

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
    if (!env.has("PMI_RANK") && !env.has("PMIX_RANK") && env.has("PMI_PORT"))
      throw ConfigError(ddp::detail::str(
          "ddp: launched by ", launcher, " in -pmi-port mode (PMI_PORT=", *env.get("PMI_PORT"),
          ", PMI_ID=", env.get("PMI_ID").value_or("?"),
          "), where Hydra exports no PMI_RANK and no PMI_SIZE, so the world size "
          "is unknown. Run mpiexec without -pmi-port (Hydra's default exports both), or export "
          "RANK and WORLD_SIZE "
          "yourself (mpiexec -genv WORLD_SIZE <n> sh -c 'RANK=$PMI_ID exec ./program')."));
    VarNames vars = names(env);
    LaunchInfo info = detail::read_mpi_style(env, vars, launcher, name);
    return validate(info, vars, launcher);
  }
};

}  // namespace ddp::env
