// A rank whose peer never starts says, every interval, whom it waits for at rendezvous (docs/decisions/0066), then
// fails naming that peer; on rank 0 the error no longer suggests that rank 0 may not have started.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "comm_harness.hpp"
#include "ddp/core/wait_report.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "support/log_capture.hpp"

namespace test_rendezvous_wait {
using namespace std::chrono_literals;
}  // namespace test_rendezvous_wait

TEST_SUITE("comm") {
  TEST_CASE("tcp: rank 0 started without rank 1 reports the wait, then names rank 1") {
    using namespace test_rendezvous_wait;
    // Before: silent for the whole timeout, then "... timed out after 1000 ms on <host:port>. Rank 0 may not have
    // started or the address is unreachable; ..." on rank 0 itself.
    ddp::store::TcpStoreServer server("127.0.0.1", 0);
    ddp::store::TcpStore store("127.0.0.1", server.port(), {.timeout = 1000ms, .rank = 0, .world_size = 2});
    ddp::test::LogCapture log;
    ddp::set_wait_report_interval(200ms);
    std::string error;
    try {
      ddp::comm::TcpCommunicator c(ddp::test::local_rank_info(0, 2), store, {.timeout = 1000ms});
    } catch (const ddp::TimeoutError& e) {
      error = e.what();
    }
    ddp::set_wait_report_interval(20s);
    CHECK(log.contains("waiting for rank 1 to join (200 ms of 1000 ms); is it started?"));
    CHECK(error.starts_with("ddp[rank 0/2]: connecting the tcp mesh: rank 1 never published its address (it died, is "
                            "stuck or never started): ddp[rank 0/2]: store get('"));
    CHECK(error.ends_with("') timed out after 1000 ms on 127.0.0.1:" + std::to_string(server.port()) +
                          ": the key was not set in time: the rank that sets it may not have started, died or is "
                          "stuck (or the store's host stopped answering). Raise --timeout-ms (DDP_TIMEOUT_MS) if "
                          "startup is slow."));
  }
}
