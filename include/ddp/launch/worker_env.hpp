// The environment ddprun gives each worker: the parent's variables plus torchrun's, value for
// value.
// SPDX-License-Identifier: MIT
//
// Checked against Debian's torchrun 1.13 (`python3 -m torch.distributed.run --redirects 9:1 --tee
// 9:1 --nproc_per_node=2 --no_python env`), which adds to the parent's environment, for worker 1 of
// 2:
//   RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 GROUP_WORLD_SIZE=1 ROLE_RANK=1
//   ROLE_WORLD_SIZE=2 ROLE_NAME=default MASTER_ADDR=127.0.0.1 MASTER_PORT=29500
//     TORCHELASTIC_RESTART_COUNT=0
//   TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_RUN_ID=none TORCHELASTIC_USE_AGENT_STORE=True
//   NCCL_ASYNC_ERROR_HANDLING=1 (kept if already set) OMP_NUM_THREADS=1 (only if unset and N > 1)
//   TORCHELASTIC_ERROR_FILE=/tmp/torchelastic_.../error.json   <- not given by ddprun: we write no
//     error files
// Static rendezvous numbers workers node by node: RANK = node_rank * nproc_per_node + local_rank,
// e.g. node 1 of 2 with 4 workers each gives RANK 4..7, GROUP_RANK=1, GROUP_WORLD_SIZE=2,
// WORLD_SIZE=8.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/launch/options.hpp"

namespace ddp::launch {

using EnvMap = std::map<std::string, std::string, std::less<>>;

// What differs between workers and between attempts.
struct WorkerSlot {
  int local_rank = 0;
  int restart_count = 0;          // TORCHELASTIC_RESTART_COUNT: 0 on the first attempt
  std::string master_addr;        // the store's address as workers should dial it
  std::uint16_t master_port = 0;  // the port actually bound (a free port under --standalone)
  std::string run_id;
};

// torchrun prints this (to stderr, via Python logging) when it sets OMP_NUM_THREADS=1 for N > 1
// workers.
inline constexpr std::string_view kOmpNotice =
    "*****************************************\n"
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid "
    "your system "
    "being overloaded, please further tune the variable for optimal performance in your "
    "application as needed. \n"
    "*****************************************\n";

// True when ddprun sets OMP_NUM_THREADS=1 for its workers (and should print kOmpNotice once).
inline bool sets_omp_threads(const EnvMap& parent, const LaunchOptions& o) {
  return o.nproc_per_node > 1 && !parent.contains("OMP_NUM_THREADS");
}

// The full environment of one worker: `parent` with torchrun's variables set (overriding any
// inherited value, e.g. when ddprun itself runs under another launcher).
inline EnvMap worker_env(const EnvMap& parent, const LaunchOptions& o, const WorkerSlot& w) {
  EnvMap env = parent;
  const int world_size = o.nnodes * o.nproc_per_node;
  const int rank = o.node_rank * o.nproc_per_node + w.local_rank;
  auto put = [&env](std::string_view k, const auto& v) {
    env.insert_or_assign(std::string(k), ddp::detail::str(v));
  };
  put("RANK", rank);
  put("LOCAL_RANK", w.local_rank);
  put("WORLD_SIZE", world_size);
  put("LOCAL_WORLD_SIZE", o.nproc_per_node);
  put("GROUP_RANK", o.node_rank);
  put("GROUP_WORLD_SIZE", o.nnodes);
  put("ROLE_RANK", rank);  // one role ("default"), so role ranks are the global ranks
  put("ROLE_WORLD_SIZE", world_size);
  put("ROLE_NAME", "default");
  put("MASTER_ADDR", w.master_addr);
  put("MASTER_PORT", w.master_port);
  put("TORCHELASTIC_RESTART_COUNT", w.restart_count);
  put("TORCHELASTIC_MAX_RESTARTS", o.max_restarts);
  put("TORCHELASTIC_RUN_ID", w.run_id);
  // node 0's ddprun hosts the store, as torchrun's agent does
  put("TORCHELASTIC_USE_AGENT_STORE", "True");
  if (!parent.contains("NCCL_ASYNC_ERROR_HANDLING")) put("NCCL_ASYNC_ERROR_HANDLING", 1);
  if (sets_omp_threads(parent, o)) put("OMP_NUM_THREADS", 1);
  return env;
}

// "KEY=VALUE" strings, the form execve wants (the caller keeps them alive and adds the null
// pointer).
inline std::vector<std::string> to_envp(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(ddp::detail::str(k, '=', v));
  return out;
}

// The inverse, for a process's own environment (`environ`); entries without '=' are skipped.
inline EnvMap env_map_from(const char* const* envp) {
  EnvMap env;
  for (; envp != nullptr && *envp != nullptr; ++envp) {
    std::string_view kv(*envp);
    if (auto eq = kv.find('='); eq != std::string_view::npos && eq > 0)
      env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

}  // namespace ddp::launch
