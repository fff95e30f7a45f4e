// libFuzzer target: the TCPStore request parser (store/wire.hpp), the code that reads bytes from the network.
// SPDX-License-Identifier: MIT
//
// Input: byte 0 picks the protocol (even: 1.x, odd: 2.x), the rest is what a client sent. Besides "no
// crash, no UB, no leak" (ASan/UBSan) it checks the parser's contract:
//   - Complete: re-encoding the request reproduces exactly the consumed bytes (the format is canonical);
//   - NeedMore: the size it asks for is larger than what it had;
//   - every request in the stream is consumed in order, as the server does.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <ddp/store/wire.hpp>
#include <span>

namespace wire = ddp::store::wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto proto = (data[0] & 1) ? wire::Protocol::V2 : wire::Protocol::V1;
  std::span<const std::uint8_t> rest(data + 1, size - 1);
  (void)wire::detect_protocol(rest);
  // Small limits so the fuzzer reaches the "too large" paths with short inputs.
  const wire::Limits limits{.max_key_bytes = 64, .max_value_bytes = 256, .max_keys = 8};
  for (int guard = 0; guard < 1000 && !rest.empty(); ++guard) {
    auto r = wire::parse_request(rest, proto, limits);
    if (r.status == wire::ParseStatus::NeedMore) {
      if (r.need <= rest.size()) std::abort();
      break;
    }
    if (r.status == wire::ParseStatus::Error) {
      if (r.error.empty()) std::abort();
      break;
    }
    if (r.consumed == 0 || r.consumed > rest.size()) std::abort();
    auto again = wire::encode_request(r.request, proto);
    if (again.size() != r.consumed || !std::equal(again.begin(), again.end(), rest.begin())) std::abort();
    rest = rest.subspan(r.consumed);
  }
  return 0;
}
