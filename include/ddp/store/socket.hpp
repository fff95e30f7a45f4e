// The store's sockets: the socket layer (core/net.hpp) with the store's words in every error, which
// name host:port, the system's own text and the likely cause:
//   ddp: cannot listen on 0.0.0.0:29500: Address already in use (errno 98). Another process holds
//     the port ...
// SPDX-License-Identifier: MIT
//
// Listening and connecting throw StoreError, or TimeoutError when a client cannot reach the store
// in time; exact reads and writes throw TimeoutError at their deadline and StoreError when the
// store closed the connection or the socket failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/fd.hpp"
#include "ddp/core/net.hpp"
#include "ddp/core/str.hpp"
#include "ddp/core/wait_report.hpp"

namespace ddp::store {

// Listens on host:port for the store server (port 0 picks a free port; host "" or "0.0.0.0" means
// every IPv4 interface, "::" every IPv6 one). The message for a port in use says what probably
// holds it.
inline Fd listen_tcp(const std::string& host, std::uint16_t port, int backlog = 1024) {
  try {
    return net::listen(host, port, backlog);
  } catch (const net::SocketError& e) {
    if (e.code() == EADDRINUSE)
      throw StoreError(ddp::detail::str(e.what(),
                                        ". Another process holds the port: most likely torchrun's "
                                        "agent store (under torchrun with "
                                        "TORCHELASTIC_USE_AGENT_STORE=True the agent already "
                                        "serves MASTER_PORT and every rank must be a "
                                        "client) or a previous run that has not exited. Pick a "
                                        "free port with --master-port (MASTER_PORT) "
                                        "or DDP_STORE_PORT, or stop the old process."));
    throw StoreError(ddp::detail::str(
        e.what(),
        ". Check that the address belongs to this machine (MASTER_ADDR, --master-addr)."));
  }
}

// Connects to the store at host:port, retrying every failure with backoff until the deadline,
// because rank 0's server may start after its clients. Returns a blocking socket without Nagle's
// delay (store messages are small request/response pairs).
inline Fd connect_tcp(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  try {
    const WaitReport report(net::time_left(deadline),
                            ddp::detail::str("the store at ", net::endpoint(host, port)),
                            "; is rank 0 (or the launcher hosting the store) started?");
    Fd s = net::connect(host, port, deadline, net::Retry::UntilDeadline);
    net::set_nodelay(s.get());
    return s;
  } catch (const net::SocketError& e) {
    throw TimeoutError(ddp::detail::str(
        "ddp: could not connect to the store at ", net::endpoint(host, port),
        " before the timeout; last error: ", e.detail(),
        ". Rank 0 may not have started or the address is unreachable; check "
        "MASTER_ADDR/MASTER_PORT and raise --timeout-ms (DDP_TIMEOUT_MS) if startup is slow."));
  }
}

// Reads exactly out.size() bytes. `where` names the store in errors ("10.0.0.1:29500").
inline void read_exact(const Fd& s, std::span<std::uint8_t> out, Clock::time_point deadline,
                       const std::string& where) {
  const net::IoStatus st = net::read_exact(s.get(), out.data(), out.size(), deadline);
  switch (st.kind) {
    case net::IoStatus::Kind::Done: return;
    case net::IoStatus::Kind::TimedOut:
      throw TimeoutError(ddp::detail::str("ddp: store read from ", where, " timed out"));
    case net::IoStatus::Kind::Closed:
      throw StoreError(
          ddp::detail::str("ddp: the store at ", where,
                           " closed the connection (the process hosting it, usually rank 0 or "
                           "torchrun's agent, may have exited or rejected a request)"));
    case net::IoStatus::Kind::Failed: break;
  }
  throw StoreError(ddp::detail::str("ddp: read from the store at ", where, " failed: ", st.text()));
}

inline void write_all(const Fd& s, std::span<const std::uint8_t> data, Clock::time_point deadline,
                      const std::string& where) {
  const net::IoStatus st = net::write_all(s.get(), data.data(), data.size(), deadline);
  if (st.kind == net::IoStatus::Kind::TimedOut)
    throw TimeoutError(ddp::detail::str("ddp: store write to ", where, " timed out"));
  if (!st)
    throw StoreError(ddp::detail::str("ddp: write to the store at ", where, " failed: ", st.text(),
                                      " (the store process may have exited)"));
}

}  // namespace ddp::store
