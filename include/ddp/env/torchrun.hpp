// Torchrun: launcher policy for torchrun / torch.distributed.run (and torch.distributed.launch >=
// 1.10, which runs torchrun underneath), recognised by TORCHELASTIC_RUN_ID.
// SPDX-License-Identifier: MIT
//
// What torchrun 1.13 exports to each worker (seen with `torchrun --nproc_per_node=2 --no_python
// env`):
//   RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 GROUP_WORLD_SIZE=1
//   ROLE_RANK=1 ROLE_WORLD_SIZE=2 ROLE_NAME=default MASTER_ADDR=127.0.0.1 MASTER_PORT=29500
//   TORCHELASTIC_RUN_ID=none TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0
//   TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_ERROR_FILE=... OMP_NUM_THREADS=1
// With --standalone or --rdzv-backend=c10d: TORCHELASTIC_RUN_ID=<uuid or --rdzv-id>,
// TORCHELASTIC_USE_AGENT_STORE=False and MASTER_ADDR/MASTER_PORT chosen by the agent for the
// workers.
//
// GROUP_RANK is the node index and GROUP_WORLD_SIZE the node count. GROUP_WORLD_SIZE is missing in
// older releases; then the node count is derived from WORLD_SIZE / LOCAL_WORLD_SIZE.
// TORCHELASTIC_USE_AGENT_STORE=True means the agent already listens on MASTER_ADDR:MASTER_PORT with
// a TCPStore (static rendezvous): workers must connect to it as clients, never bind that port.
#pragma once

#include <string>
#include <string_view>

#include "ddp/env/env.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/env/policy.hpp"

namespace ddp::env {

struct Torchrun {
  static constexpr std::string_view name = "torchrun";
  static constexpr std::string_view launcher = "torchrun";
  // the torch names: RANK, WORLD_SIZE, ..., GROUP_RANK, GROUP_WORLD_SIZE
  static constexpr VarNames vars = {};

  static bool detected(const Env& env) { return env.has("TORCHELASTIC_RUN_ID"); }

  static LaunchInfo read(const Env& env) {
    LaunchInfo info{
        .rank = env.int_var("RANK", launcher),
        .world_size = env.int_var("WORLD_SIZE", launcher),
        .local_rank = env.int_var("LOCAL_RANK", launcher),
        .local_world_size = env.int_var("LOCAL_WORLD_SIZE", launcher),
        .master_addr = env.var("MASTER_ADDR", launcher),
        .master_port = env.port_var("MASTER_PORT", launcher),
        .restart_count = env.int_get("TORCHELASTIC_RESTART_COUNT", launcher).value_or(0),
        .run_id = env.var("TORCHELASTIC_RUN_ID", launcher),
        .launcher_owns_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        .source = std::string(name)};
    auto group_rank = env.int_get("GROUP_RANK", launcher);
    auto group_world_size = env.int_get("GROUP_WORLD_SIZE", launcher);
    if (group_world_size) {
      info.nnodes = *group_world_size;
      info.node_rank = env.int_var("GROUP_RANK", launcher);
    } else {
      detail::derive_nodes(info);
      if (group_rank) info.node_rank = *group_rank;
    }
    return validate(info, vars, launcher);
  }
};

}  // namespace ddp::env
