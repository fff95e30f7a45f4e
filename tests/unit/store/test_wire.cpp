// store: the TCPStore wire format, pinned to bytes captured from PyTorch 1.13's client, and the incremental parser.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/store/wire.hpp>
#include <string>
#include <vector>

namespace {

using namespace ddp::store::wire;
using ddp::store::Bytes;

Bytes hex(std::string_view h) {
  Bytes out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<std::uint8_t>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}

Request req(Op op, std::vector<std::string> keys = {}, std::vector<Bytes> values = {}, std::int64_t delta = 0,
            std::uint32_t nonce = 0) {
  return Request{.op = op, .keys = std::move(keys), .values = std::move(values), .delta = delta, .nonce = nonce};
}

bool same(const Request& a, const Request& b) {
  return a.op == b.op && a.keys == b.keys && a.values == b.values && a.delta == b.delta && a.nonce == b.nonce;
}

}  // namespace

TEST_SUITE("store") {
  TEST_CASE("opcodes of both generations") {
    // 1.x, observed on torch 1.13: SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6 WATCH_KEY=7 DELETE_KEY=8.
    const Op v1[] = {Op::Set, Op::CompareSet, Op::Get, Op::Add, Op::Check, Op::Wait, Op::GetNumKeys, Op::WatchKey, Op::DeleteKey};
    for (int i = 0; i < 9; ++i) {
      CHECK(opcode(v1[i], Protocol::V1) == i);
      CHECK(op_of(static_cast<std::uint8_t>(i), Protocol::V1) == v1[i]);
    }
    CHECK_FALSE(opcode(Op::Validate, Protocol::V1));
    CHECK_FALSE(opcode(Op::Append, Protocol::V1));
    CHECK_FALSE(op_of(9, Protocol::V1));
    // 2.x: VALIDATE=0 SET=1 ... GETNUMKEYS=7 DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12 PING=13
    // QUEUE_PUSH=14 QUEUE_POP=15 QUEUE_LEN=16; no WATCH_KEY.
    const Op v2[] = {Op::Validate, Op::Set, Op::CompareSet, Op::Get, Op::Add, Op::Check, Op::Wait, Op::GetNumKeys,
                     Op::DeleteKey, Op::Append, Op::MultiGet, Op::MultiSet, Op::CancelWait, Op::Ping, Op::QueuePush,
                     Op::QueuePop, Op::QueueLen};
    for (int i = 0; i < 17; ++i) {
      CHECK(opcode(v2[i], Protocol::V2) == i);
      CHECK(op_of(static_cast<std::uint8_t>(i), Protocol::V2) == v2[i]);
    }
    CHECK_FALSE(opcode(Op::WatchKey, Protocol::V2));
    CHECK_FALSE(op_of(17, Protocol::V2));
  }

  TEST_CASE("encoding matches the bytes PyTorch 1.13's client sends") {
    // Captured with a logging proxy between torch 1.13's TCPStore client and server (see wire.hpp).
    CHECK(encode_request(req(Op::Set, {"/k1"}, {Bytes{'v', '1'}}), Protocol::V1) ==
          hex("0003000000000000002f6b3102000000000000007631"));
    CHECK(encode_request(req(Op::Wait, {"/k1"}), Protocol::V1) == hex("05010000000000000003000000000000002f6b31"));
    CHECK(encode_request(req(Op::Get, {"/k1"}), Protocol::V1) == hex("0203000000000000002f6b31"));
    CHECK(encode_request(req(Op::Add, {"/c"}, {}, 5), Protocol::V1) == hex("0302000000000000002f630500000000000000"));
    CHECK(encode_request(req(Op::Add, {"init/"}, {}, 1), Protocol::V1) == hex("030500000000000000696e69742f0100000000000000"));
    CHECK(encode_request(req(Op::CompareSet, {"/k1"}, {Bytes{'v', '1'}, Bytes{'v', '2'}}), Protocol::V1) ==
          hex("0103000000000000002f6b310200000000000000763102000000000000007632"));
    CHECK(encode_request(req(Op::GetNumKeys), Protocol::V1) == hex("06"));
    CHECK(encode_request(req(Op::DeleteKey, {"/k1"}), Protocol::V1) == hex("0803000000000000002f6b31"));
    // 2.x: the same SET one opcode higher, and the handshake.
    CHECK(encode_request(req(Op::Set, {"/k1"}, {Bytes{'v', '1'}}), Protocol::V2) ==
          hex("0103000000000000002f6b3102000000000000007631"));
    CHECK(encode_request(req(Op::Validate, {}, {}, 0, kValidationMagic), Protocol::V2) == hex("00cef7853c"));
    CHECK_THROWS_WITH_AS(encode_request(req(Op::Append, {"/k"}, {Bytes{}}), Protocol::V1),
                         "ddp: store request APPEND does not exist in PyTorch 1.x (no VALIDATE)", ddp::StoreError);
  }

  TEST_CASE("every request round-trips and every strict prefix asks for more bytes") {
    const std::vector<Request> all = {
        req(Op::Validate, {}, {}, 0, kValidationMagic), req(Op::Set, {"/a"}, {Bytes{1, 0, 2}}),
        req(Op::CompareSet, {"/a"}, {Bytes{}, Bytes{'x'}}), req(Op::Get, {"/a"}), req(Op::Add, {"/n"}, {}, -3),
        req(Op::Check, {"/a", "/b"}), req(Op::Wait, {"/a"}), req(Op::Wait, {}), req(Op::GetNumKeys),
        req(Op::WatchKey, {"/w"}), req(Op::DeleteKey, {"/a"}), req(Op::Append, {"/l"}, {Bytes{'z'}}),
        req(Op::MultiGet, {"/a", "/b", "/c"}), req(Op::MultiSet, {"/a", "/b"}, {Bytes{'1'}, Bytes{}}),
        req(Op::CancelWait), req(Op::Ping, {}, {}, 0, 0xDEADBEEF), req(Op::QueuePush, {"/q"}, {Bytes{'e'}}),
        req(Op::QueuePop, {"/q"}), req(Op::QueueLen, {"/q"})};
    for (Protocol p : {Protocol::V1, Protocol::V2}) {
      for (const auto& rq : all) {
        if (!opcode(rq.op, p)) continue;
        CAPTURE(op_name(rq.op));
        Bytes b = encode_request(rq, p);
        b.push_back(0x42);  // a following request's first byte must not be consumed
        auto r = parse_request(b, p);
        REQUIRE(r.status == ParseStatus::Complete);
        CHECK(r.consumed == b.size() - 1);
        CHECK(same(r.request, rq));
        for (std::size_t n = 0; n + 1 < b.size(); ++n) {
          auto part = parse_request(std::span<const std::uint8_t>(b.data(), n), p);
          REQUIRE(part.status == ParseStatus::NeedMore);
          CHECK(part.need > n);
          CHECK(part.need <= b.size() - 1);
        }
      }
    }
  }

  TEST_CASE("the first bytes tell the generations apart") {
    CHECK(detect_protocol(hex("00cef7853c")) == Protocol::V2);
    CHECK(detect_protocol(hex("0003000000")) == Protocol::V1);  // a 1.x SET
    CHECK(detect_protocol(hex("06")) == Protocol::V1);
    CHECK_FALSE(detect_protocol(hex("00cef785")));  // undecided yet
    CHECK_FALSE(detect_protocol({}));
  }
}
