// detect(): which launcher started this process, and where its peers are.
// SPDX-License-Identifier: MIT
//
// The policies are tried in a fixed order; the first whose marker is present reads the environment
// strictly (a missing or bad variable is a ConfigError naming it):
//
//   torchrun (TORCHELASTIC_RUN_ID) > env:// (RANK+WORLD_SIZE) > Open MPI (OMPI_COMM_WORLD_SIZE)
//   > PMI (MPI_LOCALNRANKS / PMI_LOCAL_SIZE) > MVAPICH2 (MV2_COMM_WORLD_SIZE)
//   > Slurm (SLURM_PROCID) > single process
//
// Launchers nest (`srun torchrun ...` sets TORCHELASTIC_* and SLURM_*; mpirun in a Slurm
// allocation sets OMPI_* and SLURM_*): the launcher closest to the process comes first. Then the
// launch flags (flags.hpp) override single fields; --local-rank / --local_rank is cross-checked
// against LOCAL_RANK (torch.distributed.launch passes both; a mismatch means a confused launch).
// With no launcher found, WORLD_SIZE > 1 without RANK (or RANK > 0 without WORLD_SIZE) is a
// ConfigError, not a silent single process. Finally the result is validated (policy.hpp) and, when
// the backend rendezvous through a TCP store (need_master_addr: tcp, nccl), a multi-process job
// must have a store address.
//
// Example: `srun -N2 --ntasks-per-node=4 torchrun --nproc_per_node=4 ... ./prog --local_rank=1` on
// the second node: torchrun's RANK=5 WORLD_SIZE=8 LOCAL_RANK=1 ... are used, SLURM_PROCID=1 is
// ignored, and --local_rank=1 matches LOCAL_RANK.
//
// ddp never invents a multi-node store address. Only when the launcher proves that every rank runs
// on this host (its local world size == world size) and default_local_master is set does a missing
// MASTER_ADDR become 127.0.0.1 and MASTER_PORT 29500 (torchrun's default); rank 0 logs it. Slurm
// derives its address from the node list and its port from the job id (slurm.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/env/describe.hpp"
#include "ddp/env/env.hpp"
#include "ddp/env/env_url.hpp"
#include "ddp/env/flags.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/env/mvapich.hpp"
#include "ddp/env/openmpi.hpp"
#include "ddp/env/pmi.hpp"
#include "ddp/env/policy.hpp"
#include "ddp/env/slurm.hpp"
#include "ddp/env/torchrun.hpp"

namespace ddp::env {

inline constexpr std::string_view kLocalMasterAddr = "127.0.0.1";
inline constexpr std::uint16_t kDefaultMasterPort = 29500;

struct DetectOptions {
  // the backend rendezvous through a TCP store (tcp, nccl); mpi does not
  bool need_master_addr = false;
  std::string_view backend = "tcp";  // named in the missing-address message
  // allow 127.0.0.1:29500 when the launcher proves all ranks are local
  bool default_local_master = true;
};

namespace detail {

// What the winning policy produced, with what messages need to name.
struct Detected {
  LaunchInfo info;
  VarNames vars;
  std::string launcher;    // words for messages: "Open MPI mpirun"
  bool all_local = false;  // the launcher proves that every rank runs on this host
};

template <class P>
VarNames policy_vars(const Env& env) {
  if constexpr (requires { P::names(env); })
    return P::names(env);
  else if constexpr (requires { P::vars; })
    return P::vars;
  else
    return VarNames{};
}

template <class P>
constexpr std::string_view policy_launcher() {
  if constexpr (requires { P::launcher; })
    return P::launcher;
  else
    return P::name;
}

template <class P>
bool policy_all_local(const Env& env, const LaunchInfo& info) {
  if constexpr (requires { P::all_ranks_local(env, info); })
    return P::all_ranks_local(env, info);
  else
    return info.local_world_size == info.world_size;
}

template <class P>
Detected read_policy(const Env& env) {
  Detected d{.info = P::read(env),
             .vars = policy_vars<P>(env),
             .launcher = std::string(policy_launcher<P>())};
  d.all_local = policy_all_local<P>(env, d.info);
  return d;
}

// First policy whose marker is present, read; nullopt when none is.
template <LauncherPolicy... Ps>
std::optional<Detected> detect_first(const Env& env) {
  std::optional<Detected> out;
  (void)((Ps::detected(env) && (out = read_policy<Ps>(env), true)) || ...);
  return out;
}

// How to provide the store address under each launcher, for the missing-address message.
inline std::string master_fix(std::string_view source, std::string_view backend) {
  using ddp::detail::str;
  const std::string or_mpi = backend == "mpi" ? "" : ", or use --backend mpi";
  if (source == "openmpi")
    return str("Run mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ...", or_mpi, '.');
  if (source == "pmi")
    return str("Run mpiexec -genv MASTER_ADDR <host of rank 0> -genv MASTER_PORT 29500 ...", or_mpi,
               '.');
  if (source == "mvapich")
    return str("Run mpirun_rsh ... MASTER_ADDR=<host of rank 0> MASTER_PORT=29500 ./program",
               or_mpi, '.');
  if (source == "slurm")
    return "Export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<port> before srun (no "
           "SLURM_*NODELIST or "
           "SLURM_JOB_ID to derive them from), or pass --master-addr and --master-port.";
  return "Export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port> for every rank, or pass "
         "--master-addr "
         "and --master-port.";
}

// Applies the flags over `d` (field by field), cross-checking --local-rank against LOCAL_RANK.
inline void apply_flags(Detected& d, const Env& env, const LaunchFlags& flags, bool from_launcher) {
  using ddp::detail::str;
  LaunchInfo& info = d.info;
  if (flags.local_rank) {
    const std::string_view where = from_launcher ? std::string_view(d.launcher) : "the environment";
    if (auto env_local = env.int_get("LOCAL_RANK", where);
        env_local && *env_local != *flags.local_rank)
      throw ConfigError(
          str("ddp: ", flags.local_rank_flag, '=', *flags.local_rank,
              " contradicts LOCAL_RANK=", *env_local, " (from ", where,
              "). Both give this process's rank on its node; drop the flag or fix the variable."));
  }
  if (!from_launcher && (flags.rank.has_value() != flags.world_size.has_value()))
    throw ConfigError(str(
        "ddp: ", flags.rank ? str("--rank=", *flags.rank) : str("--world-size=", *flags.world_size),
        " was given without ", flags.rank ? "--world-size" : "--rank",
        " and no launcher was detected (no TORCHELASTIC_RUN_ID, RANK, OMPI_COMM_WORLD_*, PMI_*, "
        "MV2_COMM_WORLD_* or SLURM_PROCID). Pass both flags to every process, or start it with a "
        "launcher."));
  const LaunchInfo before = info;
  bool sizes_changed = false;
  if (flags.rank) {
    info.rank = *flags.rank;
    d.vars.rank = "--rank";
  }
  if (flags.world_size) {
    info.world_size = *flags.world_size;
    d.vars.world_size = "--world-size";
    sizes_changed = sizes_changed || info.world_size != before.world_size;
  }
  if (flags.local_rank) {
    info.local_rank = *flags.local_rank;
    d.vars.local_rank = flags.local_rank_flag;
  }
  if (flags.local_world_size) {
    info.local_world_size = *flags.local_world_size;
    d.vars.local_world_size = "--local-world-size";
    sizes_changed = sizes_changed || info.local_world_size != before.local_world_size;
  } else if (flags.local_rank && !env.has("LOCAL_WORLD_SIZE") &&
             (!from_launcher || info.source == EnvUrl::name)) {
    // A local rank without a local count (legacy launch without --use_env, or flags alone): take
    // its upper bound, as EnvUrl does for LOCAL_RANK without LOCAL_WORLD_SIZE.
    info.local_world_size = info.world_size;
    sizes_changed = true;
  }
  if (flags.master_addr) info.master_addr = *flags.master_addr;
  if (flags.master_port) info.master_port = *flags.master_port;
  if (sizes_changed || !from_launcher) {
    // Node layout follows the new sizes unless the launcher exported it (GROUP_WORLD_SIZE,
    // SLURM_NNODES, ...).
    if (!from_launcher || (info.source == EnvUrl::name && !env.has("GROUP_WORLD_SIZE")))
      derive_nodes(info);
  }
  if (flags.master_addr || flags.master_port) {
    // The launcher's own store, if any, is at its address, not at the flags'.
    if (info.master_addr != before.master_addr || info.master_port != before.master_port)
      info.launcher_owns_store = false;
  }
  // Flags prove locality only when they give both sizes themselves.
  if (!from_launcher)
    d.all_local =
        flags.local_world_size && flags.world_size && *flags.local_world_size == *flags.world_size;
  else if (sizes_changed)
    d.all_local = false;
  bool changed = info.rank != before.rank || info.world_size != before.world_size ||
                 info.local_rank != before.local_rank ||
                 info.local_world_size != before.local_world_size ||
                 info.master_addr != before.master_addr || info.master_port != before.master_port;
  if (!from_launcher) {
    info.source = "flags";
    d.launcher = "command-line flags";
  } else if (changed) {
    info.source = str(before.source, "+flags");
    d.launcher = str(d.launcher, " and command-line flags");
  }
}

// No launcher matched, yet half of the env:// pair is set (WORLD_SIZE > 1 without RANK, or RANK > 0
// without WORLD_SIZE): an error, since a single process would silently train alone.
inline void require_env_pair(const Env& env, const LaunchFlags& flags) {
  using ddp::detail::str;
  // the flags describe the job; apply_flags checks their pair
  if (flags.rank || flags.world_size) return;
  const std::string_view guess = EnvUrl::launcher;
  const std::string fix =
      "Export both RANK (0 to WORLD_SIZE - 1, one per process) and WORLD_SIZE, with MASTER_ADDR "
      "and MASTER_PORT, or start the job with a launcher (ddprun, torchrun, mpirun, srun)";
  if (env.has("WORLD_SIZE") && !env.has("RANK")) {
    const int world = env.int_get("WORLD_SIZE", guess).value_or(1);
    if (world > 1)
      throw ConfigError(str("ddp: WORLD_SIZE=", world,
                            " is set but RANK is not, and no launcher was detected (no "
                            "TORCHELASTIC_RUN_ID, OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_* or "
                            "SLURM_PROCID); guessed "
                            "launcher: ",
                            guess, ", which needs RANK as well. ", fix,
                            "; or unset WORLD_SIZE to run a single process."));
  }
  if (env.has("RANK") && !env.has("WORLD_SIZE")) {
    const int rank = env.int_get("RANK", guess).value_or(0);
    if (rank != 0)
      throw ConfigError(str("ddp: RANK=", rank,
                            " is set but WORLD_SIZE is not, and no launcher was detected (no "
                            "TORCHELASTIC_RUN_ID, OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_* or "
                            "SLURM_PROCID); guessed "
                            "launcher: ",
                            guess, ", which needs WORLD_SIZE as well. ", fix, '.'));
  }
}

// A multi-process job that needs a store must have an address; defaulted only when provably local.
inline void require_master(Detected& d, const DetectOptions& opts) {
  using ddp::detail::str;
  LaunchInfo& info = d.info;
  if (!opts.need_master_addr || info.world_size <= 1) return;
  if (!info.master_addr.empty() && info.master_port != 0) return;
  if (opts.default_local_master && d.all_local) {
    std::string what;
    if (info.master_addr.empty()) {
      info.master_addr = std::string(kLocalMasterAddr);
      what = "MASTER_ADDR";
    }
    if (info.master_port == 0) {
      info.master_port = kDefaultMasterPort;
      what += what.empty() ? "MASTER_PORT" : " and MASTER_PORT";
    }
    if (info.rank == 0)
      DDP_LOG_INFO(what, " not set; all ", info.world_size, " ranks run on this host (",
                   d.vars.local_world_size, '=', info.local_world_size, " = ", d.vars.world_size,
                   "), so the store defaults to ", info.master_addr, ':', info.master_port,
                   ". Export MASTER_ADDR/MASTER_PORT or pass --master-addr/--master-port to "
                   "choose another.");
    return;
  }
  std::string_view missing = info.master_addr.empty() ? "MASTER_ADDR" : "MASTER_PORT";
  throw ConfigError(str(
      "ddp: launched by ", d.launcher, " (", d.vars.world_size, '=', info.world_size, ") but ",
      missing, " is not set; --backend ", opts.backend, " needs it. ",
      master_fix(std::string_view(info.source).substr(0, info.source.find('+')), opts.backend)));
}

}  // namespace detail

// The first of Ps whose marker is present, validated; else a single-process LaunchInfo.
template <LauncherPolicy... Ps>
LaunchInfo detect_launch(const Env& env) {
  auto d = detail::detect_first<Ps...>(env);
  if (!d) return LaunchInfo{};
  return validate(d->info, d->vars, d->launcher);
}

// Policies in the fixed order, flags over them, validation, store address rule. Throws ConfigError
// with the variable, the launcher and the fix. Pure: reads only `env` and `flags` (logs on rank 0
// when it defaults the store address).
inline LaunchInfo detect(const Env& env, const LaunchFlags& flags = {},
                         const DetectOptions& opts = {}) {
  auto found = detail::detect_first<Torchrun, EnvUrl, OpenMpi, Pmi, Mvapich, Slurm>(env);
  bool from_launcher = found.has_value();
  if (!from_launcher) detail::require_env_pair(env, flags);
  detail::Detected d =
      found ? std::move(*found)
            : detail::Detected{
                  .info = {}, .vars = {}, .launcher = "a single process", .all_local = true};
  if (!flags.empty()) {
    detail::apply_flags(d, env, flags, from_launcher);
    validate(d.info, d.vars, d.launcher);
  }
  detail::require_master(d, opts);
  return d.info;
}

}  // namespace ddp::env
