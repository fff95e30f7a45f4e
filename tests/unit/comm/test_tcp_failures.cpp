// Failures of the tcp backend are loud and bounded (docs/decisions/0009): mismatched collectives, timeouts that name
// the missing rank, a broken communicator, the factory's errors.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <thread>
#include <vector>

#include "comm_harness.hpp"
#include "ddp/comm/factory.hpp"

using namespace ddp;
using namespace std::chrono_literals;

namespace {
constexpr comm::CommOptions kShort{.timeout = 2000ms, .shutdown_timeout = 2000ms};
}

TEST_SUITE("comm") {
  TEST_CASE("tcp: all_reduce on one rank and broadcast on the other fail on both, naming both ops") {
    const auto start = std::chrono::steady_clock::now();
    auto errors = test::run_ranks(2, [](comm::TcpCommunicator& c) {
      std::vector<float> v(4, 1.0f);
      if (c.rank() == 0) c.all_reduce(std::span(v)).wait();
      else c.broadcast(std::span(v), {.root = 0}).wait();
    }, kShort);
    CHECK(std::chrono::steady_clock::now() - start < 1500ms);  // well within the 2 s timeout
    const std::string rank1 =
        "ddp[rank 1/2]: broadcast #1 (F32 x 4, root 0) does not match rank 0, which ran all_reduce #1 (F32 x 4, sum) "
        "at this point. Every rank must call the same collectives in the same order with the same dtype, count, "
        "root and op.";
    CHECK_THROWS_WITH_AS(std::rethrow_exception(errors[1]), rank1.c_str(), CommError);
    CHECK_THROWS_WITH_AS(std::rethrow_exception(errors[0]),
                         ("ddp[rank 0/2]: all_reduce #1 (F32 x 4) failed: rank 1 reported: " + rank1).c_str(), CommError);
  }

  TEST_CASE("tcp: different counts are a mismatch on every rank, and the communicator stays failed") {
    auto errors = test::run_ranks(3, [](comm::TcpCommunicator& c) {
      std::vector<float> ok(4, 1.0f);
      c.all_reduce(std::span(ok)).wait();  // #1 matches
      std::vector<float> v(c.rank() == 2 ? 5 : 4, 1.0f);
      auto w = c.all_reduce(std::span(v));  // #2 does not
      CHECK_THROWS_WITH_AS(w.wait(), doctest::Contains("all_reduce #2"), CommError);
      CHECK_THROWS_WITH_AS(c.barrier().wait(), doctest::Contains("barrier #3 was not run: this communicator failed earlier"),
                           CommError);
      throw std::runtime_error("done");
    }, kShort);
    for (const auto& e : errors) CHECK(test::message(e) == "done");
  }

  TEST_CASE("tcp: a timeout names the rank that never reached the op") {
    std::latch others_done(2);
    const auto start = std::chrono::steady_clock::now();
    auto errors = test::run_ranks(3, [&](comm::TcpCommunicator& c) {
      if (c.rank() == 2) {  // never calls all_reduce #1
        others_done.wait();
        return;
      }
      std::vector<float> v(4, 1.0f);
      auto w = c.all_reduce(std::span(v), {.timeout = 300ms});
      try {
        w.wait();
      } catch (...) {
        others_done.count_down();
        throw;
      }
      others_done.count_down();
    }, kShort);
    CHECK(std::chrono::steady_clock::now() - start < 3000ms);
    const std::string e0 = test::message(errors[0]), e1 = test::message(errors[1]);
    INFO(e0);
    INFO(e1);
    CHECK(errors[0]);
    CHECK(errors[1]);
    const std::string want = "Ranks that never reached all_reduce #1: 2 (no report: busy outside ddp, stuck or dead).";
    CHECK((e0.find(want) != std::string::npos || e1.find(want) != std::string::npos));
    CHECK((e0.find("timed out after 300 ms") != std::string::npos || e1.find("timed out after 300 ms") != std::string::npos));
  }

  TEST_CASE("tcp: Work::wait(timeout) gives up without cancelling the op") {
    std::latch go(1);
    auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      std::vector<float> v(100'000, 1.0f);  // above inline_max_bytes: runs on the progress thread
      if (c.rank() == 1) go.wait();         // rank 1 joins late
      auto w = c.all_reduce(std::span(v));
      if (c.rank() == 0) {
        CHECK_THROWS_WITH_AS(w.wait(50ms), doctest::Contains("ddp[rank 0/2]: all_reduce #1 (F32 x 100000) did not complete "
                                                             "within Work::wait(50 ms)"), TimeoutError);
        go.count_down();
      }
      w.wait();
      CHECK(v[0] == 2.0f);
    }, kShort);
    for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
  }

  TEST_CASE("tcp: progress_cpus pins the progress thread; a CPU the kernel refuses fails every rank's setup") {
    auto ok = test::run_ranks(2, [](comm::TcpCommunicator& c) {
      std::vector<float> v(100'000, 1.0f);  // above inline_max_bytes: runs on the pinned progress thread
      c.all_reduce(std::span(v)).wait();
      if (v[0] != 2.0f) throw std::runtime_error("all-reduce on a pinned progress thread gave a wrong sum");
    }, {.timeout = 2000ms, .progress_cpus = {0}, .shutdown_timeout = 2000ms});
    for (const auto& e : ok) CHECK_MESSAGE(!e, test::message(e));
    auto refused = test::run_ranks(2, [](comm::TcpCommunicator&) {},
                                   {.timeout = 2000ms, .progress_cpus = {CPU_SETSIZE - 1}, .shutdown_timeout = 2000ms});
    for (const auto& e : refused) {
      REQUIRE(e);
      CHECK_MESSAGE(test::message(e).find("--comm-cpus (DDP_COMM_CPUS) 1023: the kernel refused to pin") !=
                        std::string::npos, test::message(e));
    }
  }

  TEST_CASE("make_communicator: backends by name") {
    store::HashStore store(1s);
    env::LaunchInfo one{.rank = 0, .world_size = 1};
    CHECK(comm::make_communicator("tcp", one, store)->backend() == "tcp");
    CHECK(comm::make_communicator("gloo", one, store)->size() == 1);
    CHECK_THROWS_WITH_AS(comm::make_communicator("glooo", one, store),
                         "ddp: unknown --backend 'glooo'; valid: tcp, gloo (= tcp), mpi, nccl.", ConfigError);
    if (!BuildConfig::with_nccl)
      CHECK_THROWS_WITH_AS(comm::make_communicator("nccl", one, store),
                           "ddp: --backend nccl requested but ddp was built without NCCL; reconfigure with "
                           "-DDDP_WITH_NCCL=ON or use --backend tcp", ConfigError);
    env::LaunchInfo two{.rank = 0, .world_size = 2};  // no master address: nowhere to listen
    CHECK_THROWS_WITH_AS(comm::make_communicator("tcp", two, store, {.socket_ifname = "nosuchif0"}),
                         doctest::Contains("ddp: DDP_SOCKET_IFNAME/--socket-ifname='nosuchif0' is not an interface "
                                           "with an IPv4 address here; interfaces: lo=127.0.0.1"), ConfigError);
    CHECK_THROWS_WITH_AS(comm::make_communicator("tcp", two, store),
                         doctest::Contains("MASTER_ADDR (--master-addr) is empty"), ConfigError);
  }

  TEST_CASE("tcp: the listen address routes to master_addr") {
    CHECK(comm::tcp::choose_listen_address("", "127.0.0.1") == "127.0.0.1");
    CHECK(comm::tcp::choose_listen_address("lo", "10.1.2.3") == "127.0.0.1");
    CHECK_THROWS_WITH_AS(comm::tcp::choose_listen_address("", "no-such-host.invalid"),
                         doctest::Contains("ddp: cannot resolve MASTER_ADDR 'no-such-host.invalid': "), ConfigError);
  }

  TEST_CASE("tcp: an IPv6 MASTER_ADDR gives an IPv6 mesh") {
    try {
      (void)net::listen("::1", 0, 1);
    } catch (const net::SocketError&) {
      MESSAGE("no IPv6 loopback here: case not run");
      return;
    }
    CHECK(comm::tcp::choose_listen_address("", "::1") == "::1");
    store::HashStore store(5s);
    std::vector<std::thread> ranks;
    std::vector<std::exception_ptr> errors(2);
    std::vector<float> sums(2);
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        try {
          comm::TcpCommunicator c(env::LaunchInfo{.rank = r, .world_size = 2, .master_addr = "::1"}, store,
                                  {.timeout = 5s, .shm = false});
          CHECK(c.listen_address() == "::1");
          std::vector<float> v{static_cast<float>(r + 1)};
          c.all_reduce(std::span(v)).wait();
          sums[static_cast<std::size_t>(r)] = v[0];
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : ranks) t.join();
    for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
    CHECK(sums == std::vector<float>{3.0f, 3.0f});
  }
}
