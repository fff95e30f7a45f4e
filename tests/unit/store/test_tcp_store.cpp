// store: TcpStore client + TcpStoreServer on port 0: every operation, both protocol generations, concurrency,
// timeouts, and slow or flooding clients that must not disturb good ones (malformed bytes: test_bad_inputs.cpp).
// SPDX-License-Identifier: MIT
#include <ddp/comm/checks.hpp>
#include <ddp/core/log.hpp>
#include <ddp/core/wait_report.hpp>
#include <ddp/store/prefix_store.hpp>
#include <ddp/store/rendezvous.hpp>
#include <ddp/store/tcp_store.hpp>
#include <ddp/store/tcp_store_server.hpp>
#include <algorithm>
#include <memory>
#include <mutex>

#include "raw_client.hpp"
#include "silent_listener.hpp"
#include "support/log_capture.hpp"
#include "store_conformance.hpp"

namespace {

using namespace std::chrono_literals;
using ddp::store::Bytes;
using ddp::Clock;
using Socket = ddp::Fd;
using ddp::store::TcpProtocol;
using ddp::store::TcpStore;
using ddp::store::TcpStoreServer;
namespace wire = ddp::store::wire;
using ddp_test::enc;
using ddp_test::raw_connect;
using ddp_test::raw_read;
using ddp_test::raw_send;

}  // namespace

TEST_SUITE("store") {
  TEST_CASE("TcpStore against TcpStoreServer: every operation, each protocol") {
    for (TcpProtocol p : {TcpProtocol::Auto, TcpProtocol::V1, TcpProtocol::V2}) {
      CAPTURE(static_cast<int>(p));
      TcpStoreServer server("127.0.0.1", 0);
      REQUIRE(server.port() != 0);
      CHECK(server.host() == "127.0.0.1");
      TcpStore s("127.0.0.1", server.port(), {.protocol = p, .timeout = 2s});
      // Our server answers the probe like a 1.x server; Auto then speaks 1.x (every op still works).
      CHECK(s.protocol() == (p == TcpProtocol::V2 ? wire::Protocol::V2 : wire::Protocol::V1));
      // A second client sets the key the first one's get() blocks on, and sees the first one's keys.
      TcpStore other("127.0.0.1", server.port(), {.protocol = p, .timeout = 2s});
      ddp_test::check_store_semantics(s, &other);
      CHECK(other.get_string("cas") == "b");
    }
  }

  TEST_CASE("Auto picks 2.x when the server closes a connection that does not start with VALIDATE") {
    // A server that refuses 1.x behaves like PyTorch 2.x's non-libuv backend toward the probe.
    TcpStoreServer server("127.0.0.1", 0, {.accept_v1 = false});
    TcpStore s("127.0.0.1", server.port(), {.timeout = 2s});
    CHECK(s.protocol() == wire::Protocol::V2);
    TcpStore other("127.0.0.1", server.port(), {.protocol = TcpProtocol::V2, .timeout = 2s});
    ddp_test::check_store_semantics(s, &other);
  }

  TEST_CASE("many threads hammering add() get an exact count") {
    TcpStoreServer server("127.0.0.1", 0);
    TcpStore shared("127.0.0.1", server.port(), {.timeout = 2s});
    SUBCASE("one client shared by 8 threads") {
      ddp_test::hammer_add([&](int) -> ddp::store::Store& { return shared; }, 8, 250, shared);
    }
    SUBCASE("8 clients, one per thread, both protocols") {
      std::vector<std::unique_ptr<TcpStore>> clients;
      for (int t = 0; t < 8; ++t)
        clients.push_back(std::make_unique<TcpStore>(
            "127.0.0.1", server.port(),
            ddp::store::TcpStoreOptions{.protocol = t % 2 ? TcpProtocol::V2 : TcpProtocol::V1, .timeout = 2s}));
      ddp_test::hammer_add([&](int t) -> ddp::store::Store& { return *clients[static_cast<std::size_t>(t)]; }, 8, 250,
                           shared);
    }
  }

  TEST_CASE("timeouts name the call, the key, the timeout and host:port") {
    TcpStoreServer server("127.0.0.1", 0);
    TcpStore s("127.0.0.1", server.port(), {.timeout = 100ms, .rank = 2, .world_size = 4});
    const std::string where = "127.0.0.1:" + std::to_string(server.port());
    auto t0 = Clock::now();
    CHECK_THROWS_WITH_AS(s.get("rank/0/addr"),
                         ("ddp[rank 2/4]: store get('rank/0/addr') timed out after 100 ms on " + where +
                          ": the key was not set in time: the rank that sets it may not have started, died or is "
                          "stuck (or the store's host stopped answering). Raise --timeout-ms (DDP_TIMEOUT_MS) if "
                          "startup is slow.").c_str(),
                         ddp::TimeoutError);
    CHECK(Clock::now() - t0 >= 100ms);
    std::vector<std::string> keys{"a", "b"};
    CHECK_THROWS_WITH_AS(s.wait(keys, 50ms),
                         ("ddp[rank 2/4]: store wait(['a', 'b']) timed out after 50 ms on " + where +
                          ": the key was not set in time: the rank that sets it may not have started, died or is "
                          "stuck (or the store's host stopped answering). Raise --timeout-ms (DDP_TIMEOUT_MS) if "
                          "startup is slow.").c_str(),
                         ddp::TimeoutError);
    // The timed-out WAIT must not leak into later calls: the client reconnects and works.
    s.set("a", "1");
    s.set("b", "2");
    s.wait(keys, 1s);
    CHECK(s.get_string("b") == "2");
    CHECK(s.add("n", 3) == 3);
  }

  TEST_CASE("connecting to a port nobody listens on times out naming host:port") {
    std::uint16_t port = 0;
    {
      Socket probe = ddp::store::listen_tcp("127.0.0.1", 0);
      port = ddp::net::local_port(probe.get());
    }  // closed: connections to it are refused
    auto t0 = Clock::now();
    const std::string expected = "ddp[rank 1/2]: could not connect to the store at 127.0.0.1:" + std::to_string(port) +
                                 " before the timeout; last error: Connection refused";
    CHECK_THROWS_WITH_AS(TcpStore("127.0.0.1", port, {.timeout = 150ms, .rank = 1, .world_size = 2}),
                         doctest::Contains(expected.c_str()), ddp::TimeoutError);
    CHECK(Clock::now() - t0 >= 150ms);
  }

  TEST_CASE("a rank waiting for the store says so every interval, naming host:port") {
    // Before: nothing was printed until the timeout (300 s by default).
    std::uint16_t port = 0;
    {
      Socket probe = ddp::store::listen_tcp("127.0.0.1", 0);
      port = ddp::net::local_port(probe.get());
    }
    ddp::test::LogCapture log;
    ddp::set_wait_report_interval(200ms);
    CHECK_THROWS_AS(TcpStore("127.0.0.1", port, {.timeout = 1000ms, .rank = 1, .world_size = 2}), ddp::TimeoutError);
    ddp::set_wait_report_interval(20s);
    CHECK(log.contains("waiting for the store at 127.0.0.1:" + std::to_string(port) +
                       " (200 ms of 1000 ms); is rank 0 (or the launcher hosting the store) started?"));
  }

  TEST_CASE("on rank 0, a get that times out blames the rank that sets the key, not rank 0") {
    // Before: "... timed out after 100 ms on <host:port>. Rank 0 may not have started or the address is unreachable"
    TcpStoreServer server("127.0.0.1", 0);
    TcpStore s("127.0.0.1", server.port(), {.timeout = 100ms, .rank = 0, .world_size = 2});
    CHECK_THROWS_WITH_AS(s.get("addr/1"),
                         ("ddp[rank 0/2]: store get('addr/1') timed out after 100 ms on 127.0.0.1:" +
                          std::to_string(server.port()) +
                          ": the key was not set in time: the rank that sets it may not have started, died or is "
                          "stuck (or the store's host stopped answering). Raise --timeout-ms (DDP_TIMEOUT_MS) if "
                          "startup is slow.").c_str(),
                         ddp::TimeoutError);
    // A call that waits for no key timed out because the store did not answer: on rank 0 that is this process.
    ddp_test::SilentListener silent;  // a frozen server: connects, never replies
    TcpStore frozen("127.0.0.1", silent.port, {.protocol = TcpProtocol::V2, .timeout = 100ms, .rank = 0, .world_size = 2});
    CHECK_THROWS_WITH_AS((void)frozen.check("k"),
                         ("ddp[rank 0/2]: store check(['k']) timed out after 100 ms on 127.0.0.1:" +
                          std::to_string(silent.port) +
                          ": the store did not answer: its host (this process, rank 0, or the launcher's agent) may be "
                          "stopped or overloaded. Raise --timeout-ms (DDP_TIMEOUT_MS) if startup is slow.").c_str(),
                         ddp::TimeoutError);
  }

  TEST_CASE("a port in use says what probably holds it") {
    TcpStoreServer first("127.0.0.1", 0);
    CHECK_THROWS_WITH_AS(TcpStoreServer("127.0.0.1", first.port()),
                         ("ddp: cannot listen on 127.0.0.1:" + std::to_string(first.port()) +
                          ": Address already in use (errno 98). Another process holds the port: most likely torchrun's "
                          "agent store (under torchrun with TORCHELASTIC_USE_AGENT_STORE=True the agent already serves "
                          "MASTER_PORT and every rank must be a client) or a previous run that has not exited. Pick a "
                          "free port with --master-port (MASTER_PORT) or DDP_STORE_PORT, or stop the old process.")
                             .c_str(),
                         ddp::StoreError);
  }

  TEST_CASE("a client that sends half a frame does not stall the others") {
    TcpStoreServer server("127.0.0.1", 0);
    Socket slow = raw_connect(server.port());
    Bytes frame = enc({.op = wire::Op::Set, .keys = {"/slow"}, .values = {Bytes{'o', 'k'}}}, wire::Protocol::V1);
    raw_send(slow, Bytes(frame.begin(), frame.begin() + 5));  // stuck inside the key length

    TcpStore fast("127.0.0.1", server.port(), {.timeout = 2s});
    auto t0 = Clock::now();
    for (int i = 0; i < 50; ++i) fast.set(ddp::detail::str("k", i), "v");
    CHECK(fast.get_string("k49") == "v");
    CHECK(fast.num_keys() == 50);
    CHECK(Clock::now() - t0 < 2s);

    raw_send(slow, Bytes(frame.begin() + 5, frame.end()));  // the rest arrives: the request completes
    CHECK(fast.get_string("slow") == "ok");
  }

  TEST_CASE("a client that never reads its answers is throttled, not buffered without bound, and others go on") {
    // A 64 KiB cap (default 16 MiB) keeps the test fast under sanitizers.
    TcpStoreServer server("127.0.0.1", 0, {.max_backlog_bytes = 64 << 10});
    TcpStore probe("127.0.0.1", server.port(), {.timeout = 2s});
    const std::int64_t keys = probe.num_keys();
    // 300 k GETNUMKEYS requests (300 kB) produce 2.4 MB of answers, far above the backlog cap: once the
    // kernel's socket buffers are full too, the server pauses reading this client until it drains (the
    // writer may block), while the other client is still served; every answer arrives, in order.
    constexpr std::size_t kRequests = 300'000;
    Socket flood = raw_connect(server.port());
    std::thread writer([&] { raw_send(flood, Bytes(kRequests, 6)); });
    // Meanwhile another client is served normally (bounded by its 2 s timeout).
    probe.set("x", "1");
    CHECK(probe.get_string("x") == "1");
    std::size_t answers = 0;
    bool all_same = true;
    Bytes chunk(8 * 4096);
    while (answers < kRequests) {
      std::size_t n = std::min<std::size_t>(4096, kRequests - answers);
      ddp::store::read_exact(flood, std::span<std::uint8_t>(chunk.data(), 8 * n), Clock::now() + 10s, "flood");
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t v = wire::decode_i64(std::span<const std::uint8_t, 8>(chunk.data() + 8 * i, 8));
        all_same = all_same && (v == keys || v == keys + 1);  // before or after "x" was set
      }
      answers += n;
    }
    writer.join();
    CHECK(answers == kRequests);
    CHECK(all_same);
  }

  TEST_CASE("2.x requests on the raw wire: VALIDATE, PING, WAIT + CANCEL_WAIT, queues") {
    TcpStoreServer server("127.0.0.1", 0);
    Socket c = raw_connect(server.port());
    const auto v2 = wire::Protocol::V2;
    raw_send(c, enc({.op = wire::Op::Validate, .nonce = wire::kValidationMagic}, v2));
    raw_send(c, enc({.op = wire::Op::Ping, .nonce = 0x01020304}, v2));
    CHECK(raw_read(c, 4) == Bytes{4, 3, 2, 1});
    raw_send(c, enc({.op = wire::Op::Wait, .keys = {"/never"}}, v2));
    raw_send(c, enc({.op = wire::Op::CancelWait}, v2));
    CHECK(raw_read(c, 1) == Bytes{wire::kWaitCanceled});
    raw_send(c, enc({.op = wire::Op::QueuePush, .keys = {"/q"}, .values = {Bytes{'e'}}}, v2));
    raw_send(c, enc({.op = wire::Op::QueueLen, .keys = {"/q"}}, v2));
    CHECK(raw_read(c, 8) == Bytes{1, 0, 0, 0, 0, 0, 0, 0});
    raw_send(c, enc({.op = wire::Op::QueuePop, .keys = {"/q"}}, v2));
    CHECK(raw_read(c, 17) == Bytes{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'e'});
    // A WAIT parked on one connection is answered when another connection sets the key.
    raw_send(c, enc({.op = wire::Op::Wait, .keys = {"/x", "/y"}}, v2));
    TcpStore setter("127.0.0.1", server.port(), {.timeout = 2s});
    setter.set("x", "1");
    setter.set("y", "2");
    CHECK(raw_read(c, 1) == Bytes{wire::kStopWaiting});
    // This raw client and the setter's connection (its Auto probe connection is gone). The count is
    // published by the server thread after each poll round, so allow it a moment.
    auto deadline = Clock::now() + 2s;
    while (server.num_clients() != 2 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    CHECK(server.num_clients() == 2);
  }

  TEST_CASE("make_store: single process, hosted by rank 0, and client-only under torchrun's agent") {
    ddp::env::LaunchInfo single;
    CHECK(dynamic_cast<ddp::store::HashStore*>(ddp::store::make_store(single, 1s).get()) != nullptr);

    ddp::env::LaunchInfo bad{.rank = 1, .world_size = 2, .source = "env"};
    CHECK_THROWS_WITH_AS(ddp::store::make_store(bad, 1s),
                         "ddp[rank 1/2]: launched by env with WORLD_SIZE=2 but MASTER_ADDR is not set; the ranks cannot "
                         "find the store. Export MASTER_ADDR (--master-addr) with the host of rank 0.",
                         ddp::ConfigError);

    // Rank 0 hosts on the store port; ranks 1 and 2 are clients.
    std::uint16_t port = 0;
    {
      Socket probe = ddp::store::listen_tcp("127.0.0.1", 0);
      port = ddp::net::local_port(probe.get());
    }
    std::vector<std::unique_ptr<ddp::store::Store>> stores(3);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 3; ++r)
      ranks.emplace_back([&, r] {
        ddp::env::LaunchInfo info{.rank = r, .world_size = 3, .master_addr = "127.0.0.1", .master_port = 1};
        stores[static_cast<std::size_t>(r)] = ddp::store::make_store(info, 2s, port);
        stores[static_cast<std::size_t>(r)]->add("joined", 1);
      });
    for (auto& t : ranks) t.join();
    for (auto& s : stores) REQUIRE(s);
    CHECK(stores[2]->add("joined", 0) == 3);

    // launcher_owns_store: nobody binds; everyone is a client of the existing server.
    TcpStoreServer agent("127.0.0.1", 0);
    ddp::env::LaunchInfo t0{.rank = 0, .world_size = 2, .master_addr = "127.0.0.1", .master_port = agent.port(),
                            .launcher_owns_store = true, .source = "torchrun"};
    auto s0 = ddp::store::make_store(t0, 2s);
    // The launcher's store serves every restart, so the attempt's keys live under torch's
    // "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/" (docs/decisions/0036): make_store returns a
    // PrefixStore over the client (before docs/decisions/0036 it returned the client itself and "from0" was
    // unprefixed).
    auto* view = dynamic_cast<ddp::store::PrefixStore*>(s0.get());
    REQUIRE(view != nullptr);
    CHECK(view->prefix() == "/worker/attempt_0");
    auto* tcp = dynamic_cast<TcpStore*>(&view->base());
    REQUIRE(tcp != nullptr);
    CHECK(tcp->port() == agent.port());
    s0->set("from0", "x");
    TcpStore direct("127.0.0.1", agent.port(), {.timeout = 2s});
    CHECK(direct.get_string("/worker/attempt_0/from0") == "x");
    CHECK_FALSE(direct.check({"from0"}));
  }

  // The bug docs/decisions/0036 fixes: under a launcher that keeps its store across restarts (ddprun, torchrun's static
  // rendezvous), attempt 0's rank 1 died before its communicator joined, so only rank 0 counted itself in
  // "ddp/tcp/joined". With one shared count the restarted ranks drew joins 2 and 3 -> prefixes ddp/tcp/0/
  // and ddp/tcp/1/, and never met (ddprun --max-restarts 1 gave up after the mesh timeout). Each attempt
  // now counts in its own namespace.
  TEST_CASE("make_store: a restart under the launcher's store is not shifted by a rank that never joined") {
    TcpStoreServer agent("127.0.0.1", 0);
    auto launched = [&](int rank, int restart) {
      return ddp::env::LaunchInfo{.rank = rank, .world_size = 2, .master_addr = "127.0.0.1",
                                  .master_port = agent.port(), .restart_count = restart,
                                  .launcher_owns_store = true, .source = "torchrun"};
    };
    auto lone = ddp::store::make_store(launched(0, 0), 2s);  // attempt 0: rank 0 joins, rank 1 died
    CHECK(ddp::comm::attempt_prefix(*lone, "tcp", 2) == "ddp/tcp/0/");
    lone->set("ddp/tcp/0/addr/0", "10.0.0.1:1");  // a stale address the next attempt must not read
    std::vector<std::string> prefixes(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        auto store = ddp::store::make_store(launched(r, 1), 2s);
        prefixes[static_cast<std::size_t>(r)] = ddp::comm::attempt_prefix(*store, "tcp", 2);
        CHECK_FALSE(store->check({prefixes[static_cast<std::size_t>(r)] + "addr/0"}));
      });
    for (auto& t : ranks) t.join();
    CHECK(prefixes[0] == "ddp/tcp/0/");
    CHECK(prefixes[1] == "ddp/tcp/0/");
  }
}
