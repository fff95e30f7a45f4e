// PyTorch TCPStore wire format: request/response encoding and an incremental request parser, both
// generations.
// SPDX-License-Identifier: MIT
//
// The protocol (as torch 1.13 speaks it, observed through a byte-logging proxy, and as PyTorch
// 2.x's TCPStoreBackend/TCPStoreLibUvBackend read it):
// - A request is one opcode byte followed by its arguments. Integers and lengths are 64-bit
//   little-endian (host order on every platform PyTorch supports). A string or byte vector is
//   [u64 length][bytes]. A key list is [u64 count] followed by that many strings.
// - PyTorch's client puts '/' in front of every user key: API key "k1" travels as "/k1". Its own
//   worker counter "init/" travels without the slash.
// - Opcodes differ between the generations:
//     op           1.x  2.x  arguments                 response
//     VALIDATE      -    0   u32 magic 0x3C85F7CE      none (2.x servers ignore or close a
//                                                       client whose first request is another)
//     SET           0    1   key, value                none
//     COMPARE_SET   1    2   key, expected, desired    value now stored
//     GET           2    3   key                       value
//     ADD           3    4   key, i64 delta            i64 new value
//     CHECK         4    5   key list                  u8 READY=0 / NOT_READY=1
//     WAIT          5    6   key list                  u8 STOP_WAITING=0 once all exist
//     GETNUMKEYS    6    7   -                         i64
//     WATCH_KEY     7    -   key                       (callback protocol; not supported here)
//     DELETE_KEY    8    8   key                       i64 number deleted (0 or 1)
//     APPEND        -    9   key, value                none
//     MULTI_GET     -   10   key list                  one value per key
//     MULTI_SET     -   11   u64 n, n x (key, value)   none
//     CANCEL_WAIT   -   12   -                         u8 WAIT_CANCELED=1
//     PING          -   13   u32 nonce                 u32 nonce
//     QUEUE_PUSH    -   14   key, value                none
//     QUEUE_POP     -   15   key                       i64 length before pop [+ value if > 0]
//     QUEUE_LEN     -   16   key                       i64
//   E.g. (1.x) store.set("k1", "v1") is 00 | 03 00..00 2f 6b 31 | 02 00..00 76 31 (22 bytes).
// - Telling the generations apart from the first request: a 2.x client always opens with VALIDATE,
//   bytes 00 CE F7 85 3C. A 1.x request starting with 00 is a SET whose key length would have those
//   four bytes as its low half, i.e. >= 0x3C85F7CE, far above kMaxKeyBytes, so the rule "first byte
//   0 and the next four are the magic => 2.x, otherwise 1.x" never misreads a valid request.
//
// The parser (parse_request) never blocks and never reads past the buffer: it reports NeedMore with
// the smallest total size that could complete the request (so a caller re-parses only once that
// many bytes arrived, keeping a 1 GiB value linear), Complete with the bytes consumed, or Error
// with a reason. It is the entry point of the libFuzzer target tests/fuzz/fuzz_store_wire.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/str.hpp"
#include "ddp/store/store.hpp"

namespace ddp::store::wire {

enum class Protocol : std::uint8_t { V1, V2 };

inline std::string_view protocol_name(Protocol p) noexcept {
  return p == Protocol::V1 ? "PyTorch 1.x (no VALIDATE)" : "PyTorch 2.x (VALIDATE)";
}

// Protocol-independent operation; opcode() maps it to the byte of one generation.
enum class Op : std::uint8_t {
  Validate,
  Set,
  CompareSet,
  Get,
  Add,
  Check,
  Wait,
  GetNumKeys,
  WatchKey,
  DeleteKey,
  Append,
  MultiGet,
  MultiSet,
  CancelWait,
  Ping,
  QueuePush,
  QueuePop,
  QueueLen
};

inline constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
inline constexpr std::uint8_t kCheckReady = 0, kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0, kWaitCanceled = 1;

// Limits on one request; anything larger is a protocol error that closes the connection. Keys are
// names (64 KiB is generous); 1 GiB bounds what a bad or hostile client can make us buffer; 128 Ki
// keys per request is PyTorch's limit.
struct Limits {
  std::uint64_t max_key_bytes = 64 * 1024;
  std::uint64_t max_value_bytes = std::uint64_t{1} << 30;
  std::uint64_t max_keys = 128 * 1024;
};

inline std::string_view op_name(Op op) noexcept {
  constexpr std::string_view kNames[] = {
      "VALIDATE",  "SET",         "COMPARE_SET", "GET",        "ADD",       "CHECK",
      "WAIT",      "GETNUMKEYS",  "WATCH_KEY",   "DELETE_KEY", "APPEND",    "MULTI_GET",
      "MULTI_SET", "CANCEL_WAIT", "PING",        "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN"};
  return kNames[static_cast<int>(op)];
}

// Opcode byte of `op` in protocol `p`; nullopt when that generation has no such request.
inline std::optional<std::uint8_t> opcode(Op op, Protocol p) noexcept {
  const int i = static_cast<int>(op);
  if (p == Protocol::V1) {
    // SET=0 ... DELETE_KEY=8
    if (op >= Op::Set && op <= Op::DeleteKey) return static_cast<std::uint8_t>(i - 1);
    return std::nullopt;
  }
  if (op == Op::WatchKey) return std::nullopt;
  if (op <= Op::GetNumKeys) return static_cast<std::uint8_t>(i);  // VALIDATE=0 ... GETNUMKEYS=7
  return static_cast<std::uint8_t>(i - 1);                        // DELETE_KEY=8 ... QUEUE_LEN=16
}

inline std::optional<Op> op_of(std::uint8_t code, Protocol p) noexcept {
  if (p == Protocol::V1) {
    if (code <= 8) return static_cast<Op>(code + 1);
    return std::nullopt;
  }
  if (code <= 7) return static_cast<Op>(code);
  if (code <= 16) return static_cast<Op>(code + 1);
  return std::nullopt;
}

// One decoded request. Which fields are used depends on op:
//   keys: Set/CompareSet/Get/Add/WatchKey/DeleteKey/Append/Queue*: one; Check/Wait/MultiGet/
//         MultiSet: n.
//   values: Set/Append/QueuePush: one; CompareSet: {expected, desired}; MultiSet: one per key.
struct Request {
  Op op = Op::GetNumKeys;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  std::int64_t delta = 0;   // Add
  std::uint32_t nonce = 0;  // Ping, Validate (the magic)
};

enum class ParseStatus : std::uint8_t { NeedMore, Complete, Error };

struct ParseResult {
  ParseStatus status = ParseStatus::NeedMore;
  std::size_t consumed = 0;  // Complete: bytes of this request
  std::size_t need = 1;      // NeedMore: total buffer size worth re-parsing at
  Request request;           // Complete only
  std::string error;         // Error only
};

namespace detail {

// A read cursor over the caller's bytes. Every read checks the bounds first and records the
// smallest size that would let it succeed.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> buf) : buf_(buf) {}
  bool u8(std::uint8_t& v) {
    if (!have(1)) return false;
    v = buf_[pos_++];
    return true;
  }
  template <class T>
  bool le(T& v) {  // little-endian fixed-width integer, independent of host order
    if (!have(sizeof(T))) return false;
    std::uint64_t x = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) x |= std::uint64_t{buf_[pos_ + i]} << (8 * i);
    pos_ += sizeof(T);
    v = static_cast<T>(x);
    return true;
  }
  // Returns false with need_ set (more bytes) or error_ set (over the limit).
  bool blob(std::uint64_t limit, std::string_view what, auto& out) {
    std::uint64_t n = 0;
    if (!le(n)) return false;
    if (n > limit) {
      error_ = ddp::detail::str(what, " of ", n, " bytes exceeds the limit of ", limit, " bytes");
      return false;
    }
    if (!have(static_cast<std::size_t>(n))) return false;
    out.assign(buf_.begin() + static_cast<std::ptrdiff_t>(pos_),
               buf_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += static_cast<std::size_t>(n);
    return true;
  }
  bool count(std::uint64_t limit, std::uint64_t& n) {
    if (!le(n)) return false;
    if (n > limit) {
      error_ = ddp::detail::str("key count ", n, " exceeds the limit of ", limit);
      return false;
    }
    return true;
  }
  std::size_t pos() const noexcept { return pos_; }
  std::size_t need() const noexcept { return need_; }
  const std::string& error() const noexcept { return error_; }

 private:
  bool have(std::size_t n) {
    if (buf_.size() - pos_ >= n) return true;
    need_ = pos_ + n;
    return false;
  }
  std::span<const std::uint8_t> buf_;
  std::size_t pos_ = 0;
  std::size_t need_ = 0;
  std::string error_;
};

}  // namespace detail

// Decodes the request at the start of buf. See the file comment for the contract.
inline ParseResult parse_request(std::span<const std::uint8_t> buf, Protocol p,
                                 const Limits& limits = {}) {
  ParseResult res;
  detail::Reader rd(buf);
  std::uint8_t code = 0;
  if (!rd.u8(code)) return res;
  auto op = op_of(code, p);
  if (!op) {
    res.status = ParseStatus::Error;
    res.error = ddp::detail::str("unknown opcode ", int(code), " for ", protocol_name(p));
    return res;
  }
  Request& rq = res.request;
  rq.op = *op;
  auto key = [&] { return rd.blob(limits.max_key_bytes, "key", rq.keys.emplace_back()); };
  auto value = [&] { return rd.blob(limits.max_value_bytes, "value", rq.values.emplace_back()); };
  auto key_list = [&] {
    std::uint64_t n = 0;
    if (!rd.count(limits.max_keys, n)) return false;
    for (std::uint64_t i = 0; i < n; ++i)
      if (!key()) return false;
    return true;
  };
  bool ok = true;
  switch (rq.op) {
    case Op::Validate:
    case Op::Ping: ok = rd.le(rq.nonce); break;
    case Op::Set:
    case Op::Append:
    case Op::QueuePush: ok = key() && value(); break;
    case Op::CompareSet: ok = key() && value() && value(); break;
    case Op::Get:
    case Op::WatchKey:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen: ok = key(); break;
    case Op::Add: ok = key() && rd.le(rq.delta); break;
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet: ok = key_list(); break;
    case Op::MultiSet: {
      std::uint64_t n = 0;
      ok = rd.count(limits.max_keys, n);
      for (std::uint64_t i = 0; ok && i < n; ++i) ok = key() && value();
      break;
    }
    case Op::GetNumKeys:
    case Op::CancelWait: break;
  }
  if (!ok) {
    if (!rd.error().empty()) {
      res.status = ParseStatus::Error;
      res.error = ddp::detail::str(op_name(rq.op), ": ", rd.error());
    } else {
      res.need = rd.need();
    }
    res.request = {};
    return res;
  }
  if (rq.op == Op::Validate && rq.nonce != kValidationMagic) {
    res.status = ParseStatus::Error;
    res.error = ddp::detail::str("VALIDATE with wrong magic 0x", std::hex, rq.nonce,
                                 " (expected 0x", kValidationMagic, ")");
    return res;
  }
  res.status = ParseStatus::Complete;
  res.consumed = rd.pos();
  return res;
}

// Which generation a connection speaks, from its first bytes; nullopt while under 5 bytes decide.
inline std::optional<Protocol> detect_protocol(std::span<const std::uint8_t> first) noexcept {
  if (first.empty()) return std::nullopt;
  if (first[0] != 0) return Protocol::V1;
  if (first.size() < 5) return std::nullopt;
  std::uint32_t m = 0;
  for (int i = 0; i < 4; ++i) m |= std::uint32_t{first[1 + i]} << (8 * i);
  return m == kValidationMagic ? Protocol::V2 : Protocol::V1;
}

// ---- encoding (requests for the client, responses for the server) ----

class Writer {
 public:
  Writer& u8(std::uint8_t v) {
    out_.push_back(v);
    return *this;
  }
  template <class T>
  Writer& le(T v) {
    auto x = static_cast<std::uint64_t>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i)
      out_.push_back(static_cast<std::uint8_t>(x >> (8 * i)));
    return *this;
  }
  Writer& blob(std::span<const std::uint8_t> b) {
    le<std::uint64_t>(b.size());
    out_.insert(out_.end(), b.begin(), b.end());
    return *this;
  }
  Writer& blob(std::string_view s) {
    return blob(
        std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
  }
  Bytes& bytes() noexcept { return out_; }

 private:
  Bytes out_;
};

// Serialises rq (as parse_request reads it back) in protocol p; StoreError when p lacks rq.op.
inline Bytes encode_request(const Request& rq, Protocol p) {
  auto code = opcode(rq.op, p);
  if (!code)
    throw StoreError(ddp::detail::str("ddp: store request ", op_name(rq.op), " does not exist in ",
                                      protocol_name(p)));
  Writer w;
  w.u8(*code);
  auto need = [&](std::size_t k, std::size_t v) {
    if (rq.keys.size() < k || rq.values.size() < v)
      throw ValueError(ddp::detail::str("ddp: store request ", op_name(rq.op), " needs ", k,
                                        " key(s) and ", v, " value(s), got ", rq.keys.size(),
                                        " and ", rq.values.size()));
  };
  switch (rq.op) {
    case Op::Validate:
    case Op::Ping: w.le(rq.nonce); break;
    case Op::Set:
    case Op::Append:
    case Op::QueuePush: need(1, 1), w.blob(rq.keys[0]).blob(rq.values[0]); break;
    case Op::CompareSet:
      need(1, 2), w.blob(rq.keys[0]).blob(rq.values[0]).blob(rq.values[1]);
      break;
    case Op::Get:
    case Op::WatchKey:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen: need(1, 0), w.blob(rq.keys[0]); break;
    case Op::Add: need(1, 0), w.blob(rq.keys[0]).le(rq.delta); break;
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet:
      w.le<std::uint64_t>(rq.keys.size());
      for (const auto& k : rq.keys) w.blob(k);
      break;
    case Op::MultiSet:
      need(rq.keys.size(), rq.keys.size());
      w.le<std::uint64_t>(rq.keys.size());
      for (std::size_t i = 0; i < rq.keys.size(); ++i) w.blob(rq.keys[i]).blob(rq.values[i]);
      break;
    case Op::GetNumKeys:
    case Op::CancelWait: break;
  }
  return std::move(w.bytes());
}

inline std::int64_t decode_i64(std::span<const std::uint8_t, 8> b) noexcept {
  std::uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= std::uint64_t{b[static_cast<std::size_t>(i)]} << (8 * i);
  return static_cast<std::int64_t>(x);
}

}  // namespace ddp::store::wire
