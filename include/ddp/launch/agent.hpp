// The ddprun agent: decides where the store lives, hosts it on node 0 as torchrun's agent does, and
// runs the workers under a Supervisor. tools/ddprun/main.cpp is a thin wrapper around run_agent().
// SPDX-License-Identifier: MIT (Linux only)
//
// Static rendezvous, like torchrun --nnodes M --node-rank R --master-addr A --master-port P:
//   node 0:   binds a TcpStoreServer on P (--standalone: a free port of 127.0.0.1), whose clients
//             are the workers of every node (TORCHELASTIC_USE_AGENT_STORE=True);
//   node R>0: hosts nothing, passes MASTER_ADDR=A, MASTER_PORT=P on; its workers retry until
//             node 0's store is up.
// The store outlives every restart of the workers, as torchrun's does. Example: `ddprun
// --standalone --nproc-per-node 2 ./probe` binds, say, 127.0.0.1:41237 and both workers get
// MASTER_ADDR=127.0.0.1 MASTER_PORT=41237 TORCHELASTIC_RUN_ID=<random hex>. With M > 1 nodes an
// exit barrier keeps node 0's store up until every node is done. Limit: restarts are per node
// (nodes do not agree on one, unlike torchrun's dynamic rendezvous); a multi-node job should use
// --max-restarts 0 or torchrun's c10d rendezvous.
#pragma once

#include <poll.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/launch/options.hpp"
#include "ddp/launch/process.hpp"
#include "ddp/launch/supervisor.hpp"
#include "ddp/launch/worker_env.hpp"
#include "ddp/train/progress.hpp"
// before the server: store.hpp's unqualified detail::str must not see store::detail
#include "ddp/store/store.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"

namespace ddp::launch {

// Where the store is and who hosts it, from the options alone (pure; tested without sockets).
struct StorePlan {
  bool host = false;            // this ddprun binds the store
  std::string bind_host;        // address to bind when host is true
  std::uint16_t bind_port = 0;  // 0: any free port (--standalone)
  std::string master_addr;      // what workers get as MASTER_ADDR
};

inline bool is_loopback(std::string_view addr) {
  return addr == "localhost" || addr == "::1" || addr.starts_with("127.");
}

inline StorePlan plan_store(const LaunchOptions& o) {
  if (o.standalone)
    return {.host = true, .bind_host = "127.0.0.1", .bind_port = 0, .master_addr = "127.0.0.1"};
  // Node 0 listens on every interface unless the address is a loopback one.
  return {.host = o.node_rank == 0,
          .bind_host = is_loopback(o.master_addr) ? "127.0.0.1" : "0.0.0.0",
          .bind_port = o.master_port,
          .master_addr = o.master_addr};
}

// torchrun --standalone draws a UUID; 16 random hex digits serve the same purpose.
inline std::string random_run_id() {
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(16, '0');
  for (auto& c : id) {
    c = kHex[v & 15];
    v >>= 4;
  }
  return id;
}

// torchrun's default exit_barrier_timeout
inline constexpr std::chrono::seconds kExitBarrierTimeout{300};

// Multi-node exit barrier: when its workers are done, every node sets
// ddprun/<run_id>/exit/<node_rank> in node 0's store; node 0 polls the M keys every
// monitor_interval and returns when all are set, after `timeout`, or on SIGINT/SIGTERM, so its
// store outlives every node's workers. Problems are logged, never thrown: ddprun reports the
// workers' exit code.
inline void exit_barrier(const LaunchOptions& o, const std::string& run_id, const std::string& addr,
                         std::uint16_t port, SignalChannel& signals,
                         std::chrono::milliseconds timeout = kExitBarrierTimeout) {
  std::vector<std::string> keys;
  for (int n = 0; n < o.nnodes; ++n)
    keys.push_back(ddp::detail::str("ddprun/", run_id, "/exit/", n));
  try {
    store::TcpStore client(addr, port,
                           store::TcpStoreOptions{.timeout = std::chrono::milliseconds(30000)});
    client.set(keys[static_cast<std::size_t>(o.node_rank)], std::string_view("1"));
    if (o.node_rank != 0) return;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!client.check(std::span<const std::string>(keys))) {
      if (std::chrono::steady_clock::now() >= deadline) {
        DDP_LOG_WARN("ddprun: exit barrier: not every node finished within ",
                     std::chrono::duration_cast<std::chrono::seconds>(timeout).count(),
                     " s; closing the store anyway (other nodes' workers lose it)");
        return;
      }
      pollfd p{.fd = signals.fd(), .events = POLLIN, .revents = 0};
      ::poll(&p, 1, static_cast<int>(o.monitor_interval.count()));
      for (int sig : signals.drain())
        if (sig != SIGCHLD && sig != SIGPIPE) {
          DDP_LOG_WARN("ddprun: exit barrier interrupted by SIG", ::sigabbrev_np(sig),
                       "; closing the store");
          return;
        }
    }
    DDP_LOG_INFO("ddprun: exit barrier: all ", o.nnodes, " nodes done");
  } catch (const std::exception& e) {
    DDP_LOG_WARN("ddprun: exit barrier on ", addr, ':', port, " failed: ", e.what());
  }
}

// Runs job `o`, `parent` being the base of every worker's environment. exit_code of the result is
// ddprun's: 0, the first failing worker's code, or 128 + a received signal. Throws
// ConfigError/StoreError/Error when the job cannot start (program not found, port in use, ...).
// Blocks SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD and SIGPIPE while it runs.
inline SupervisorResult run_agent(const LaunchOptions& o, const EnvMap& parent) {
  // Before the store server starts its threads: they inherit the mask.
  SignalChannel signals({SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE});

  const auto path_it = parent.find("PATH");
  const std::string program =
      resolve_program(o.program.front(), path_it == parent.end() ? "" : path_it->second);

  const StorePlan plan = plan_store(o);
  std::unique_ptr<store::TcpStoreServer> server;
  std::uint16_t port = plan.bind_port;
  if (plan.host) {
    try {
      server = std::make_unique<store::TcpStoreServer>(plan.bind_host, plan.bind_port);
      // say which ddprun flag moves the port, then the server's own diagnosis
    } catch (const StoreError& e) {
      std::string_view why(e.what());
      if (why.starts_with("ddp: ")) why.remove_prefix(5);
      throw StoreError(
          ddp::detail::str("ddp: ddprun: node 0 cannot host the store on --master-port ",
                           plan.bind_port, " (--standalone picks a free port): ", why));
    }
    port = server->port();
  }
  const std::string run_id = o.standalone && !o.run_id_given ? random_run_id() : o.run_id;
  const int first_rank = o.node_rank * o.nproc_per_node;
  DDP_LOG_INFO("ddprun: starting ", o.nproc_per_node, " worker(s), ranks ", first_rank, "..",
               first_rank + o.nproc_per_node - 1, " of ", o.nnodes * o.nproc_per_node, "; store ",
               plan.master_addr, ':', port,
               plan.host ? " hosted by this ddprun" : " hosted by node 0", "; run id ", run_id);

  // On a terminal rank 0 redraws its progress line (DDP_PROGRESS=live, as the workers' stdout is a
  // pipe) and the supervisor keeps it at the bottom; DDP_PROGRESS=lines (or a log): plain lines.
  const bool live = train::live_progress_wanted();
  EnvMap base = parent;
  if (live) base.insert_or_assign("DDP_PROGRESS", "live");
  Supervisor supervisor(SupervisorOptions{.nproc = o.nproc_per_node,
                                          .first_rank = first_rank,
                                          .max_restarts = o.max_restarts,
                                          .grace_period = o.grace_period,
                                          .monitor_interval = o.monitor_interval,
                                          .live_status = live},
                        signals);
  SupervisorResult result = supervisor.run([&](int local_rank, int restart_count) {
    const EnvMap env = worker_env(base, o,
                                  WorkerSlot{.local_rank = local_rank,
                                             .restart_count = restart_count,
                                             .master_addr = plan.master_addr,
                                             .master_port = port,
                                             .run_id = run_id});
    return SpawnRequest{.path = program, .argv = o.program, .envp = to_envp(env)};
  });
  // Node 0 dials its own server over loopback (it listens on 127.0.0.1 or 0.0.0.0).
  if (o.nnodes > 1 && result.signal_received == 0)
    exit_barrier(o, run_id, server ? std::string("127.0.0.1") : plan.master_addr, port, signals);
  return result;
}

}  // namespace ddp::launch
