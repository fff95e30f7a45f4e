// TcpStore: a Store client of a PyTorch-compatible TCPStore server (ours, PyTorch 1.x's or 2.x's,
// torchrun's agent).
// SPDX-License-Identifier: MIT
//
//   ddp::store::TcpStore store("10.0.0.1", 29500, {.timeout = 30s, .rank = 2, .world_size = 4});
//   store.set("rank/2/addr", "10.0.0.3:4000");
//   auto peer = store.get_string("rank/0/addr");   // waits up to the timeout for rank 0
//
// Thread-safe (one mutex serialises the connection). Every call is bounded by the store timeout
// and throws TimeoutError naming the key, the timeout and host:port, or StoreError for a broken
// connection; a failed call drops the connection and the next one reconnects.
//
// Protocol (TcpStoreOptions::protocol):
//   V1    PyTorch 1.x opcodes, no handshake.
//   V2    PyTorch 2.x: VALIDATE (magic 0x3C85F7CE) first on every connection.
//   Auto  probe a throw-away connection with the byte 06: a 1.x server reads GETNUMKEYS and
//         answers 8 bytes: V1. A 2.x server closes (non-libuv) or ignores it (libuv): EOF or
//         probe_timeout of silence means V2. The probe changes nothing on either; VALIDATE would
//         read on 1.x as SET with a ~1 GB key and freeze that single-threaded server. Our
//         TcpStoreServer answers the probe as 1.x does.
// Operations a 1.x server lacks are emulated: append by get + compare_set retries, multi_get and
// multi_set one key at a time.
//
// Keys travel as "/" + key, as PyTorch's client sends them, so PyTorch and ddp ranks see the same
// keys (slash_prefix=false sends them verbatim).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/core/log.hpp"
#include "ddp/store/socket.hpp"
#include "ddp/store/store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/store/wire.hpp"

namespace ddp::store {

enum class TcpProtocol : std::uint8_t { Auto, V1, V2 };

struct TcpStoreOptions {
  TcpProtocol protocol = TcpProtocol::Auto;
  // connect, get, wait and every round trip
  std::chrono::milliseconds timeout = kDefaultStoreTimeout;
  std::chrono::milliseconds probe_timeout{1000};  // Auto: silence this long means 2.x
  // for "ddp[rank r/n]:" in errors; -1: unknown
  int rank = -1;
  int world_size = 0;
  bool slash_prefix = true;
};

class TcpStore final : public Store {
 public:
  // Connects (retrying with backoff; TimeoutError after opts.timeout) and settles the protocol.
  TcpStore(std::string host, std::uint16_t port, TcpStoreOptions opts = {})
      : Store(opts.timeout),
        host_(std::move(host)),
        port_(port),
        opts_(opts),
        where_(net::endpoint(host_, port_)) {
    std::lock_guard lock(mu_);
    try {
      ensure_connected(Clock::now() + opts_.timeout);
    } catch (const TimeoutError& e) {
      throw TimeoutError(ddp::detail::str(prefix(), strip(e.what())));
    } catch (const StoreError& e) {
      throw StoreError(ddp::detail::str(prefix(), strip(e.what())));
    }
  }

  ~TcpStore() override = default;

  const std::string& host() const noexcept { return host_; }
  std::uint16_t port() const noexcept { return port_; }
  // The generation in use (after Auto's probe).
  wire::Protocol protocol() const noexcept { return proto_; }
  // Keeps a server alive as long as this client (rank 0 hosting the store; see rendezvous.hpp).
  void keep_alive(std::unique_ptr<TcpStoreServer> server) { server_ = std::move(server); }

  void set(std::string_view key, std::span<const std::uint8_t> value) override {
    wire::Request rq{.op = wire::Op::Set,
                     .keys = {wire_key(key)},
                     .values = {Bytes(value.begin(), value.end())}};
    call("set", quote(key), [&](Clock::time_point d) { send(rq, d); });
  }
  using Store::set;

  Bytes get(std::string_view key) override {
    std::string k = wire_key(key);
    return call("get", quote(key), [&](Clock::time_point d) {
      wait_locked({k}, d);
      send({.op = wire::Op::Get, .keys = {k}}, d);
      return read_blob(d);
    });
  }

  std::int64_t add(std::string_view key, std::int64_t delta) override {
    return call("add", quote(key), [&](Clock::time_point d) {
      send({.op = wire::Op::Add, .keys = {wire_key(key)}, .delta = delta}, d);
      return read_i64(d);
    });
  }

  Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override {
    return call("compare_set", quote(key), [&](Clock::time_point d) {
      send({.op = wire::Op::CompareSet,
            .keys = {wire_key(key)},
            .values = {Bytes(expected.begin(), expected.end()),
                       Bytes(desired.begin(), desired.end())}},
           d);
      return read_blob(d);
    });
  }

  bool check(std::span<const std::string> keys) override {
    return call("check", quote_list(keys), [&](Clock::time_point d) {
      send({.op = wire::Op::Check, .keys = wire_keys(keys)}, d);
      return read_u8(d) == wire::kCheckReady;
    });
  }
  using Store::check;

  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    call(
        "wait", quote_list(keys), [&](Clock::time_point d) { wait_locked(wire_keys(keys), d); },
        timeout);
  }
  using Store::wait;

  bool delete_key(std::string_view key) override {
    return call("delete_key", quote(key), [&](Clock::time_point d) {
      send({.op = wire::Op::DeleteKey, .keys = {wire_key(key)}}, d);
      return read_i64(d) > 0;
    });
  }

  std::int64_t num_keys() override {
    return call("num_keys", "", [&](Clock::time_point d) {
      send({.op = wire::Op::GetNumKeys}, d);
      return read_i64(d);
    });
  }

  void append(std::string_view key, std::span<const std::uint8_t> value) override {
    if (proto_ == wire::Protocol::V2) {
      wire::Request rq{.op = wire::Op::Append,
                       .keys = {wire_key(key)},
                       .values = {Bytes(value.begin(), value.end())}};
      call("append", quote(key), [&](Clock::time_point d) { send(rq, d); });
      return;
    }
    // 1.x has no APPEND: read the current value and swap in current+value until no one raced us.
    for (;;) {
      Bytes cur = check(key) ? get(key) : Bytes{};
      Bytes next = cur;
      next.insert(next.end(), value.begin(), value.end());
      if (compare_set(key, cur, next) == next) return;
    }
  }

  std::vector<Bytes> multi_get(std::span<const std::string> keys) override {
    if (proto_ != wire::Protocol::V2) return Store::multi_get(keys);
    auto wk = wire_keys(keys);
    return call("multi_get", quote_list(keys), [&](Clock::time_point d) {
      wait_locked(wk, d);
      send({.op = wire::Op::MultiGet, .keys = wk}, d);
      std::vector<Bytes> out;
      for (std::size_t i = 0; i < wk.size(); ++i) out.push_back(read_blob(d));
      return out;
    });
  }

  void multi_set(std::span<const std::string> keys, std::span<const Bytes> values) override {
    if (proto_ != wire::Protocol::V2) return Store::multi_set(keys, values);
    if (keys.size() != values.size())
      throw ValueError(ddp::detail::str("ddp: store multi_set got ", keys.size(), " keys but ",
                                        values.size(), " values"));
    wire::Request rq{.op = wire::Op::MultiSet,
                     .keys = wire_keys(keys),
                     .values = {values.begin(), values.end()}};
    call("multi_set", quote_list(keys), [&](Clock::time_point d) { send(rq, d); });
  }

 private:
  std::string prefix() const {
    return opts_.rank >= 0 ? ddp::detail::str("ddp[rank ", opts_.rank, '/', opts_.world_size, "]: ")
                           : "ddp: ";
  }
  static std::string quote(std::string_view k) { return ddp::detail::quoted(k); }
  static std::string quote_list(std::span<const std::string> keys) {
    std::vector<std::string> q;
    for (const auto& k : keys) q.push_back(ddp::detail::quoted(k));
    return ddp::detail::str('[', ddp::detail::join(q, ", "), ']');
  }
  std::string wire_key(std::string_view k) const {
    return opts_.slash_prefix ? ddp::detail::str('/', k) : std::string(k);
  }
  std::vector<std::string> wire_keys(std::span<const std::string> keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(wire_key(k));
    return out;
  }

  // Runs one operation under the lock with a deadline; maps failures to messages naming the call.
  template <class F>
  std::invoke_result_t<F&, Clock::time_point> call(
      std::string_view op, std::string_view what, F&& f,
      std::optional<std::chrono::milliseconds> t = {}) {
    auto timeout = capped_timeout(t.value_or(timeout_));
    std::lock_guard lock(mu_);
    auto deadline = Clock::now() + timeout;
    bool connecting = true;
    try {
      ensure_connected(deadline);
      connecting = false;
      return f(deadline);
    } catch (const TimeoutError& e) {
      // a half-finished exchange (or a parked WAIT) must not leak into the next call
      sock_.reset();
      if (connecting)
        throw TimeoutError(
            ddp::detail::str(prefix(), "store ", op, '(', what, "): ", strip(e.what())));
      // The store was reachable: a get or wait timed out because no rank set the key, anything
      // else because the store's host (maybe this process, on rank 0) stopped answering.
      const bool blocking = op == "get" || op == "wait" || op == "multi_get";
      const std::string why =
          blocking ? std::string(
                         "the key was not set in time: the rank that sets it may not have started, "
                         "died or "
                         "is stuck (or the store's host stopped answering)")
                   : ddp::detail::str("the store did not answer: its host (",
                                      opts_.rank == 0 ? "this process, rank 0," : "rank 0",
                                      " or the launcher's agent) may be stopped or overloaded");
      throw TimeoutError(ddp::detail::str(
          prefix(), "store ", op, '(', what, ") timed out after ", timeout.count(), " ms on ",
          where_, ": ", why, ". Raise --timeout-ms (DDP_TIMEOUT_MS) if startup is slow."));
    } catch (const StoreError& e) {
      sock_.reset();
      throw StoreError(
          ddp::detail::str(prefix(), "store ", op, '(', what, ") failed: ", strip(e.what())));
    }
  }
  // "ddp: x" -> "x", to nest a lower-level message in ours.
  static std::string_view strip(std::string_view m) {
    if (m.starts_with("ddp: ")) m.remove_prefix(5);
    return m;
  }

  void ensure_connected(Clock::time_point deadline) {
    if (sock_.valid()) return;
    if (!proto_known_) {
      proto_ = opts_.protocol == TcpProtocol::V1   ? wire::Protocol::V1
               : opts_.protocol == TcpProtocol::V2 ? wire::Protocol::V2
                                                   : probe(deadline);
      proto_known_ = true;
      DDP_LOG_DEBUG("store client ", where_, " speaks ", wire::protocol_name(proto_));
    }
    Fd s = connect_tcp(host_, port_, deadline);
    if (proto_ == wire::Protocol::V2) {
      auto b =
          wire::encode_request({.op = wire::Op::Validate, .nonce = wire::kValidationMagic}, proto_);
      write_all(s, b, deadline, where_);
    }
    sock_ = std::move(s);
  }

  wire::Protocol probe(Clock::time_point deadline) {
    Fd s = connect_tcp(host_, port_, deadline);
    const std::uint8_t getnumkeys_v1 = 6;
    write_all(s, std::span<const std::uint8_t>(&getnumkeys_v1, 1), deadline, where_);
    auto until = std::min(deadline, Clock::now() + opts_.probe_timeout);
    std::uint8_t reply[8];
    std::size_t got = 0;
    while (got < sizeof(reply) && net::poll_until(s.get(), POLLIN, until)) {
      ssize_t n = ::recv(s.get(), reply + got, sizeof(reply) - got, 0);
      if (n <= 0) break;  // closed by a 2.x server that wanted VALIDATE first
      got += static_cast<std::size_t>(n);
    }
    return got == sizeof(reply) ? wire::Protocol::V1 : wire::Protocol::V2;
  }

  void send(const wire::Request& rq, Clock::time_point d) {
    write_all(sock_, wire::encode_request(rq, proto_), d, where_);
  }
  std::uint8_t read_u8(Clock::time_point d) {
    std::uint8_t b = 0;
    read_exact(sock_, std::span<std::uint8_t>(&b, 1), d, where_);
    return b;
  }
  std::int64_t read_i64(Clock::time_point d) {
    std::array<std::uint8_t, 8> b{};
    read_exact(sock_, b, d, where_);
    return wire::decode_i64(b);
  }
  Bytes read_blob(Clock::time_point d) {
    auto n = static_cast<std::uint64_t>(read_i64(d));
    if (n > wire::Limits{}.max_value_bytes)
      throw StoreError(
          ddp::detail::str("ddp: the store at ", where_, " announced a value of ", n,
                           " bytes (over the 1 GiB limit); is this really a PyTorch TCPStore?"));
    Bytes out(static_cast<std::size_t>(n));
    read_exact(sock_, out, d, where_);
    return out;
  }
  void wait_locked(std::vector<std::string> keys, Clock::time_point d) {
    send({.op = wire::Op::Wait, .keys = std::move(keys)}, d);
    if (auto r = read_u8(d); r != wire::kStopWaiting)
      throw StoreError(ddp::detail::str("ddp: unexpected WAIT reply ", int(r), " from ", where_));
  }

  std::unique_ptr<TcpStoreServer> server_;  // first: destroyed after the connection below
  std::string host_;
  std::uint16_t port_;
  TcpStoreOptions opts_;
  std::string where_;
  std::mutex mu_;
  Fd sock_;
  wire::Protocol proto_ = wire::Protocol::V1;
  bool proto_known_ = false;
};

}  // namespace ddp::store
