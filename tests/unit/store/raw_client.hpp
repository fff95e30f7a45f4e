// Store test helpers for talking to a TcpStoreServer byte by byte (a bad or hostile client) and for
// checking what the server logged about it.
// SPDX-License-Identifier: MIT
#pragma once

#include <doctest/doctest.h>
#include <sys/socket.h>

#include <chrono>
#include <ddp/core/log.hpp>
#include <ddp/store/socket.hpp>
#include <ddp/store/tcp_store.hpp>
#include <ddp/store/wire.hpp>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/log_capture.hpp"

namespace ddp_test {

// Captures log lines so tests can check that a bad client was logged with a reason (the server logs from
// its own thread; LogCapture::saw waits for the line).
using LogCapture = ddp::test::LogCapture;

inline ddp::Fd raw_connect(std::uint16_t port) {
  return ddp::store::connect_tcp("127.0.0.1", port, ddp::Clock::now() + std::chrono::seconds(2));
}

inline void raw_send(const ddp::Fd& s, const ddp::store::Bytes& b) {
  ddp::store::write_all(s, b, ddp::Clock::now() + std::chrono::seconds(2), "test");
}

inline ddp::store::Bytes raw_read(const ddp::Fd& s, std::size_t n) {
  ddp::store::Bytes b(n);
  ddp::store::read_exact(s, b, ddp::Clock::now() + std::chrono::seconds(2), "test");
  return b;
}

// True when the server closed this connection (EOF within 2 s).
inline bool closed_by_peer(const ddp::Fd& s) {
  if (!ddp::net::poll_until(s.get(), POLLIN, ddp::Clock::now() + std::chrono::seconds(2))) return false;
  std::uint8_t b;
  return ::recv(s.get(), &b, 1, 0) <= 0;
}

inline ddp::store::Bytes enc(const ddp::store::wire::Request& rq, ddp::store::wire::Protocol p) {
  return ddp::store::wire::encode_request(rq, p);
}

// The server still works for a fresh client: a full set/get round trip.
inline void still_serves(std::uint16_t port) {
  ddp::store::TcpStore c("127.0.0.1", port, {.timeout = std::chrono::seconds(2)});
  c.set("alive", "yes");
  CHECK(c.get_string("alive") == "yes");
}

}  // namespace ddp_test
