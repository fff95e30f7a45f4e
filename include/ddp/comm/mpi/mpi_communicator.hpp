// MpiCommunicator: the mpi backend. Rank and size come from MPI itself; every op is non-blocking
// MPI (MPI_Isend/MPI_Irecv, MPI_Ibcast, ...), run in issue order, after a fingerprint check, by
// mpi/op_engine.hpp.
// SPDX-License-Identifier: MIT
//
// All-reduce is ours, on MPI point-to-point calls (why: docs/decisions/0038): a payload whose
// (size - 1) copies fit in mpi::kCarryMaxBytes rides with the fingerprint exchange (each rank
// reduces every rank's copy in rank order); a larger one runs a ring through a reused scratch.
// With every rank on one host (and CommOptions::shm), all-reduce, broadcast and barrier go through
// the tcp backend's shared-memory collectives instead (docs/decisions/0055). Every dtype and op
// reduces through comm/reduce.hpp, as on the tcp backend; Avg divides each rank's own block once,
// before the all-gather. The other collectives use MPI's non-blocking calls with MPI's built-in
// ops (Avg = MPI_SUM, then a division); bfloat16 and half travel as 16-bit words and reduce
// through MPI_Op_create'd ops that widen to float; uint8 through our op too, so sums wrap modulo
// 256 as in PyTorch.
// Failure: MPI cannot cancel a collective, so an op that times out breaks the communicator
// (MPI_Abort at exit). mpirun kills the job when a rank dies.
// Fingerprints (docs/decisions/0009): MPI matches collectives by posting order only. Before each
// collective every rank sends its 32-byte fingerprint (kind|dtype|op, root, count, seq) to every
// other rank on proto_comm_ (receives sized for the largest message any op sends, so a mismatch
// never truncates) and compares them: a difference fails the op on every rank with the same
// message, before any data moves (about 1 us on one host; CommOptions::check_fingerprints = false
// skips it except for carried all-reduces). Send/recv are matched by tag and not checked. Ring
// messages use proto_comm_ with tag 1 + seq % 30000 (mpi::RingPool), so that concurrent rings and
// the user's send/recv tags on comm_ never meet.
#pragma once

#include <mpi.h>

#include <memory>
#include <string_view>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/mpi/mpi_check.hpp"
#include "ddp/comm/mpi/op_engine.hpp"
#include "ddp/comm/mpi/reduce_ops.hpp"
#include "ddp/comm/mpi/runtime.hpp"
#include "ddp/comm/reduce.hpp"
#include "ddp/comm/shm/collectives.hpp"
#include "ddp/comm/shm/segment.hpp"

namespace ddp::comm {

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over MPI_COMM_WORLD (duplicated, so our traffic never meets the application's).
  explicit MpiCommunicator(const CommOptions& opts = {}) : MpiCommunicator(dup_world(), opts) {}

  ~MpiCommunicator() override {
    engine_->stop();
    // a request may still be pending on them (and on the engine's buffers)
    if (engine_->broken()) return;
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    if (proto_comm_ != MPI_COMM_NULL) MPI_Comm_free(&proto_comm_);
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view backend() const noexcept override { return "mpi"; }
  MemoryKind memory() const noexcept override { return MemoryKind::Cpu; }
  // Whether all-reduce, broadcast and barrier go through shared memory.
  bool uses_shm() const noexcept { return engine_->uses_shm(); }

 protected:
  Work send_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, dst = c.peer, tag = c.fp.root] {
      MPI_Request req;
      DDP_MPI_CHECK(
          MPI_Isend(b.data, count_of(b), mpi::datatype_of(b.dtype), dst, tag_of(tag), comm_, &req));
      return Pending{req, {}};
    });
  }
  Work recv_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, src = c.peer, tag = c.fp.root] {
      MPI_Request req;
      DDP_MPI_CHECK(
          MPI_Irecv(b.data, count_of(b), mpi::datatype_of(b.dtype), src, tag_of(tag), comm_, &req));
      return Pending{req, {}};
    });
  }
  Work broadcast_impl(const OpCall& c) override {
    if (uses_shm()) return submit(c, {}, Route::Shm);
    return submit(c, [this, b = c.in, root = static_cast<int>(c.fp.root)] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Ibcast(b.data, count_of(b), mpi::datatype_of(b.dtype), root, comm_, &req));
      return Pending{req, {}};
    });
  }
  // One host: shared memory (run_shm). Else small: carried in the fingerprint exchange
  // (FingerprintExchange::reduce); large: a RingAllreduce on proto_comm_.
  Work all_reduce_impl(const OpCall& c) override {
    if (uses_shm()) return submit(c, {}, Route::Shm);
    return submit(c, {}, mpi::carries(c.in.bytes(), size_) ? Route::Carried : Route::Ring);
  }
  Work reduce_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, op = c.fp.op, root = static_cast<int>(c.fp.root)] {
      MPI_Request req;
      const bool me = rank_ == root;
      DDP_MPI_CHECK(MPI_Ireduce(me ? MPI_IN_PLACE : b.data, me ? b.data : nullptr, count_of(b),
                                mpi::datatype_of(b.dtype), ops_.of(b.dtype, op), root, comm_,
                                &req));
      return Pending{req, [this, b, op, me] {
                       if (me && op == ReduceOp::Avg) divide_by(b.data, b.count, b.dtype, size_);
                     }};
    });
  }
  Work all_gather_impl(const OpCall& c) override {
    return submit(c, [this, in = c.in, out = c.out] {
      MPI_Request req;
      const MPI_Datatype t = mpi::datatype_of(in.dtype);
      DDP_MPI_CHECK(
          MPI_Iallgather(in.data, count_of(in), t, out.data, count_of(in), t, comm_, &req));
      return Pending{req, {}};
    });
  }
  Work reduce_scatter_impl(const OpCall& c) override {
    return submit(c, [this, in = c.in, out = c.out, op = c.fp.op] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Ireduce_scatter_block(in.data, out.data, count_of(out),
                                              mpi::datatype_of(in.dtype), ops_.of(in.dtype, op),
                                              comm_, &req));
      return Pending{req, [this, out, op] {
                       if (op == ReduceOp::Avg) divide_by(out.data, out.count, out.dtype, size_);
                     }};
    });
  }
  Work all_to_all_impl(const OpCall& c) override {
    return submit(c, [this, in = c.in, out = c.out] {
      MPI_Request req;
      const MPI_Datatype t = mpi::datatype_of(in.dtype);
      const int block = static_cast<int>(in.count / static_cast<std::size_t>(size_));
      DDP_MPI_CHECK(MPI_Ialltoall(in.data, block, t, out.data, block, t, comm_, &req));
      return Pending{req, {}};
    });
  }
  Work barrier_impl(const OpCall& c) override {
    if (uses_shm()) return submit(c, {}, Route::Shm);
    return submit(c, [this] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Ibarrier(comm_, &req));
      return Pending{req, {}};
    });
  }

  std::unique_ptr<Communicator> new_group_impl(const std::vector<int>&, int index) override {
    MPI_Comm sub = MPI_COMM_NULL;
    // MPI_Comm_split is collective: it runs in op order like any other op, under a barrier's
    // fingerprint. Key rank_: the group's ranks keep this communicator's order, as `ranks` does.
    submit(OpCall{.fp = {.kind = OpKind::Barrier, .dtype = DType::U8, .op = ReduceOp::Max}}, [&] {
      DDP_MPI_CHECK(MPI_Comm_split(comm_, index >= 0 ? 0 : MPI_UNDEFINED, rank_, &sub));
      return Pending{};
    }).wait();
    if (index < 0) return nullptr;
    return std::unique_ptr<Communicator>(new MpiCommunicator(sub, opts_));
  }

 private:
  using Route = mpi::Route;
  using Pending = mpi::Pending;

  static MPI_Comm dup_world() {
    mpi::Runtime::instance();
    MPI_Comm c;
    DDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c));
    return c;
  }

  MpiCommunicator(MPI_Comm comm, const CommOptions& opts) : comm_(comm), opts_(opts) {
    DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    check_setup(rank_, size_, opts_);
    DDP_MPI_CHECK(MPI_Comm_dup(comm_, &proto_comm_));
    DDP_MPI_CHECK(MPI_Comm_set_errhandler(proto_comm_, MPI_ERRORS_RETURN));
    std::unique_ptr<shm::Collectives> shm;
    // collective: every rank takes part, even with shm off
    if (size_ > 1 && size_ <= shm::kMaxRanks) {
      // shm::Segment's setup exchange (blocking: in the constructor, before any op).
      auto gather = [c = comm_](const std::string&, const std::string& mine) {
        return mpi::all_gather_strings(c, mine);
      };
      auto seg = shm::Segment::create(gather, rank_, size_, opts_.shm,
                                      shm::Collectives::segment_bytes(size_), "MPI point-to-point");
      if (seg)
        shm = std::make_unique<shm::Collectives>(std::move(seg), rank_, size_,
                                                 opts_.small_allreduce_bytes);
    }
    engine_ = std::make_unique<mpi::OpEngine>(proto_comm_, rank_, size_, opts_, std::move(shm));
  }

  Work submit(const OpCall& c, mpi::Body body, Route route = Route::Body) {
    return engine_->submit(c, std::move(body), route);
  }

  static int count_of(const BufferRef& b) { return static_cast<int>(b.count); }
  // MPI guarantees tags < 32768
  static int tag_of(std::int64_t tag) { return static_cast<int>(tag & 0x7fff); }

  MPI_Comm comm_ = MPI_COMM_NULL;
  CommOptions opts_;
  int rank_ = 0, size_ = 1;
  mpi::ReduceOps ops_;  // MPI's reductions (reduce, reduce_scatter) per dtype and op
  MPI_Comm proto_comm_ = MPI_COMM_NULL;    // fingerprints and rings (see the file comment)
  std::unique_ptr<mpi::OpEngine> engine_;  // runs every op (set once the communicators exist)
};

}  // namespace ddp::comm
