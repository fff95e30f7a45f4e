// How the mpi backend puts a Fingerprint on the wire: four 64-bit words (kind|dtype|op, root,
// count, seq), the 32 bytes every rank sends every other before a collective
// (comm/mpi/mpi_communicator.hpp, docs/decisions/0009), and the message when they differ.
// SPDX-License-Identifier: MIT
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::mpi {

inline constexpr std::size_t kFingerprintWords = 4;

inline void pack_fingerprint(const Fingerprint& f, std::uint64_t* w) {
  w[0] = static_cast<std::uint64_t>(f.kind) | static_cast<std::uint64_t>(f.dtype) << 8 |
         static_cast<std::uint64_t>(f.op) << 16;
  w[1] = static_cast<std::uint64_t>(f.root);
  w[2] = f.count;
  w[3] = f.seq;
}

inline Fingerprint unpack_fingerprint(const std::uint64_t* w) {
  return {.kind = static_cast<OpKind>(w[0] & 0xff),
          .dtype = static_cast<DType>((w[0] >> 8) & 0xff),
          .op = static_cast<ReduceOp>((w[0] >> 16) & 0xff),
          .root = static_cast<std::int64_t>(w[1]),
          .count = w[2],
          .seq = w[3]};
}

// The message every rank raises when the fingerprints exchanged for one collective differ, or empty
// when every rank's equals `mine`. bytes_of(r) points at rank r's packed fingerprint (this rank's
// too), any alignment. It names the first rank whose op differs from this rank's and, when several
// differ, which.
template <class BytesOf>
std::string mismatch_message(int rank, int size, const Fingerprint& mine, BytesOf bytes_of) {
  std::uint64_t mine_words[kFingerprintWords], first[kFingerprintWords] = {};
  pack_fingerprint(mine, mine_words);
  std::vector<int> differ;
  for (int r = 0; r < size; ++r) {
    std::uint64_t w[kFingerprintWords];
    std::memcpy(w, bytes_of(r), sizeof w);
    if (std::memcmp(w, mine_words, sizeof w) == 0) continue;
    if (differ.empty()) std::memcpy(first, w, sizeof w);
    differ.push_back(r);
  }
  if (differ.empty()) return {};
  std::string msg = ddp::detail::str(who(rank, size), ": ", mine.full_label(),
                                     " does not match rank ", differ.front(), ", which ran ",
                                     unpack_fingerprint(first).full_label(), " at this point");
  if (differ.size() > 1)
    msg += ddp::detail::str(" (", differ.size(), " of ", size,
                            " ranks differ from this one: ", ddp::detail::join(differ, ", "), ")");
  return msg +
         ". Every rank must call the same collectives in the same order with the same dtype, "
         "count, root "
         "and op.";
}

}  // namespace ddp::comm::mpi
