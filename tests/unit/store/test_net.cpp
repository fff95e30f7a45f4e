// The socket layer shared by the store and the tcp backend (core/net.hpp): deadlines, endpoints, IPv4 and
// IPv6 listen/connect/accept, exact I/O outcomes, and the store's words on top of it.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <ddp/core/net.hpp>
#include <ddp/store/socket.hpp>
#include <string>
#include <thread>

using namespace std::chrono_literals;
using ddp::Clock;

namespace {
// True when this host can bind ::1 (containers without IPv6 skip those cases).
bool have_ipv6_loopback() {
  try {
    (void)ddp::net::listen("::1", 0, 1);
    return true;
  } catch (const ddp::net::SocketError&) {
    return false;
  }
}
}  // namespace

TEST_SUITE("store") {
  TEST_CASE("net: ms_until rounds up and clamps; endpoint brackets IPv6") {
    CHECK(ddp::net::ms_until(Clock::now() - 1s) == 0);
    const int left = ddp::net::ms_until(Clock::now() + 1500us);
    CHECK(left >= 1);  // rounded up: poll() never wakes before the deadline
    CHECK(left <= 2);
    CHECK(ddp::net::ms_until(Clock::time_point::max()) > 1'000'000'000);
    CHECK(ddp::net::time_left(Clock::now() - 1s) == 1ms);
    CHECK(ddp::net::endpoint("10.0.0.1", 29500) == "10.0.0.1:29500");
    CHECK(ddp::net::endpoint("::1", 29500) == "[::1]:29500");
  }

  TEST_CASE("net: listen, connect, accept and exact I/O over IPv4 and IPv6") {
    for (const std::string host : {"127.0.0.1", "::1"}) {
      if (host == "::1" && !have_ipv6_loopback()) {
        MESSAGE("no IPv6 loopback here: IPv6 case not run");
        continue;
      }
      CAPTURE(host);
      ddp::Fd listener = ddp::net::listen(host, 0, 4);
      const std::uint16_t port = ddp::net::local_port(listener.get());
      REQUIRE(port != 0);
      const auto deadline = Clock::now() + 2s;
      ddp::Fd client = ddp::net::connect(host, port, deadline, ddp::net::Retry::WhileRefused);
      ddp::Fd server = ddp::net::accept(listener.get(), deadline);
      REQUIRE(server);
      const std::uint64_t hello = 0x1234'5678'9abc'def0ull;
      CHECK(static_cast<bool>(ddp::net::write_all(client.get(), &hello, sizeof hello, deadline)));
      std::uint64_t got = 0;
      CHECK(static_cast<bool>(ddp::net::read_exact(server.get(), &got, sizeof got, deadline)));
      CHECK(got == hello);
      // Nothing more arrives: the read times out at its deadline; after the close it reports end of stream.
      const auto t0 = Clock::now();
      CHECK(ddp::net::read_exact(server.get(), &got, sizeof got, Clock::now() + 50ms).kind ==
            ddp::net::IoStatus::Kind::TimedOut);
      CHECK(Clock::now() - t0 >= 50ms);
      client.reset();
      const auto st = ddp::net::read_exact(server.get(), &got, sizeof got, Clock::now() + 2s);
      CHECK(st.kind == ddp::net::IoStatus::Kind::Closed);
      CHECK(st.text() == "end of stream");
      // No one connects: accept gives up at its deadline with an empty Fd.
      CHECK_FALSE(ddp::net::accept(listener.get(), Clock::now() + 20ms));
    }
  }

  TEST_CASE("net: connect retries a refused port until its deadline, and the store words it") {
    std::uint16_t port = 0;
    {
      ddp::Fd probe = ddp::net::listen("127.0.0.1", 0, 1);
      port = ddp::net::local_port(probe.get());
    }  // closed: connections are refused
    const auto t0 = Clock::now();
    try {
      (void)ddp::net::connect("127.0.0.1", port, Clock::now() + 100ms, ddp::net::Retry::WhileRefused);
      FAIL("connected to a closed port");
    } catch (const ddp::net::SocketError& e) {
      CHECK(e.code() == ECONNREFUSED);
      CHECK(std::string(e.what()) == "ddp: cannot connect to 127.0.0.1:" + std::to_string(port) + ": " + e.detail());
    }
    CHECK(Clock::now() - t0 >= 100ms);  // refused is retried until the deadline
    // A name that does not resolve: WhileRefused gives up at once, the store keeps trying until its deadline.
    const auto t1 = Clock::now();
    CHECK_THROWS_AS((void)ddp::net::connect("no-such-host.invalid", 1, Clock::now() + 5s, ddp::net::Retry::WhileRefused),
                    ddp::net::SocketError);
    CHECK(Clock::now() - t1 < 4s);
    CHECK_THROWS_WITH_AS((void)ddp::store::connect_tcp("127.0.0.1", port, Clock::now() + 50ms),
                         doctest::Contains(("could not connect to the store at 127.0.0.1:" + std::to_string(port) +
                                            " before the timeout; last error: Connection refused (errno 111)")
                                               .c_str()),
                         ddp::TimeoutError);
  }

  TEST_CASE("net: a port in use is a SocketError carrying EADDRINUSE") {
    ddp::Fd first = ddp::net::listen("127.0.0.1", 0, 1);
    const std::uint16_t port = ddp::net::local_port(first.get());
    try {
      (void)ddp::net::listen("127.0.0.1", port, 1);
      FAIL("bound a port in use");
    } catch (const ddp::net::SocketError& e) {
      CHECK(e.code() == EADDRINUSE);
      CHECK(std::string(e.what()) ==
            "ddp: cannot listen on 127.0.0.1:" + std::to_string(port) + ": Address already in use (errno 98)");
    }
  }
}
