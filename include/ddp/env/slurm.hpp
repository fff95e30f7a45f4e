// Slurm: launcher policy for tasks started by srun (one process per task), recognised by SLURM_PROCID.
// SPDX-License-Identifier: MIT
//
// What srun (Slurm 22/23) exports to each task, e.g. `srun -N3 -n7 ./prog` on node[01-03]:
//   SLURM_PROCID=4 SLURM_NTASKS=7 SLURM_STEP_NUM_TASKS=7 SLURM_LOCALID=1 SLURM_NODEID=1
//   SLURM_NNODES=3 SLURM_STEP_NUM_NODES=3 SLURM_STEP_TASKS_PER_NODE=3,2(x2) SLURM_TASKS_PER_NODE=3,2(x2)
//   SLURM_STEP_NODELIST=node[01-03] SLURM_JOB_NODELIST=node[01-03] SLURM_JOB_ID=123456 SLURM_STEP_ID=0
// (SLURM_NTASKS_PER_NODE only with --ntasks-per-node.)
//
// Field by field (first variable present wins):
//   rank             SLURM_PROCID
//   world_size       SLURM_STEP_NUM_TASKS, SLURM_NTASKS
//   local_rank       SLURM_LOCALID
//   node_rank        SLURM_NODEID (the node's index within the step)
//   nnodes           SLURM_STEP_NUM_NODES, SLURM_NNODES
//   local_world_size entry node_rank of SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE (expanded,
//                    see hostlist.hpp), else SLURM_NTASKS_PER_NODE
//   run_id           SLURM_JOB_ID
//   master_addr      MASTER_ADDR, else the FIRST host of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or
//                    SLURM_NODELIST (expanded): with srun's default block distribution rank 0 runs there.
//   master_port      MASTER_PORT, else the port rule below.
//
// Port rule: master_port = 29500 + SLURM_JOB_ID % 1000 (so 29500..30499). Every task of the job reads the
// same SLURM_JOB_ID, so all compute the same port without talking to each other, and two jobs sharing a
// first node collide only if their ids are equal modulo 1000. Concurrent srun steps inside one job that
// each need a store compute the same port: give them distinct MASTER_PORT values.
//
// Caveat: a program run directly in a batch script (no srun) also sees SLURM_PROCID=0 and the job's
// SLURM_NTASKS; start it with srun, or export RANK/WORLD_SIZE (env://), which detect() tries first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/core/str.hpp"
#include "ddp/env/env.hpp"
#include "ddp/env/hostlist.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/env/policy.hpp"

namespace ddp::env {

inline constexpr int kSlurmBasePort = 29500;   // port rule: kSlurmBasePort + SLURM_JOB_ID % kSlurmPortSpan
inline constexpr int kSlurmPortSpan = 1000;

struct Slurm {
  static constexpr std::string_view name = "slurm";
  static constexpr std::string_view launcher = "Slurm srun";

  static bool detected(const Env& env) { return env.has("SLURM_PROCID"); }

  static VarNames names(const Env& env) {
    return {.rank = "SLURM_PROCID",
            .world_size = env.has("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS",
            .local_rank = "SLURM_LOCALID",
            .local_world_size = local_size_var(env),
            .node_rank = "SLURM_NODEID",
            .nnodes = env.has("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES"};
  }

  // The port every task derives from the job id when MASTER_PORT is absent.
  static std::uint16_t port_for_job(long long job_id) {
    return static_cast<std::uint16_t>(kSlurmBasePort + job_id % kSlurmPortSpan);
  }

  static LaunchInfo read(const Env& env) {
    VarNames vars = names(env);
    LaunchInfo info{.rank = env.int_var(vars.rank, launcher),
                    .world_size = env.int_var(vars.world_size, launcher),
                    .local_rank = env.int_var(vars.local_rank, launcher),
                    .node_rank = env.int_var(vars.node_rank, launcher),
                    .nnodes = env.int_var(vars.nnodes, launcher),
                    .master_addr = {},  // below: MASTER_ADDR or the node list
                    .master_port = 0,   // below: MASTER_PORT or the port rule
                    .restart_count = 0,
                    .run_id = env.get("SLURM_JOB_ID").value_or(""),
                    .launcher_owns_store = false,
                    .source = std::string(name)};
    info.local_world_size = local_size(env, vars.local_world_size, info.node_rank);
    if (auto addr = env.get("MASTER_ADDR")) {
      info.master_addr = *addr;
    } else if (auto list = nodelist_var(env)) {
      info.master_addr = expand_hostlist(*env.get(*list), *list, launcher).front();
    }
    if (auto port = env.port_get("MASTER_PORT", launcher)) {
      info.master_port = *port;
    } else if (!info.run_id.empty()) {
      auto job = detail::parse_int(info.run_id);
      if (!job || *job < 0)
        throw ConfigError(ddp::detail::str("ddp: SLURM_JOB_ID=", ddp::detail::quoted(info.run_id), " (from ", launcher,
                                           ") is not a job number, so the store port (", kSlurmBasePort,
                                           " + SLURM_JOB_ID % ", kSlurmPortSpan,
                                           ") cannot be derived. Export MASTER_PORT or pass --master-port."));
      info.master_port = port_for_job(*job);
    }
    return validate(info, vars, launcher);
  }

 private:
  static std::string_view local_size_var(const Env& env) {
    for (std::string_view v : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"})
      if (env.has(v)) return v;
    return "SLURM_STEP_TASKS_PER_NODE";
  }

  static std::optional<std::string_view> nodelist_var(const Env& env) {
    for (std::string_view v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
      if (env.has(v)) return v;
    return std::nullopt;
  }

  // This node's task count: entry `node_rank` of a per-node list, or the uniform SLURM_NTASKS_PER_NODE.
  static int local_size(const Env& env, std::string_view var, int node_rank) {
    if (var == "SLURM_NTASKS_PER_NODE") return env.int_var(var, launcher);
    std::string value = env.var(var, launcher);
    auto counts = expand_tasks_per_node(value, var, launcher);
    if (node_rank < 0 || static_cast<std::size_t>(node_rank) >= counts.size())
      throw ConfigError(ddp::detail::str("ddp: SLURM_NODEID=", node_rank, " (from ", launcher, ") has no entry in ", var,
                                         '=', ddp::detail::quoted(value), " (", counts.size(),
                                         " nodes). The Slurm environment is inconsistent: start the tasks with srun."));
    return counts[static_cast<std::size_t>(node_rank)];
  }
};

}  // namespace ddp::env
