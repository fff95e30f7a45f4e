// make_store: the Store every rank of a job shares, chosen from how the job was launched.
// SPDX-License-Identifier: MIT
//
//   auto info = ddp::env::detect(...);
//   auto store = ddp::store::make_store(info, 30s);         // rank 0 also hosts the server
//   auto store = ddp::store::make_store(info, 30s, 29600);  // DDP_STORE_PORT / --store-port
//
// The rules (docs/decisions/0003):
//   - world_size == 1 and no master address: an in-process HashStore (nothing to rendezvous with).
//   - launcher_owns_store (torchrun's agent already serves MASTER_ADDR:MASTER_PORT,
//     TORCHELASTIC_USE_AGENT_STORE=True) and no store_port: every rank is a client of that store.
//   - otherwise rank 0 hosts a TcpStoreServer on 0.0.0.0:<port> (or [::]:<port>) and every rank,
//     rank 0 included, is a client of master_addr:<port>; the server lives as long as rank 0's
//     returned store. <port> is store_port when given (the caller reads DDP_STORE_PORT or a flag;
//     the library never calls getenv), else master_port; store_port exists to move our store off
//     the port torchrun's agent holds.
// With launcher_owns_store the launcher's store outlives the workers and serves every restart, so
// every key goes under "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/", as torch's env://
// rendezvous does: keys of an attempt that died half-way (a rank that never joined leaves the join
// count short) cannot mislead the next one (docs/decisions/0036).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/prefix_store.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"

namespace ddp::store {

struct RendezvousOptions {
  TcpProtocol protocol = TcpProtocol::Auto;
  // where rank 0's server listens; "" = every interface ("::" for an IPv6 master address)
  std::string bind_host;
};

// Throws ConfigError when a multi-rank job has no master address or port, StoreError when rank 0
// cannot bind (the message says what probably holds the port), TimeoutError when a client cannot
// reach the store within `timeout`.
inline std::unique_ptr<Store> make_store(const env::LaunchInfo& info,
                                         std::chrono::milliseconds timeout,
                                         std::optional<std::uint16_t> store_port = std::nullopt,
                                         const RendezvousOptions& opts = {}) {
  if (info.world_size <= 1 && info.master_addr.empty()) return std::make_unique<HashStore>(timeout);
  if (info.master_addr.empty())
    throw ConfigError(detail::str(
        "ddp[rank ", info.rank, '/', info.world_size, "]: launched by ", info.source,
        " with WORLD_SIZE=", info.world_size,
        " but MASTER_ADDR is not set; the ranks cannot find the store. Export MASTER_ADDR "
        "(--master-addr) with the host of rank 0."));
  const bool client_only = info.launcher_owns_store && !store_port;
  const std::uint16_t port = store_port.value_or(info.master_port);
  if (port == 0)
    throw ConfigError(detail::str(
        "ddp[rank ", info.rank, '/', info.world_size, "]: launched by ", info.source,
        " but MASTER_PORT is not set (or 0); export MASTER_PORT (--master-port), e.g. 29500."));
  std::unique_ptr<TcpStoreServer> server;
  if (info.rank == 0 && !client_only) {
    std::string bind = !opts.bind_host.empty()                           ? opts.bind_host
                       : info.master_addr.find(':') != std::string::npos ? std::string("::")
                                                                         : std::string("0.0.0.0");
    server = std::make_unique<TcpStoreServer>(bind, port);
    DDP_LOG_INFO("store server listening on ", net::endpoint(bind, server->port()));
  }
  auto store = std::make_unique<TcpStore>(info.master_addr, server ? server->port() : port,
                                          TcpStoreOptions{.protocol = opts.protocol,
                                                          .timeout = timeout,
                                                          .rank = info.rank,
                                                          .world_size = info.world_size});
  if (server) store->keep_alive(std::move(server));
  if (info.launcher_owns_store)
    return std::make_unique<PrefixStore>(detail::str("/worker/attempt_", info.restart_count),
                                         std::move(store));
  return store;
}

}  // namespace ddp::store
