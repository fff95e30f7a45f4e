// comm: the NCCL backend's failure reporting through the store (comm/nccl/failure_report.hpp). Host-only
// code, so it is tested here without a GPU: what the report says, and that a frozen store cannot hold a
// failing rank up for a store timeout per call.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <chrono>
#include <ddp/comm/nccl/failure_report.hpp>
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
  TEST_CASE("nccl failure report: names the ranks behind and the ranks that ran another op") {
    ddp::store::HashStore store(10s);
    // Rank 1 is still in all_reduce #4, rank 2 ran a different all_reduce #5, rank 3 never reported.
    store.set("p/state/1", nccl::state_text(all_reduce(4, 8)));
    store.set("p/state/2", nccl::state_text(all_reduce(5, 9)));
    const auto t0 = Clock::now();
    const std::string r = nccl::timeout_report(store, "p/", 0, 4, all_reduce(5, 8), 400ms);
    CHECK(Clock::now() - t0 < 5s);
    CHECK(r.find("Ranks that never reached all_reduce #5: 1 (last in all_reduce #4 (F32 x 8, sum)), 3 (no report") !=
          std::string::npos);
    CHECK(r.find("At #5 rank 2 ran all_reduce #5 (F32 x 9, sum).") != std::string::npos);
    CHECK(store.get_string("p/state/0") == nccl::state_text(all_reduce(5, 8)));  // ours, for the others

    nccl::publish_failure(store, "p/", 2, "ddp[rank 2/4]: out of memory");
    CHECK(nccl::peer_failure(store, "p/", 0, 4) == "rank 2 reported: ddp[rank 2/4]: out of memory");
    CHECK(nccl::peer_failure(store, "p/", 2, 4).empty());  // its own report is not news to it
  }

  TEST_CASE("nccl failure report: a frozen store costs the report budget, not a store timeout per call") {
    ddp_test::SilentListener server;
    ddp::store::TcpStore store("127.0.0.1", server.port, {.protocol = ddp::store::TcpProtocol::V2, .timeout = 30s});
    const auto t0 = Clock::now();
    nccl::publish_failure(store, "p/", 1, "boom");                                  // never throws
    const std::string peer = nccl::peer_failure(store, "p/", 1, 8);
    const std::string r = nccl::timeout_report(store, "p/", 1, 8, all_reduce(3, 4), 800ms);  // budget 200 ms
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    CHECK(peer.find("the store became unreachable") != std::string::npos);
    CHECK(r.find("Ranks that never reached all_reduce #3: 0 (no report") != std::string::npos);
    // Without the caps: 30 s for each of the first calls (and one per rank in the report).
    CHECK(took < 12.0);
  }
}
