// store: ScopedTimeoutCap bounds every blocking store call of the thread that holds it, and only that
// thread's; used by the collectives to publish a failure when the store's host may be frozen.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/tcp_store.hpp>
#include <thread>

#include "unit/store/silent_listener.hpp"

using namespace std::chrono_literals;
using ddp::store::ScopedTimeoutCap;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

TEST_SUITE("store") {
  TEST_CASE("ScopedTimeoutCap: capped_timeout lowers only while alive, nests to the smaller cap") {
    using ddp::store::capped_timeout;
    CHECK(capped_timeout(5000ms) == 5000ms);
    {
      ScopedTimeoutCap outer(300ms);
      CHECK(capped_timeout(5000ms) == 300ms);
      CHECK(capped_timeout(100ms) == 100ms);  // never raises a shorter timeout
      {
        ScopedTimeoutCap inner(1000ms);  // larger: the outer cap stays
        CHECK(capped_timeout(5000ms) == 300ms);
        ScopedTimeoutCap tighter(50ms);
        CHECK(capped_timeout(5000ms) == 50ms);
      }
      CHECK(capped_timeout(5000ms) == 300ms);
      std::chrono::milliseconds other{};
      std::thread([&] { other = capped_timeout(5000ms); }).join();
      CHECK(other == 5000ms);  // per thread
    }
    CHECK(capped_timeout(5000ms) == 5000ms);
  }

  TEST_CASE("ScopedTimeoutCap: a TcpStore round trip to a silent server gives up at the cap, not the store timeout") {
    ddp_test::SilentListener server;
    ddp::store::TcpStore s("127.0.0.1", server.port, {.protocol = ddp::store::TcpProtocol::V2, .timeout = 20s});
    const auto t0 = Clock::now();
    {
      ScopedTimeoutCap cap(200ms);
      CHECK_THROWS_AS((void)s.check("ddp/error/0"), ddp::TimeoutError);
    }
    const double took = seconds_since(t0);
    CHECK(took >= 0.15);
    CHECK(took < 5.0);  // the store's own timeout is 20 s
  }

  TEST_CASE("ScopedTimeoutCap: HashStore waits are capped on this thread only") {
    ddp::store::HashStore s(20s);
    const auto t0 = Clock::now();
    {
      ScopedTimeoutCap cap(100ms);
      CHECK_THROWS_WITH_AS(s.wait("never"), doctest::Contains("timed out after 100 ms"), ddp::TimeoutError);
    }
    CHECK(seconds_since(t0) < 5.0);
    // Another thread's wait keeps the store's timeout while this thread holds a cap: it sees the key that
    // this thread sets after the cap would have expired.
    ScopedTimeoutCap cap(50ms);
    std::thread waiter([&] { CHECK_NOTHROW(s.wait("later")); });
    std::this_thread::sleep_for(300ms);  // longer than the cap; the waiter must still be waiting
    s.set("later", "1");
    waiter.join();
  }
}
