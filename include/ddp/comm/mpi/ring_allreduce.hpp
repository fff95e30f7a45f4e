// mpi::RingAllreduce: the mpi backend's all-reduce for payloads above its carry limit, on MPI
// point-to-point calls (docs/decisions/0038; driven by comm/mpi/mpi_communicator.hpp).
// SPDX-License-Identifier: MIT
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include "ddp/comm/mpi/mpi_check.hpp"
#include "ddp/comm/reduce.hpp"
#include "ddp/comm/types.hpp"

namespace ddp::comm::mpi {

// All-reduce in place over point-to-point calls: a ring reduce-scatter (n-1 steps: send block
// (r-s), receive block (r-s-1) and reduce it into place) and a ring all-gather (n-1 steps: send
// block (r+1-s), receive block (r-s) straight into place). Blocks are count/n elements, the last
// one takes the rest. Every block's sum is formed once, by one chain of ranks, and then copied, so
// all ranks end bit-identical. A reduce-scatter block travels as kSegmentBytes segments received
// into two scratch slots in turn, so that each segment is reduced while it is still in cache and
// the next one is already on its way. Non-blocking: start() posts step 0, test() advances while
// steps complete. `scratch` (2 segments) is lent by a RingPool and handed back by release().
class RingAllreduce {
 public:
  static constexpr std::size_t kSegmentBytes = 1 << 20;

  RingAllreduce(BufferRef b, ReduceOp op, MPI_Comm comm, int rank, int size, int tag,
                std::vector<std::byte> scratch)
      : b_(b),
        op_(op),
        comm_(comm),
        rank_(rank),
        size_(size),
        tag_(tag),
        scratch_(std::move(scratch)),
        seg_(std::max<std::size_t>(1, kSegmentBytes / dtype_size(b.dtype))) {
    if (scratch_.size() < 2 * seg_ * elem()) scratch_.resize(2 * seg_ * elem());
  }
  RingAllreduce(const RingAllreduce&) = delete;
  RingAllreduce& operator=(const RingAllreduce&) = delete;

  int start() { return size_ == 1 ? MPI_SUCCESS : post(); }
  // MPI's return code; done is set once every step completed.
  int test(bool& done) {
    done = false;
    for (;;) {
      if (step_ == 2 * (size_ - 1)) {
        done = true;
        return MPI_SUCCESS;
      }
      int flag = 0;
      if (step_ < size_ - 1) {  // reduce-scatter: fold each received segment into place, in order
        const int rb = mod(rank_ - step_ - 1);
        while (reduced_ < nsegs(rb)) {
          if (const int rc = MPI_Test(&slot_req_[reduced_ % 2], &flag, MPI_STATUS_IGNORE);
              rc != MPI_SUCCESS || !flag)
            return rc;
          reduce_into(at(rb) + reduced_ * seg_ * elem(), slot(reduced_ % 2), seg_len(rb, reduced_),
                      b_.dtype, op_);
          if (reduced_ + 2 < nsegs(rb))
            if (const int rc = post_segment_recv(rb, reduced_ + 2); rc != MPI_SUCCESS) return rc;
          ++reduced_;
        }
        if (const int rc = MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &flag,
                                       MPI_STATUSES_IGNORE);
            rc != MPI_SUCCESS || !flag)
          return rc;
        if (step_ == size_ - 2 && op_ == ReduceOp::Avg)
          divide_by(at(rb), block_len(rb), b_.dtype, size_);
      } else if (const int rc = MPI_Testall(2, q_, &flag, MPI_STATUSES_IGNORE);
                 rc != MPI_SUCCESS || !flag) {
        return rc;
      }
      ++step_;
      if (step_ < 2 * (size_ - 1))
        if (const int rc = post(); rc != MPI_SUCCESS) return rc;
    }
  }
  bool in_flight() const {
    auto live = [](MPI_Request r) { return r != MPI_REQUEST_NULL; };
    return std::any_of(std::begin(q_), std::end(q_), live) ||
           std::any_of(std::begin(slot_req_), std::end(slot_req_), live) ||
           std::any_of(sends_.begin(), sends_.end(), live);
  }
  std::vector<std::byte> release() { return std::move(scratch_); }

 private:
  int mod(int x) const { return ((x % size_) + size_) % size_; }
  std::size_t elem() const { return dtype_size(b_.dtype); }
  std::size_t block_off(int blk) const {
    return b_.count / static_cast<std::size_t>(size_) * static_cast<std::size_t>(blk);
  }
  std::size_t block_len(int blk) const {
    return blk == size_ - 1 ? b_.count - block_off(blk)
                            : b_.count / static_cast<std::size_t>(size_);
  }
  std::byte* at(int blk) const { return b_.bytes_ptr() + block_off(blk) * elem(); }
  std::size_t nsegs(int blk) const { return (block_len(blk) + seg_ - 1) / seg_; }
  std::size_t seg_len(int blk, std::size_t k) const {
    return std::min(seg_, block_len(blk) - k * seg_);
  }
  std::byte* slot(std::size_t i) { return scratch_.data() + i * seg_ * elem(); }
  int post_segment_recv(int blk, std::size_t k) {
    return MPI_Irecv(slot(k % 2), static_cast<int>(seg_len(blk, k)), datatype_of(b_.dtype),
                     mod(rank_ - 1), tag_, comm_, &slot_req_[k % 2]);
  }
  int post() {
    const int next = mod(rank_ + 1), prev = mod(rank_ - 1);
    const MPI_Datatype t = datatype_of(b_.dtype);
    if (step_ < size_ - 1) {  // reduce-scatter: segments both ways
      const int sb = mod(rank_ - step_), rb = mod(rank_ - step_ - 1);
      reduced_ = 0;
      for (std::size_t k = 0; k < std::min<std::size_t>(2, nsegs(rb)); ++k)
        if (const int rc = post_segment_recv(rb, k); rc != MPI_SUCCESS) return rc;
      sends_.assign(nsegs(sb), MPI_REQUEST_NULL);
      for (std::size_t k = 0; k < sends_.size(); ++k)
        if (const int rc = MPI_Isend(at(sb) + k * seg_ * elem(), static_cast<int>(seg_len(sb, k)),
                                     t, next, tag_, comm_, &sends_[k]);
            rc != MPI_SUCCESS)
          return rc;
      return MPI_SUCCESS;
    }
    const int s = step_ - (size_ - 1);
    const int sb = mod(rank_ + 1 - s), rb = mod(rank_ - s);
    if (const int rc =
            MPI_Irecv(at(rb), static_cast<int>(block_len(rb)), t, prev, tag_, comm_, &q_[0]);
        rc != MPI_SUCCESS)
      return rc;
    return MPI_Isend(at(sb), static_cast<int>(block_len(sb)), t, next, tag_, comm_, &q_[1]);
  }

  BufferRef b_;
  ReduceOp op_;
  MPI_Comm comm_;
  int rank_, size_, tag_;
  std::vector<std::byte> scratch_;
  std::size_t seg_;  // elements per reduce-scatter segment
  int step_ = 0;
  std::size_t reduced_ = 0;  // segments of this reduce-scatter step folded in
  MPI_Request slot_req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::vector<MPI_Request> sends_;
  MPI_Request q_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // all-gather: receive, send
};

// Makes the rings of one communicator and keeps their scratch for the next one, so that an
// all-reduce allocates nothing once the first ring ran. Used by one thread at a time (the thread
// running ops).
class RingPool {
 public:
  // A ring over `comm` (the protocol communicator) for the op numbered seq: its messages carry tag
  // 1 + seq % 30000 (MPI guarantees tags up to 32767; 0 is the fingerprints'), so that rings in
  // flight together never meet.
  std::unique_ptr<RingAllreduce> make(BufferRef b, ReduceOp op, MPI_Comm comm, int rank, int size,
                                      std::uint64_t seq) {
    std::vector<std::byte> scratch;
    if (!scratch_.empty()) {
      scratch = std::move(scratch_.back());
      scratch_.pop_back();
    }
    return std::make_unique<RingAllreduce>(b, op, comm, rank, size,
                                           1 + static_cast<int>(seq % 30000), std::move(scratch));
  }
  // Takes a ring back (null: nothing). A finished ring's scratch is reused; a ring that MPI may
  // still write (a failed op's requests stay pending, MPI cannot cancel them) is kept alive until
  // the process ends.
  void retire(std::unique_ptr<RingAllreduce>& ring) {
    if (!ring) return;
    if (ring->in_flight())
      graveyard_.push_back(std::move(ring));
    else
      scratch_.push_back(ring->release());
    ring.reset();
  }

 private:
  std::vector<std::vector<std::byte>> scratch_;
  std::vector<std::unique_ptr<RingAllreduce>> graveyard_;
};

}  // namespace ddp::comm::mpi
