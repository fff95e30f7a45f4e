// LauncherPolicy: the contract every launcher policy meets, plus the range checks they share.
// SPDX-License-Identifier: MIT
//
// A policy is a struct of statics, no state:
//
//   struct OpenMpi {
//     static constexpr std::string_view name = "openmpi";  // LaunchInfo::source, JSON, logs
//     static constexpr std::string_view launcher = "Open MPI mpirun";  // for error messages
//     static constexpr VarNames vars = {...};  // which variable holds which field
//     static bool detected(const Env&);    // cheap: looks for one marker variable, never throws
//     static LaunchInfo read(const Env&);  // strict: a missing or bad variable is a ConfigError
//   };
//
// `read` returns a LaunchInfo that passed validate() (0 <= rank < world_size,
// 0 <= local_rank < local_world_size <= world_size, 0 <= node_rank < nnodes), whose messages name
// the launcher's own variables (OMPI_COMM_WORLD_RANK, not RANK), i.e. what to fix.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/env/env.hpp"
#include "ddp/env/launch_info.hpp"

namespace ddp::env {

template <class P>
concept LauncherPolicy = requires(const Env& env) {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::detected(env) } -> std::same_as<bool>;
  { P::read(env) } -> std::same_as<LaunchInfo>;
};

// Where each LaunchInfo field came from, for messages. detect() replaces an entry with the flag's
// spelling ("--rank") when a flag overrides the field.
struct VarNames {
  std::string_view rank = "RANK";
  std::string_view world_size = "WORLD_SIZE";
  std::string_view local_rank = "LOCAL_RANK";
  std::string_view local_world_size = "LOCAL_WORLD_SIZE";
  std::string_view node_rank = "GROUP_RANK";
  std::string_view nnodes = "GROUP_WORLD_SIZE";
};

namespace detail {

[[noreturn]] inline void range_error(std::string_view var, int value, std::string_view rule,
                                     std::string_view launcher, std::string_view fix) {
  throw ConfigError(
      ddp::detail::str("ddp: ", var, '=', value, " (from ", launcher, ") ", rule, ". ", fix));
}

}  // namespace detail

// Throws ConfigError for the first inconsistency, e.g.
//   "ddp: RANK=4 (from torchrun) is out of range: it must be in [0, 4) since WORLD_SIZE=4. ..."
// Returns `info` unchanged so that callers can write `return validate(info, vars, launcher);`.
inline const LaunchInfo& validate(const LaunchInfo& info, const VarNames& vars,
                                  std::string_view launcher) {
  using ddp::detail::str;
  const std::string fix =
      "The values disagree: check how the job was started (launcher options, exported variables, "
      "launch flags).";
  if (info.world_size < 1)
    detail::range_error(vars.world_size, info.world_size, "must be at least 1", launcher, fix);
  if (info.rank < 0 || info.rank >= info.world_size)
    detail::range_error(vars.rank, info.rank,
                        str("is out of range: it must be in [0, ", info.world_size, ") since ",
                            vars.world_size, '=', info.world_size),
                        launcher, fix);
  if (info.local_world_size < 1)
    detail::range_error(vars.local_world_size, info.local_world_size, "must be at least 1",
                        launcher, fix);
  if (info.local_world_size > info.world_size)
    detail::range_error(vars.local_world_size, info.local_world_size,
                        str("exceeds ", vars.world_size, '=', info.world_size), launcher, fix);
  if (info.local_rank < 0 || info.local_rank >= info.local_world_size)
    detail::range_error(vars.local_rank, info.local_rank,
                        str("is out of range: it must be in [0, ", info.local_world_size,
                            ") since ", vars.local_world_size, '=', info.local_world_size),
                        launcher, fix);
  if (info.nnodes < 1)
    detail::range_error(vars.nnodes, info.nnodes, "must be at least 1", launcher, fix);
  if (info.nnodes > info.world_size)
    detail::range_error(vars.nnodes, info.nnodes,
                        str("exceeds ", vars.world_size, '=', info.world_size), launcher, fix);
  if (info.node_rank < 0 || info.node_rank >= info.nnodes)
    detail::range_error(vars.node_rank, info.node_rank,
                        str("is out of range: it must be in [0, ", info.nnodes, ") since ",
                            vars.nnodes, '=', info.nnodes),
                        launcher, fix);
  return info;
}

namespace detail {

// Node count and index when the launcher does not export them, assuming ranks fill nodes in order
// with the same number per node (torchrun, mpirun -map-by slot, srun's default block distribution).
// Example: world 8, local 4, rank 5 -> nnodes 2, node_rank 1. When world_size is not a multiple of
// local_world_size the layout is unknown: report this process as node 0 of 1 rather than guess.
inline void derive_nodes(LaunchInfo& info) {
  if (info.local_world_size >= 1 && info.world_size % info.local_world_size == 0) {
    info.nnodes = info.world_size / info.local_world_size;
    info.node_rank = info.rank / info.local_world_size;
  } else {
    info.nnodes = 1;
    info.node_rank = 0;
  }
}

// The LaunchInfo of an MPI-style launcher (Open MPI, MPICH/Intel PMI, MVAPICH): rank, size and the
// local pair from its own variables `vars`, MASTER_ADDR / MASTER_PORT from the environment when set
// (MPI has no rendezvous address of its own), nodes derived as above. Not validated: the policy
// may refine the node fields, then returns validate(info, vars, launcher).
inline LaunchInfo read_mpi_style(const Env& env, const VarNames& vars, std::string_view launcher,
                                 std::string_view source) {
  LaunchInfo info{.rank = env.int_var(vars.rank, launcher),
                  .world_size = env.int_var(vars.world_size, launcher),
                  .local_rank = env.int_var(vars.local_rank, launcher),
                  .local_world_size = env.int_var(vars.local_world_size, launcher),
                  .master_addr = env.get("MASTER_ADDR").value_or(""),
                  .master_port = env.port_get("MASTER_PORT", launcher).value_or(std::uint16_t{0}),
                  .restart_count = 0,
                  .run_id = {},
                  .launcher_owns_store = false,
                  .source = std::string(source)};
  derive_nodes(info);
  return info;
}

}  // namespace detail

}  // namespace ddp::env
