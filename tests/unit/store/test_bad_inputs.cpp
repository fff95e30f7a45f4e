// store: tables of bad TCPStore frames: what the parser says about each (wire.hpp), and what a live
// TcpStoreServer does when a client sends it (closes only that connection, logs the reason, keeps
// serving everyone else, loses no data).
// SPDX-License-Identifier: MIT
//
// Why one server for the whole server table: a store server outlives many bad clients in a real job (a
// port scanner, an HTTP health check pointed at MASTER_PORT, a client of the wrong PyTorch generation),
// so every row hits the same server while a good client and a client parked in WAIT stay connected;
// after each row the good client's keys must be exactly what it wrote.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <ddp/store/tcp_store.hpp>
#include <ddp/store/tcp_store_server.hpp>
#include <ddp/store/wire.hpp>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "raw_client.hpp"

using namespace std::chrono_literals;
using ddp::store::Bytes;
using ddp::Clock;
using Socket = ddp::Fd;
using ddp::store::TcpStore;
using ddp::store::TcpStoreServer;
namespace wire = ddp::store::wire;
using namespace ddp_test;

namespace {

// Frame builder for bytes no valid client would send (lengths that do not match what follows).
wire::Writer frame(std::uint8_t opcode) {
  wire::Writer w;
  w.u8(opcode);
  return w;
}

Bytes cat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const Bytes kValidate = {0, 0xce, 0xf7, 0x85, 0x3c};  // 2.x handshake: VALIDATE + magic 0x3C85F7CE

}  // namespace

TEST_SUITE("store") {
  TEST_CASE("bad frames: the parser names the request and the limit (table)") {
    struct Row {
      const char* name;
      Bytes bytes;
      wire::Protocol protocol;
      std::string error;
      wire::Limits limits = {};
    };
    using P = wire::Protocol;
    const wire::Limits small{.max_key_bytes = 16, .max_value_bytes = 32, .max_keys = 4};
    const std::string k17(17, 'k');
    const Row rows[] = {
        {"1.x opcode 9 (2.x APPEND)", {9}, P::V1, "unknown opcode 9 for PyTorch 1.x (no VALIDATE)"},
        {"1.x garbage byte 0xff", {0xff}, P::V1, "unknown opcode 255 for PyTorch 1.x (no VALIDATE)"},
        {"2.x opcode 17 (one past QUEUE_LEN)", {17}, P::V2, "unknown opcode 17 for PyTorch 2.x (VALIDATE)"},
        {"2.x garbage byte 0xff", {0xff}, P::V2, "unknown opcode 255 for PyTorch 2.x (VALIDATE)"},
        {"VALIDATE with the wrong magic", {0, 1, 2, 3, 4}, P::V2,
         "VALIDATE with wrong magic 0x4030201 (expected 0x3c85f7ce)"},
        {"SET key over the limit", enc({.op = wire::Op::Set, .keys = {k17}, .values = {Bytes{}}}, P::V1), P::V1,
         "SET: key of 17 bytes exceeds the limit of 16 bytes", small},
        {"SET value over the limit", enc({.op = wire::Op::Set, .keys = {"k"}, .values = {Bytes(33)}}, P::V1), P::V1,
         "SET: value of 33 bytes exceeds the limit of 32 bytes", small},
        {"WAIT with too many keys", enc({.op = wire::Op::Wait, .keys = {"a", "b", "c", "d", "e"}}, P::V2), P::V2,
         "WAIT: key count 5 exceeds the limit of 4", small},
        // Refused as soon as the 8 length bytes are in: no allocation, no waiting for 2^40 bytes.
        {"SET announcing a 2^40-byte key", {0, 0, 0, 0, 0, 0, 1, 0, 0}, P::V1,
         "SET: key of 1099511627776 bytes exceeds the limit of 65536 bytes"},
        {"ADD with key length 2^64-1", frame(3).le<std::uint64_t>(~0ull).bytes(), P::V1,
         "ADD: key of 18446744073709551615 bytes exceeds the limit of 65536 bytes"},
        {"CHECK with 2^64-1 keys", frame(4).le<std::uint64_t>(~0ull).bytes(), P::V1,
         "CHECK: key count 18446744073709551615 exceeds the limit of 131072"},
        {"MULTI_SET with too many pairs", frame(11).le<std::uint64_t>(5).bytes(), P::V2,
         "MULTI_SET: key count 5 exceeds the limit of 4", small},
        {"MULTI_GET whose second key is over the limit", enc({.op = wire::Op::MultiGet, .keys = {"a", k17}}, P::V2),
         P::V2, "MULTI_GET: key of 17 bytes exceeds the limit of 16 bytes", small},
        {"COMPARE_SET desired value over the limit",
         enc({.op = wire::Op::CompareSet, .keys = {"k"}, .values = {Bytes{}, Bytes(33)}}, P::V1), P::V1,
         "COMPARE_SET: value of 33 bytes exceeds the limit of 32 bytes", small},
        {"QUEUE_PUSH value over the limit", enc({.op = wire::Op::QueuePush, .keys = {"q"}, .values = {Bytes(33)}}, P::V2),
         P::V2, "QUEUE_PUSH: value of 33 bytes exceeds the limit of 32 bytes", small},
        {"APPEND announcing a 2^63-byte value", frame(9).blob("k").le<std::uint64_t>(1ull << 63).bytes(), P::V2,
         "APPEND: value of 9223372036854775808 bytes exceeds the limit of 1073741824 bytes"},
        {"DELETE_KEY key over the limit", enc({.op = wire::Op::DeleteKey, .keys = {k17}}, P::V1), P::V1,
         "DELETE_KEY: key of 17 bytes exceeds the limit of 16 bytes", small},
    };
    for (const auto& r : rows) {
      const std::string row = r.name;
      CAPTURE(row);
      auto res = wire::parse_request(r.bytes, r.protocol, r.limits);
      CHECK(res.status == wire::ParseStatus::Error);
      CHECK(res.error == r.error);
      CHECK(res.consumed == 0);
    }
  }

  TEST_CASE("bad clients: the server closes only that connection, logs why, and loses nothing (table)") {
    LogCapture log;
    TcpStoreServer server("127.0.0.1", 0);
    TcpStoreServer v2_only("127.0.0.1", 0, {.accept_v1 = false});
    TcpStore good("127.0.0.1", server.port(), {.timeout = 2s});
    good.set("before", "1");
    good.set("text", "hello");
    // A client parked in WAIT on the same server for the whole table: bad clients must not disturb it.
    TcpStore waiter("127.0.0.1", server.port(), {.timeout = 10s});
    std::exception_ptr waiter_error;
    std::thread waiting([&] {
      try {
        waiter.wait("release");
      } catch (...) {
        waiter_error = std::current_exception();
      }
    });

    struct Row {
      const char* name;
      Bytes bytes;
      std::string logged;           // the reason in the server's WARN line
      bool client_leaves = false;   // the client closes (mid-frame) instead of the server
      bool on_v2_only = false;      // sent to the server that refuses 1.x clients
      int adds_keys = 0;            // keys a valid prefix of the bytes stored before the bad part
      std::function<void(TcpStore&)> after = nullptr;
    };
    const Bytes set_t = enc({.op = wire::Op::Set, .keys = {"/t"}, .values = {Bytes(100, 7)}}, wire::Protocol::V1);
    const std::string http = "GET / HTTP/1.1\r\nHost: trainer-0:29500\r\n\r\n";
    const Row rows[] = {
        {"unknown opcode", {0x63}, "malformed request: unknown opcode 99 for PyTorch 1.x (no VALIDATE)"},
        {"GET announcing a 2^56-byte key", {2, 0, 0, 0, 0, 0, 0, 0, 1},
         "malformed request: GET: key of 72057594037927936 bytes exceeds the limit of 65536 bytes"},
        {"SET '/k' announcing a 2^32-byte value", {0, 2, 0, 0, 0, 0, 0, 0, 0, '/', 'k', 0, 0, 0, 0, 1, 0, 0, 0},
         "malformed request: SET: value of 4294967296 bytes exceeds the limit of 1073741824 bytes"},
        {"a good VALIDATE, then one with the wrong magic", cat(kValidate, {0, 1, 2, 3, 4}),
         "malformed request: VALIDATE with wrong magic 0x4030201 (expected 0x3c85f7ce)"},
        {"30 bytes of a 119-byte SET, then the client disappears", Bytes(set_t.begin(), set_t.begin() + 30),
         "peer closed in the middle of a request", true, false, 0,
         [](TcpStore& s) { CHECK_FALSE(s.check("t")); }},
        {"WATCH_KEY (1.x callbacks)", enc({.op = wire::Op::WatchKey, .keys = {"/w"}}, wire::Protocol::V1),
         "WATCH_KEY (PyTorch 1.x watch_key callbacks) is not supported by the ddp store server"},
        {"an HTTP health check on MASTER_PORT", Bytes(http.begin(), http.end()),
         "malformed request: unknown opcode 71 for PyTorch 1.x (no VALIDATE)"},
        {"a TLS ClientHello", {0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03},
         "malformed request: unknown opcode 22 for PyTorch 1.x (no VALIDATE)"},
        {"2.x: VALIDATE, then opcode 17", cat(kValidate, {17}),
         "malformed request: unknown opcode 17 for PyTorch 2.x (VALIDATE)"},
        {"2.x: VALIDATE, then MULTI_GET of 2^40 keys", cat(kValidate, frame(10).le<std::uint64_t>(1ull << 40).bytes()),
         "malformed request: MULTI_GET: key count 1099511627776 exceeds the limit of 131072"},
        {"1.x: CHECK of 2^63 keys", frame(4).le<std::uint64_t>(1ull << 63).bytes(),
         "malformed request: CHECK: key count 9223372036854775808 exceeds the limit of 131072"},
        {"ADD on a key holding text", enc({.op = wire::Op::Add, .keys = {"/text"}, .delta = 1}, wire::Protocol::V1),
         "ADD on key '/text' whose value is not an integer", false, false, 0,
         [](TcpStore& s) { CHECK(s.get_string("text") == "hello"); }},
        {"a valid SET, then a garbage byte",
         cat(enc({.op = wire::Op::Set, .keys = {"/prefix"}, .values = {Bytes{'o', 'k'}}}, wire::Protocol::V1), {0xff}),
         "malformed request: unknown opcode 255 for PyTorch 1.x (no VALIDATE)", false, false, 1,
         [](TcpStore& s) { CHECK(s.get_string("prefix") == "ok"); }},  // what came before the garbage is kept
        {"a 1.x client on a server that refuses 1.x", enc({.op = wire::Op::GetNumKeys}, wire::Protocol::V1),
         "client speaks PyTorch 1.x (no VALIDATE), disabled on this server", false, true},
    };
    std::int64_t keys = good.num_keys();
    for (const auto& r : rows) {
      const std::string row = r.name;
      CAPTURE(row);
      log.clear();
      Socket bad = raw_connect(r.on_v2_only ? v2_only.port() : server.port());
      raw_send(bad, r.bytes);
      if (r.client_leaves)
        bad.reset();
      else
        CHECK(closed_by_peer(bad));
      CHECK(log.saw(r.logged));
      if (r.after) r.after(good);
      keys += r.adds_keys;
      // The good client's data is exactly what it wrote, and it can still write.
      CHECK(good.get_string("before") == "1");
      CHECK(good.num_keys() == keys);
    }
    still_serves(server.port());
    still_serves(v2_only.port());
    good.set("release", "go");
    waiting.join();
    CHECK_FALSE(waiter_error);
    // Every bad connection is gone: only `good`, `waiter` and nothing else remain.
    const auto deadline = Clock::now() + 2s;
    while (server.num_clients() != 2 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    CHECK(server.num_clients() == 2);
  }
}
