// How the mpi backend puts a Fingerprint on the wire: four 64-bit words (kind|dtype|op, root, count, seq),
// the 32 bytes every rank sends every other before a collective (comm/mpi/mpi_communicator.hpp, D9).
// SPDX-License-Identifier: MIT
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddp/comm/types.hpp"

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

}  // namespace ddp::comm::mpi
