// comm: failure reporting through the store (comm/failure_report.hpp), shared by the tcp and nccl backends.
// Host-only code, so it is tested here without a GPU: what the report says, and that a frozen store cannot
// hold a failing rank up for a store timeout per call.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <ddp/comm/failure_report.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/tcp_store.hpp>

#include "unit/store/silent_listener.hpp"

using namespace std::chrono_literals;
using namespace ddp::comm;
using Clock = std::chrono::steady_clock;

namespace {
Fingerprint all_reduce(std::uint64_t seq, std::uint64_t count) {
  return Fingerprint{.kind = OpKind::AllReduce, .dtype = ddp::DType::F32, .op = ReduceOp::Sum, .count = count, .seq = seq};
}
}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("failure report: names the ranks behind and the ranks that ran another op") {
    ddp::store::HashStore store(10s);
    // Rank 1 is still in all_reduce #4, rank 2 ran a different all_reduce #5, rank 3 never reported.
    store.set("p/state/1", FailureReport::state_text(4, all_reduce(4, 8)));
    store.set("p/state/2", FailureReport::state_text(5, all_reduce(5, 9)));
    FailureReport report(store, "p/", 0, 4);
    CHECK(report.any_peer_failure(400ms).empty());  // nobody published a failure yet
    report.publish("ddp[rank 0/4]: all_reduce #5 (F32 x 8) timed out", 5, all_reduce(5, 8), 400ms);
    CHECK(store.get_string("p/state/0") == FailureReport::state_text(5, all_reduce(5, 8)));  // ours, for the others
    CHECK(store.get_string("p/error/0") == "ddp[rank 0/4]: all_reduce #5 (F32 x 8) timed out");
    const auto t0 = Clock::now();
    const std::string r = report.timeout_report(all_reduce(5, 8), 400ms);
    CHECK(Clock::now() - t0 < 5s);
    CHECK(r.find("Ranks that never reached all_reduce #5: 1 (last in all_reduce #4 (F32 x 8, sum)), 3 (no report") !=
          std::string::npos);
    CHECK(r.find("At #5 rank 2 ran all_reduce #5 (F32 x 9, sum).") != std::string::npos);

    FailureReport rank2(store, "p/", 2, 4);
    rank2.publish("ddp[rank 2/4]: out of memory", 5, all_reduce(5, 9), 400ms);
    CHECK(report.message_of(2, 400ms) == "ddp[rank 2/4]: out of memory");
    CHECK(report.message_of(3, 400ms).empty());
    // Each rank finds the other's message, never its own.
    CHECK(report.any_peer_failure(400ms) == "rank 2 reported: ddp[rank 2/4]: out of memory");
    CHECK(rank2.any_peer_failure(400ms) == "rank 0 reported: ddp[rank 0/4]: all_reduce #5 (F32 x 8) timed out");
    CHECK(FailureReport::budget(400ms) == 100ms);  // T/4 within [0.1 s, 3 s]
    CHECK(FailureReport::budget(300s) == 3000ms);
  }

  TEST_CASE("failure report: every rank at the op says so") {
    ddp::store::HashStore store(10s);
    FailureReport r1(store, "p/", 1, 2);
    r1.publish("rank 1 failed", 3, all_reduce(3, 4), 1s);
    FailureReport r0(store, "p/", 0, 2);
    CHECK(r0.timeout_report(all_reduce(3, 4), 1s) == " Every other rank reached #3 too.");
  }

  TEST_CASE("failure report: a frozen store costs the report budget, not a store timeout per call") {
    ddp_test::SilentListener server;
    ddp::store::TcpStore store("127.0.0.1", server.port, {.protocol = ddp::store::TcpProtocol::V2, .timeout = 30s});
    FailureReport report(store, "p/", 1, 8);
    const auto t0 = Clock::now();
    report.publish("boom", 3, all_reduce(3, 4), 800ms);  // never throws; budget 200 ms
    CHECK(report.store_lost());
    const std::string peer = report.any_peer_failure(800ms);
    CHECK(report.message_of(2, 800ms).empty());
    const std::string r = report.timeout_report(all_reduce(3, 4), 800ms);
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    CHECK(peer.find("the store became unreachable") != std::string::npos);
    // Once a call found the store dead, the report says the positions are unknown instead of listing every
    // rank as "no report" (the ranks may well have reported; the store cannot tell).
    CHECK(r == " The store is unreachable, so the other ranks' positions are unknown.");
    // Without the caps: 30 s for each of the calls (and one per rank in the report).
    CHECK(took < 12.0);
  }
}
