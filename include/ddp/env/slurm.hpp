// Slurm: launcher policy for tasks started by srun (one process per task), recognised by
// SLURM_PROCID.
// SPDX-License-Identifier: MIT
//
// What srun gives each task (Slurm 22.05.8, `srun -N1 -n2 env`, task 1; the whole set is
// tests/unit/env/launch_envs.hpp's srun_captured_task1()):
//   SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NODEID=0 SLURM_GTIDS=0,1 SLURM_TASK_PID=12
//   SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NUM_NODES=1
//   SLURM_STEP_NODELIST=vm SLURM_STEP_TASKS_PER_NODE=2 SLURM_STEP_LAUNCHER_PORT=... ...
//   SLURM_NTASKS=2 SLURM_NPROCS=2 SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_TASKS_PER_NODE=2
//   SLURM_JOB_ID=1 SLURM_JOBID=1 SLURM_JOB_NODELIST=vm SLURM_NODELIST=vm ...
// srun always exports the SLURM_STEP_* set (--ntasks-per-node adds SLURM_NTASKS_PER_NODE). On
// several nodes the per-node lists are compressed: SLURM_STEP_NODELIST=node[01-03],
// SLURM_STEP_TASKS_PER_NODE=3,2(x2) for `srun -N3 -n7` (block distribution).
//
// The batch script itself (sbatch, no srun) also has SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0
// and the job's SLURM_NTASKS and SLURM_TASKS_PER_NODE, but no SLURM_STEP_*. A program started
// there runs as a single process when the job has one task; with more it is refused (ConfigError
// naming srun) rather than be rank 0 of a world whose other ranks nobody starts.
//
// Field by field (first variable present wins; srun tasks always have the first):
//   rank             SLURM_PROCID
//   world_size       SLURM_STEP_NUM_TASKS, SLURM_NTASKS
//   local_rank       SLURM_LOCALID
//   node_rank        SLURM_NODEID (the node's index within the step)
//   nnodes           SLURM_STEP_NUM_NODES, SLURM_NNODES
//   local_world_size entry node_rank of SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE
//                    (expanded, hostlist.hpp), else SLURM_NTASKS_PER_NODE
//   run_id           SLURM_JOB_ID
//   master_addr      MASTER_ADDR, else the first host of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST
//                    or SLURM_NODELIST (rank 0 runs there under srun's default block
//                    distribution); Slurm NodeNames, which must resolve on the nodes
//   master_port      MASTER_PORT, else 29500 + SLURM_JOB_ID % 1000 (29500..30499)
//
// Every task reads the same SLURM_JOB_ID, so all derive the same port without talking; two jobs
// sharing a first node collide only if their ids are equal modulo 1000. Concurrent srun steps in
// one job that each need a store get the same port: give them distinct MASTER_PORT values.
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

// port rule: kSlurmBasePort + SLURM_JOB_ID % kSlurmPortSpan
inline constexpr int kSlurmBasePort = 29500;
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
    if (!env.has("SLURM_STEP_ID")) return batch_script(env);
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
        throw ConfigError(ddp::detail::str(
            "ddp: SLURM_JOB_ID=", ddp::detail::quoted(info.run_id), " (from ", launcher,
            ") is not a job number, so the store port (", kSlurmBasePort, " + SLURM_JOB_ID % ",
            kSlurmPortSpan, ") cannot be derived. Export MASTER_PORT or pass --master-port."));
      info.master_port = port_for_job(*job);
    }
    return validate(info, vars, launcher);
  }

 private:
  // SLURM_PROCID without SLURM_STEP_ID: a single process when the job has one task, else refused.
  static LaunchInfo batch_script(const Env& env) {
    const int tasks = env.has("SLURM_NTASKS") ? env.int_var("SLURM_NTASKS", launcher) : 1;
    const std::string job = env.get("SLURM_JOB_ID").value_or("?");
    if (tasks > 1)
      throw ConfigError(
          ddp::detail::str("ddp: this process runs in the batch script of Slurm job ", job,
                           " (SLURM_PROCID is set but SLURM_STEP_ID is not: it is not an srun "
                           "task), and the job has SLURM_NTASKS=",
                           tasks,
                           " tasks, which would wait for ranks nobody starts. Start the program "
                           "with srun in the script "
                           "(`srun ./prog`, one rank per task; see examples/slurm/ddp.sbatch), or "
                           "run torchrun there, or export "
                           "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://)."));
    LaunchInfo info{.rank = 0,
                    .world_size = 1,
                    .local_rank = 0,
                    .local_world_size = 1,
                    .node_rank = 0,
                    .nnodes = 1,
                    .master_addr = {},
                    .master_port = 0,
                    .restart_count = 0,
                    .run_id = env.get("SLURM_JOB_ID").value_or(""),
                    .launcher_owns_store = false,
                    .source = std::string(name)};
    return validate(info, names(env), launcher);
  }

  static std::string_view local_size_var(const Env& env) {
    for (std::string_view v :
         {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"})
      if (env.has(v)) return v;
    return "SLURM_STEP_TASKS_PER_NODE";
  }

  static std::optional<std::string_view> nodelist_var(const Env& env) {
    for (std::string_view v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
      if (env.has(v)) return v;
    return std::nullopt;
  }

  // Entry `node_rank` of a per-node list, or the uniform SLURM_NTASKS_PER_NODE.
  static int local_size(const Env& env, std::string_view var, int node_rank) {
    if (var == "SLURM_NTASKS_PER_NODE") return env.int_var(var, launcher);
    std::string value = env.var(var, launcher);
    auto counts = expand_tasks_per_node(value, var, launcher);
    if (node_rank < 0 || static_cast<std::size_t>(node_rank) >= counts.size())
      throw ConfigError(ddp::detail::str(
          "ddp: SLURM_NODEID=", node_rank, " (from ", launcher, ") has no entry in ", var, '=',
          ddp::detail::quoted(value), " (", counts.size(),
          " nodes). The Slurm environment is inconsistent: start the tasks with srun."));
    return counts[static_cast<std::size_t>(node_rank)];
  }
};

}  // namespace ddp::env
