// EnvUrl: launcher policy for PyTorch's plain env:// convention: RANK and WORLD_SIZE set, but no
// TORCHELASTIC_RUN_ID (torch.distributed.launch --use_env before 1.10, hand-written scripts, k8s
// operators).
// SPDX-License-Identifier: MIT
//
// torch.distributed.launch --use_env (1.9 and older) exports RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT and OMP_NUM_THREADS, but not LOCAL_WORLD_SIZE; hand-set scripts often
// give only RANK and WORLD_SIZE. So the LOCAL_* variables are optional, read strictly when present:
//   LOCAL_RANK missing        -> local_rank 0 (PyTorch scripts' `os.environ.get("LOCAL_RANK", 0)`)
//   LOCAL_WORLD_SIZE missing  -> 1 when LOCAL_RANK is missing too (each process alone on its node),
//                                else WORLD_SIZE (an upper bound; the real per-node count is
//                                  unknown)
//   GROUP_RANK / GROUP_WORLD_SIZE, when present, give node_rank / nnodes; otherwise they are
//     derived
//                                from the local world size (see detail::derive_nodes).
// MASTER_ADDR and MASTER_PORT are optional here; detect() requires them when the backend needs a
// store. Because LOCAL_WORLD_SIZE may be a guess, only an explicit LOCAL_WORLD_SIZE == WORLD_SIZE
// proves that all ranks share this host (all_ranks_local), which is what allows detect() to default
// the store address.
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

struct EnvUrl {
  static constexpr std::string_view name = "env";
  static constexpr std::string_view launcher = "env:// variables";
  static constexpr VarNames vars = {};

  static bool detected(const Env& env) {
    return env.has("RANK") && env.has("WORLD_SIZE") && !env.has("TORCHELASTIC_RUN_ID");
  }

  static LaunchInfo read(const Env& env) {
    LaunchInfo info{
        .rank = env.int_var("RANK", launcher),
        .world_size = env.int_var("WORLD_SIZE", launcher),
        .master_addr = env.get("MASTER_ADDR").value_or(""),
        .master_port = env.port_get("MASTER_PORT", launcher).value_or(std::uint16_t{0}),
        .restart_count = env.int_get("TORCHELASTIC_RESTART_COUNT", launcher).value_or(0),
        .run_id = {},
        .launcher_owns_store = false,
        .source = std::string(name)};
    auto local_rank = env.int_get("LOCAL_RANK", launcher);
    auto local_world_size = env.int_get("LOCAL_WORLD_SIZE", launcher);
    info.local_rank = local_rank.value_or(0);
    info.local_world_size = local_world_size.value_or(local_rank ? info.world_size : 1);
    if (auto nnodes = env.int_get("GROUP_WORLD_SIZE", launcher)) {
      // No launcher promised GROUP_RANK here (env:// is often hand-set), so say what is missing
      // rather than Env::var's "<launcher> always exports it".
      if (!env.has("GROUP_RANK"))
        throw ConfigError(ddp::detail::str(
            "ddp: GROUP_WORLD_SIZE=", *nnodes, " (from ", launcher,
            ") is set but GROUP_RANK is not. Export GROUP_RANK (this node's index, 0 "
            "to ",
            std::int64_t{*nnodes} - 1, ") as well, or neither."));
      info.nnodes = *nnodes;
      info.node_rank = env.int_var("GROUP_RANK", launcher);
    } else {
      detail::derive_nodes(info);
      if (auto node_rank = env.int_get("GROUP_RANK", launcher)) info.node_rank = *node_rank;
    }
    return validate(info, vars, launcher);
  }

  static bool all_ranks_local(const Env& env, const LaunchInfo& info) {
    return env.has("LOCAL_WORLD_SIZE") && info.local_world_size == info.world_size;
  }
};

}  // namespace ddp::env
