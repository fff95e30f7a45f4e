// mpi::FingerprintExchange: one collective's fingerprint exchange on the mpi backend
// (docs/decisions/0009, 0038): this rank's 32-byte fingerprint to every peer and theirs back, and
// for a small all-reduce its data in the same exchange ("carried"). Driven by
// comm/mpi/mpi_communicator.hpp, which owns the ordering and timeouts.
// SPDX-License-Identifier: MIT
//
// Per peer, message 0 is the fingerprint and the first kCarryBytes of carried data; the rest
// follows at once as messages 1.. of at most kCarryBytes, sent from the caller's buffer, all on
// tag 0 (MPI keeps their order between two ranks: message k lands in slot k). Each message stays
// under Open MPI's shared-memory eager limit (4 KiB with MPI's header): about one eager latency.
// Every receive is kMsgCap bytes, so a peer running another op never truncates one.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/mpi/fingerprint_words.hpp"
#include "ddp/comm/reduce.hpp"
#include "ddp/comm/types.hpp"

namespace ddp::comm::mpi {

inline constexpr std::size_t kFingerprintBytes = kFingerprintWords * sizeof(std::uint64_t);
// Bytes per message: with the fingerprint and MPI's header under the 4 KiB eager limit (above it a
// rendezvous: one 4 KiB message 5.2 us, as a ring 1.3 us). A multiple of every dtype's size.
inline constexpr std::size_t kCarryBytes = 4096 - 128;
// An all-reduce is carried when the (size - 1) copies a rank receives fit here
// (docs/decisions/0038: 2 ranks, 16 KiB 7.7-9.7 us carried vs 14.6-17.3 us as a ring; 128 KiB
// slower carried).
inline constexpr std::size_t kCarryMaxBytes = 64 << 10;
// the largest exchange message
inline constexpr std::size_t kMsgCap = kFingerprintBytes + kCarryBytes;

// Whether an all-reduce travels with its fingerprint (a one-message payload always does).
inline bool carries(std::size_t bytes, int size) {
  return bytes <= kCarryBytes ||
         bytes * static_cast<std::size_t>(std::max(1, size - 1)) <= kCarryMaxBytes;
}
// Messages sent to each peer for op `fp`: one, or one per kCarryBytes of a carried all-reduce.
inline std::size_t messages_of(const Fingerprint& fp, int size) {
  const std::size_t bytes = fp.kind == OpKind::AllReduce ? fp.count * dtype_size(fp.dtype) : 0;
  return bytes > kCarryBytes && carries(bytes, size) ? (bytes + kCarryBytes - 1) / kCarryBytes : 1;
}

// Receive buffers, reused: a 64 KiB all-reduce needs 136 KB at 2 ranks, which glibc would map and
// unmap (page faults included) per op. Not thread-safe: one thread at a time runs ops.
class ExchangePool {
 public:
  // A buffer of at least `bytes` (the smallest that fits), else a new one; `cap` gets its capacity.
  std::unique_ptr<std::byte[]> take(std::size_t bytes, std::size_t& cap) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->first >= bytes && (best == free_.end() || it->first < best->first)) best = it;
    if (best == free_.end()) {
      cap = bytes;
      return std::unique_ptr<std::byte[]>(new std::byte[bytes]);
    }
    cap = best->first;
    auto b = std::move(best->second);
    free_.erase(best);
    return b;
  }
  // A full pool drops its smallest buffer.
  void give(std::unique_ptr<std::byte[]> b, std::size_t cap) {
    if (!b) return;
    free_.emplace_back(cap, std::move(b));
    if (free_.size() > kKeep)
      free_.erase(std::min_element(free_.begin(), free_.end(),
                                   [](const auto& a, const auto& c) { return a.first < c.first; }));
  }

 private:
  static constexpr std::size_t kKeep = 4;
  std::vector<std::pair<std::size_t, std::unique_ptr<std::byte[]>>> free_;
};

class FingerprintExchange {
 public:
  // Posts the exchange of `fp` (and `carry`'s data when carry.count > 0) with every other rank.
  // Returns MPI's code; on failure some requests may be in flight (pending()).
  int start(const Fingerprint& fp, BufferRef carry, MPI_Comm comm, int rank, int size,
            ExchangePool& pool) {
    carry_ = carry;
    rank_ = rank;
    size_ = size;
    comm_ = comm;
    chunks_ = carry.count ? messages_of(fp, size) : 1;
    std::uint64_t words[kFingerprintWords];
    pack_fingerprint(fp, words);
    const std::size_t first = carry.count ? chunk_bytes(0) : 0;
    out_.resize(kFingerprintBytes + first);
    std::memcpy(out_.data(), words, kFingerprintBytes);
    if (first) std::memcpy(out_.data() + kFingerprintBytes, carry.data, first);
    if (size == 1) return MPI_SUCCESS;  // nothing to exchange: complete at once
    in_ = pool.take(kMsgCap * chunks_ * static_cast<std::size_t>(size), in_cap_);
    reqs_.assign(2 * peers() * chunks_, MPI_REQUEST_NULL);
    int rc = MPI_SUCCESS;
    for (int r = 0; r < size && rc == MPI_SUCCESS; ++r)
      for (std::size_t k = 0; r != rank && k < chunks_ && rc == MPI_SUCCESS; ++k)
        rc = MPI_Irecv(slot(r, k), static_cast<int>(kMsgCap), MPI_BYTE, r, 0, comm,
                       &reqs_[recv_index(r, k)]);
    for (int r = 0; r < size && rc == MPI_SUCCESS; ++r)
      for (std::size_t k = 0; r != rank && k < chunks_ && rc == MPI_SUCCESS; ++k)
        rc = k == 0
                 ? MPI_Isend(out_.data(), static_cast<int>(out_.size()), MPI_BYTE, r, 0, comm,
                             &reqs_[send_index(r, k)])
                 : MPI_Isend(carry.bytes_ptr() + k * kCarryBytes, static_cast<int>(chunk_bytes(k)),
                             MPI_BYTE, r, 0, comm, &reqs_[send_index(r, k)]);
    return rc;
  }

  // Every peer's fingerprint message alone: reports a mismatch even when a peer's op sends fewer
  // messages than this one waits for.
  int test_fingerprints(int& done) { return test(reqs_.empty() ? 0 : peers(), done); }
  // The whole exchange (carried data, and this rank's sends).
  int test_all(int& done) { return test(reqs_.size(), done); }
  bool pending() const {
    return std::any_of(reqs_.begin(), reqs_.end(),
                       [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  }

  // After test_fingerprints: empty when every rank's fingerprint equals `mine`, else the message
  // every rank raises (mismatch_message; seq is included, so a rank that skipped an op is seen).
  std::string mismatch(const Fingerprint& mine) const {
    return mismatch_message(rank_, size_, mine,
                            [&](int r) { return r == rank_ ? out_.data() : slot(r, 0); });
  }

  // After the exchange: every rank reduces all copies in rank order, chunk by chunk (the same chain
  // everywhere: bit-identical results), then divides for Avg.
  void reduce(ReduceOp op) const {
    const BufferRef& b = carry_;
    const std::size_t elem = dtype_size(b.dtype);
    // this rank's chunk k >= 1, before its place is overwritten
    alignas(64) std::byte mine[kCarryBytes];
    for (std::size_t k = 0; size_ > 1 && k < chunks_; ++k) {
      const std::size_t n = chunk_bytes(k);
      std::byte* dst = b.bytes_ptr() + k * kCarryBytes;
      if (k > 0 && rank_ != 0) std::memcpy(mine, dst, n);
      auto data_of = [&](int r) -> const std::byte* {
        if (r != rank_) return slot(r, k) + (k == 0 ? kFingerprintBytes : 0);
        return k == 0 ? out_.data() + kFingerprintBytes : rank_ == 0 ? dst : mine;
      };
      if (rank_ != 0) std::memcpy(dst, data_of(0), n);
      for (int r = 1; r < size_; ++r) reduce_into(dst, data_of(r), n / elem, b.dtype, op);
    }
    if (op == ReduceOp::Avg) divide_by(b.data, b.count, b.dtype, size_);
  }

  // After a mismatch every message must still be matched: a leftover would meet a later
  // communicator's receive (MPICH reuses context ids), and a pending request ends the process with
  // MPI_Abort. Each peer's fingerprint says how many messages it sent (messages_of): receives
  // beyond those are cancelled, messages beyond ours are received and dropped; every peer does the
  // same, so the sends complete. Waits until `deadline` at most; whatever is still pending() must
  // be kept alive by the caller. `carrying`: whether this communicator carries all-reduces at all
  // (not in shared memory, where the exchange is the fingerprint alone).
  void drain(std::chrono::steady_clock::time_point deadline, bool carrying) {
    if (reqs_.empty()) return;
    std::vector<std::pair<int, std::size_t>> surplus;  // (peer, messages beyond this op's receives)
    std::size_t sink_slots = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      std::uint64_t w[kFingerprintWords];
      std::memcpy(w, slot(r, 0), sizeof w);
      const std::size_t theirs = carrying ? messages_of(unpack_fingerprint(w), size_) : 1;
      for (std::size_t k = theirs; k < chunks_; ++k)
        if (MPI_Request& q = reqs_[recv_index(r, k)]; q != MPI_REQUEST_NULL) {
          MPI_Cancel(&q);
          MPI_Wait(&q, MPI_STATUS_IGNORE);
        }
      if (theirs > chunks_) {
        surplus.emplace_back(r, theirs - chunks_);
        sink_slots += theirs - chunks_;
      }
    }
    if (sink_slots) sink_.reset(new std::byte[kMsgCap * sink_slots]);
    std::size_t used = 0;
    for (const auto& [r, n] : surplus)
      for (std::size_t i = 0; i < n; ++i, ++used) {
        reqs_.push_back(MPI_REQUEST_NULL);
        if (MPI_Irecv(sink_.get() + kMsgCap * used, static_cast<int>(kMsgCap), MPI_BYTE, r, 0,
                      comm_, &reqs_.back()) != MPI_SUCCESS)
          break;
      }
    for (int done = 0; !done && std::chrono::steady_clock::now() < deadline;) {
      if (MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE) !=
          MPI_SUCCESS)
        break;
      if (!done) std::this_thread::yield();
    }
  }

  // Only once the exchange completed (nothing can write into the buffer any more).
  void release(ExchangePool& pool) { pool.give(std::move(in_), in_cap_); }

 private:
  std::size_t peers() const { return static_cast<std::size_t>(size_ - 1); }
  std::size_t peer_index(int r) const { return static_cast<std::size_t>(r < rank_ ? r : r - 1); }
  // reqs_: every peer's message-0 receive, then the other receives, then the sends.
  std::size_t recv_index(int r, std::size_t k) const {
    return k == 0 ? peer_index(r) : peers() + peer_index(r) * (chunks_ - 1) + (k - 1);
  }
  std::size_t send_index(int r, std::size_t k) const {
    return peers() * chunks_ + peer_index(r) * chunks_ + k;
  }
  // where rank r's message k is received (r != rank_)
  std::byte* slot(int r, std::size_t k) const {
    return in_.get() + kMsgCap * (static_cast<std::size_t>(r) * chunks_ + k);
  }
  std::size_t chunk_bytes(std::size_t k) const {
    return std::min(kCarryBytes, carry_.bytes() - k * kCarryBytes);
  }
  int test(std::size_t n, int& done) {
    done = 1;
    if (n == 0) return MPI_SUCCESS;
    return MPI_Testall(static_cast<int>(n), reqs_.data(), &done, MPI_STATUSES_IGNORE);
  }

  BufferRef carry_;
  int rank_ = 0, size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::size_t chunks_ = 1;
  std::vector<MPI_Request> reqs_;
  std::vector<std::byte> out_;  // my fingerprint, then the first chunk of carried data
  // chunks_ slots of kMsgCap bytes per rank (this rank's unused)
  std::unique_ptr<std::byte[]> in_;
  std::size_t in_cap_ = 0;
  std::unique_ptr<std::byte[]> sink_;  // drain's receives of a peer's surplus messages
};

}  // namespace ddp::comm::mpi
