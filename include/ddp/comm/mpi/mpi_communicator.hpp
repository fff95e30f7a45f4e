// MpiCommunicator: the mpi backend. Rank and size come from MPI itself; every op is non-blocking MPI
// (MPI_Isend/MPI_Irecv, MPI_Ibcast, ...), tested against the op's deadline by whichever thread runs it:
// the calling thread for a small (or AllreduceOptions::blocking) collective issued while nothing else is
// pending, else a progress thread, which a thread waiting for the only outstanding collective, still queued,
// replaces (run_if_next).
// SPDX-License-Identifier: MIT
//
// MPI runtime (mpi/runtime.hpp): MPI_THREAD_SERIALIZED suffices, since one thread at a time runs ops (the
// caller or the progress thread, handed over under the queue's lock).
// All-reduce is ours, on MPI point-to-point calls (docs/ARCHITECTURE.md D38): Open MPI's MPI_Iallreduce
// (libnbc) takes a binomial tree below 4 ranks and mallocs a full-size temporary per call, which ran at
// 0.4x the busbw of its own blocking MPI_Allreduce. Ours: a payload whose (size - 1) copies fit in
// mpi::kCarryMaxBytes rides with the fingerprint (mpi/fingerprint_exchange.hpp: one exchange of eager
// messages; each rank reduces every rank's copy in rank order); a larger one runs mpi/ring_allreduce.hpp's
// ring through a reused scratch. When every rank runs on one host (and CommOptions::shm), every all-reduce,
// broadcast and barrier goes through shared memory instead (comm/shm/collectives.hpp, D55): the tcp backend's
// shm collectives (its all-reduce is 1.1-3x Open MPI's own on one host); each runs alone (after every earlier op completed), and each
// collective announces itself in the segment, so that a peer waiting there sees a mismatch at once
// (mpi/shm_watch.hpp) and reports it through the fingerprint exchange like any other.
// Every dtype and op reduces through comm/reduce.hpp, as on the tcp backend; Avg divides each rank's own
// block once, before the all-gather. The other collectives use MPI's non-blocking calls: float, double
// and the integers with MPI's built-in ops (Avg = MPI_SUM, then a division); bfloat16 and half travel as
// 16-bit words and reduce through MPI_Op_create'd ops that widen to float; uint8 reduces through our op
// too, so that sums wrap modulo 256 as on the tcp backend (and in PyTorch).
// Failure: MPI cannot cancel a collective, so an op that times out breaks the communicator; the process
// then ends with MPI_Abort at exit instead of hanging in MPI_Finalize, which makes mpirun stop every rank
// (docs/ARCHITECTURE.md D9). A rank that dies is handled by mpirun itself (it kills the job).
// Fingerprints (docs/ARCHITECTURE.md D9): MPI matches collectives by posting order only, so rank 0's
// all_reduce and rank 1's broadcast would meet and give garbage or hang. Before each collective's own
// call, every rank sends its 32-byte fingerprint (kind|dtype|op, root, count, seq) to every other rank on
// a second communicator (proto_comm_, point-to-point, receives sized for the largest message any op
// sends, so that a mismatch never truncates), and compares all of them: a difference fails the op on
// every rank with the same message, before any data moves. Cost (D38): one small message exchange per
// collective, about 1 us on one host, and for a carried all-reduce nothing, since its data travels in
// the same exchange; CommOptions::check_fingerprints = false skips the comparison (and
// the exchange, except for carried all-reduces). Send/recv are matched by tag and are not checked.
// Ordering: fingerprints go out on proto_comm_ in issue order; bodies go out in issue order too, each
// only after its fingerprint matched and every earlier op's body was posted, so all ranks post every
// communicator's calls in the same order. Ring messages use proto_comm_ with tag 1 + seq % 30000, so
// that rings in flight together and the user's send/recv tags on comm_ never meet.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <climits>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/mpi/fingerprint_exchange.hpp"
#include "ddp/comm/mpi/mpi_check.hpp"
#include "ddp/comm/mpi/reduce_ops.hpp"
#include "ddp/comm/mpi/ring_allreduce.hpp"
#include "ddp/comm/mpi/runtime.hpp"
#include "ddp/comm/mpi/shm_watch.hpp"
#include "ddp/comm/reduce.hpp"
#include "ddp/comm/shm/collectives.hpp"
#include "ddp/comm/shm/segment.hpp"
#include "ddp/core/cpu_affinity.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"

namespace ddp::comm {

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over MPI_COMM_WORLD (duplicated, so our traffic never meets the application's).
  explicit MpiCommunicator(const CommOptions& opts = {}) : MpiCommunicator(dup_world(), opts) {}

  ~MpiCommunicator() override {
    stop_progress();
    if (broken_) return;  // a request may still be pending on them (and on graveyard_'s buffers)
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    if (proto_comm_ != MPI_COMM_NULL) MPI_Comm_free(&proto_comm_);
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view backend() const noexcept override { return "mpi"; }
  MemoryKind memory() const noexcept override { return MemoryKind::Cpu; }
  // True when all-reduce, broadcast and barrier go through shared memory (every rank on this host, CommOptions::shm).
  bool uses_shm() const noexcept { return shm_ != nullptr; }

 protected:
  Work send_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, dst = c.peer, tag = c.fp.root] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Isend(b.data, count_of(b), mpi::datatype_of(b.dtype), dst, tag_of(tag), comm_, &req));
      return Pending{req, {}};
    });
  }
  Work recv_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, src = c.peer, tag = c.fp.root] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Irecv(b.data, count_of(b), mpi::datatype_of(b.dtype), src, tag_of(tag), comm_, &req));
      return Pending{req, {}};
    });
  }
  Work broadcast_impl(const OpCall& c) override {
    if (shm_) return submit(c, {}, Route::Shm);
    return submit(c, [this, b = c.in, root = static_cast<int>(c.fp.root)] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Ibcast(b.data, count_of(b), mpi::datatype_of(b.dtype), root, comm_, &req));
      return Pending{req, {}};
    });
  }
  // One host: shared memory (run_shm). Else small: carried in the fingerprint exchange
  // (FingerprintExchange::reduce); large: RingAllreduce on proto_comm_.
  Work all_reduce_impl(const OpCall& c) override {
    if (shm_) return submit(c, {}, Route::Shm);
    if (mpi::carries(c.in.bytes(), size_)) return submit(c, {}, Route::Carried);
    return submit(c, [this, b = c.in, op = c.fp.op] {
      // Tag by the op's number (set by submit, so read at posting time): rings in flight together never meet.
      Pending p;
      p.ring = std::make_unique<mpi::RingAllreduce>(b, op, proto_comm_, rank_, size_,
                                                    1 + static_cast<int>(posting_seq_ % 30000), take_scratch());
      if (const int rc = p.ring->start(); rc != MPI_SUCCESS) {
        bury(p);
        throw CommError(mpi::error_text(rc));
      }
      return p;
    });
  }
  Work reduce_impl(const OpCall& c) override {
    return submit(c, [this, b = c.in, op = c.fp.op, root = static_cast<int>(c.fp.root)] {
      MPI_Request req;
      const bool me = rank_ == root;
      DDP_MPI_CHECK(MPI_Ireduce(me ? MPI_IN_PLACE : b.data, me ? b.data : nullptr, count_of(b),
                                mpi::datatype_of(b.dtype), ops_.of(b.dtype, op), root, comm_, &req));
      return Pending{req, [this, b, op, me] {
                       if (me && op == ReduceOp::Avg) divide_by(b.data, b.count, b.dtype, size_);
                     }};
    });
  }
  Work all_gather_impl(const OpCall& c) override {
    return submit(c, [this, in = c.in, out = c.out] {
      MPI_Request req;
      const MPI_Datatype t = mpi::datatype_of(in.dtype);
      DDP_MPI_CHECK(MPI_Iallgather(in.data, count_of(in), t, out.data, count_of(in), t, comm_, &req));
      return Pending{req, {}};
    });
  }
  Work reduce_scatter_impl(const OpCall& c) override {
    return submit(c, [this, in = c.in, out = c.out, op = c.fp.op] {
      MPI_Request req;
      DDP_MPI_CHECK(MPI_Ireduce_scatter_block(in.data, out.data, count_of(out), mpi::datatype_of(in.dtype),
                                              ops_.of(in.dtype, op), comm_, &req));
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
    if (shm_) return submit(c, {}, Route::Shm);
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
  using Clock = std::chrono::steady_clock;
  // A started op: its request (or ring) and what to do once it completes (the Avg division).
  struct Pending {
    MPI_Request req = MPI_REQUEST_NULL;
    std::function<void()> after;
    std::unique_ptr<mpi::RingAllreduce> ring;
  };
  using Body = std::function<Pending()>;  // posts the non-blocking call
  // How a task runs: its Body after the fingerprint exchange; an all-reduce carried in the exchange; an
  // all-reduce, broadcast or barrier through shared memory (run_shm).
  enum class Route : std::uint8_t { Body, Carried, Shm };
  // Where a task is: its fingerprint exchange in flight, matched and waiting for earlier bodies to be
  // posted, or its own MPI call posted.
  enum class Stage : std::uint8_t { Fingerprint, Ready, Posted };
  struct Task {
    std::shared_ptr<detail::WorkState> state;
    std::chrono::milliseconds timeout;
    Body body;
    Fingerprint fp;
    Buffer data;         // a Carried or Shm op's buffer (count 0: none)
    Route route = Route::Body;
    bool fp_compared = false;  // every peer's fingerprint arrived and was compared
    Pending pending;
    Clock::time_point deadline;
    Stage stage = Stage::Posted;
    mpi::FingerprintExchange exchange;
  };

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
    sequence_.emplace(rank_, size_);
    DDP_MPI_CHECK(MPI_Comm_dup(comm_, &proto_comm_));
    DDP_MPI_CHECK(MPI_Comm_set_errhandler(proto_comm_, MPI_ERRORS_RETURN));
    if (size_ > 1 && size_ <= shm::kMaxRanks) {  // collective: every rank takes part, even with shm off
      auto seg = shm::Segment::create(all_gather_strings(), rank_, size_, opts_.shm, shm::Collectives::segment_bytes(size_),
                                      "MPI point-to-point");
      if (seg) shm_ = std::make_unique<shm::Collectives>(std::move(seg), rank_, size_, opts_.small_allreduce_bytes);
    }
    thread_ = std::thread([this] { progress_loop(); });
    try {
      pin_thread(thread_, opts_.progress_cpus, "--comm-cpus (DDP_COMM_CPUS)");
    } catch (...) {
      stop_progress();
      throw;
    }
  }

  // Lets the progress thread finish what is queued and joins it. Idempotent.
  void stop_progress() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // shm::Segment's setup exchange over MPI (blocking: it runs in the constructor, before any op).
  shm::AllGather all_gather_strings() const {
    return [c = comm_, n = size_](const std::string&, const std::string& mine) {
      int len = static_cast<int>(mine.size());
      std::vector<int> lens(static_cast<std::size_t>(n)), offs(static_cast<std::size_t>(n) + 1, 0);
      DDP_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, c));
      for (int r = 0; r < n; ++r) offs[r + 1] = offs[r] + lens[r];
      std::string all(static_cast<std::size_t>(offs.back()), '\0');
      DDP_MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, c));
      std::vector<std::string> out;
      for (int r = 0; r < n; ++r) out.push_back(all.substr(static_cast<std::size_t>(offs[r]), static_cast<std::size_t>(lens[r])));
      return out;
    };
  }

  static int count_of(const Buffer& b) { return static_cast<int>(b.count); }
  static int tag_of(std::int64_t tag) { return static_cast<int>(tag & 0x7fff); }  // MPI guarantees tags < 32768

  // The rings' scratch (two segments each): reused, not allocated per op.
  // Touched only by the thread that runs ops (see submit), like failed_.
  std::vector<std::byte> take_scratch() {
    if (scratch_pool_.empty()) return {};
    std::vector<std::byte> s = std::move(scratch_pool_.back());
    scratch_pool_.pop_back();
    return s;
  }
  // A finished ring's scratch goes back to the pool; one that MPI may still write (a failed op) is kept
  // alive until the process ends (graveyard_), as the requests left on it are.
  void bury(Pending& p) {
    if (!p.ring) return;
    if (p.ring->in_flight()) graveyard_.push_back(std::move(p.ring));
    else scratch_pool_.push_back(p.ring->release());
    p.ring.reset();
  }

  // Numbers the call, then runs it here when comm::runs_inline allows it (at most inline_max_bytes, or a
  // blocking all-reduce) and nothing else is queued or in flight (no hand-off to the progress thread and back:
  // about 2 x 10-50 us on a busy host), else queues it for the progress thread. The element count must fit
  // MPI's int.
  Work submit(OpCall call, Body body, Route route = Route::Body) {
    for (const Buffer* b : {&call.in, &call.out})
      if (b->count > static_cast<std::size_t>(INT_MAX))
        throw ValueError(ddp::detail::str(who(rank_, size_), ": the mpi backend takes at most ", INT_MAX,
                                          " elements per call, got ", b->count, "; split the buffer."));
    std::unique_lock lock(mu_);
    std::string label = sequence_->number(call);
    Task t{.state = std::make_shared<detail::WorkState>(std::move(label)),
           .timeout = call.timeout.count() > 0 ? call.timeout : opts_.timeout,
           .body = std::move(body),
           .fp = call.fp,
           .data = route != Route::Body ? call.in : Buffer{},
           .route = route};
    Work work(t.state);
    const bool here = opts_.inline_max_bytes > 0 && !call.fp.is_p2p() && outstanding_ == 0 && !running_here_ &&
                      runs_inline(std::max(call.in.bytes(), call.out.bytes()), call.blocking, opts_.inline_max_bytes);
    if (here) {
      run_here(std::move(t), lock);
      return work;
    }
    // Never for send/recv: a recv run to completion here would block the send queued behind it.
    if (!call.fp.is_p2p()) t.state->help = [alive = std::weak_ptr<MpiCommunicator*>(self_), s = t.state.get()] {
      if (const auto c = alive.lock()) (*c)->run_if_next(s);
    };
    ++outstanding_;
    queue_.push_back(std::move(t));
    lock.unlock();
    cv_.notify_all();
    return work;
  }

  // Work::wait's help (comm/work.hpp): the collective whose state is `s` runs on the waiting thread when it is
  // the only op outstanding and still queued, i.e. the progress thread has not taken it yet and has nothing in
  // flight; otherwise nothing happens (the progress thread runs it, or ran it). That saves the hand-back from
  // the progress thread to the waiter; the wake-up of the progress thread at submit still costs (~16 us per op
  // on this 2-core VM at 256 KiB), which a caller that waits at once avoids with AllreduceOptions::blocking.
  void run_if_next(const detail::WorkState* s) {
    std::unique_lock lock(mu_);
    if (running_here_ || outstanding_ != 1 || queue_.empty() || queue_.front().state.get() != s) return;
    Task t = std::move(queue_.front());
    queue_.pop_front();
    --outstanding_;
    run_here(std::move(t), lock);
  }

  // Runs one task to completion on the calling thread, testing it without pause (it is what the caller
  // would wait for anyway). Only when the progress thread has nothing: ops stay in issue order. `lock` holds
  // mu_ on entry and is released on return; running_here_ keeps the progress thread off MPI meanwhile.
  void run_here(Task&& task, std::unique_lock<std::mutex>& lock) {
    running_here_ = true;
    lock.unlock();
    {
      std::deque<Task> one;
      one.push_back(std::move(task));
      Task& t = one.front();
      start(t, one);
      while (!test(t, one))
        if (t.stage == Stage::Ready) post(t, one);
    }
    lock.lock();
    running_here_ = false;
    const bool queued = !queue_.empty();  // another thread's op, waiting for this one to be posted first
    lock.unlock();
    if (queued) cv_.notify_all();
  }

  // How the progress thread works: it starts queued ops in issue order (for a collective, that posts
  // its fingerprint exchange; for send/recv, the call itself), keeps them in flight, and tests them
  // all. A collective whose fingerprints matched posts its own call once every earlier op has posted
  // its own (MPI matches non-blocking collectives by posting order). An op completes when its request
  // does, so an irecv posted before a send never blocks that send. While ops are in flight it tests
  // them without pause (Open MPI progresses only inside MPI calls), yielding the core between rounds,
  // and naps 20 us per round only after 1 ms without progress; idle, it sleeps on the condition variable.
  void progress_loop() {
    std::deque<Task> in_flight;
    std::optional<Task> alone;  // a shared-memory op, run right here (run_shm)
    auto last_progress = Clock::now();
    for (;;) {
      {
        std::unique_lock lock(mu_);
        if (in_flight.empty()) cv_.wait(lock, [&] { return (!queue_.empty() && !running_here_) || stop_; });
        if (stop_ && queue_.empty() && in_flight.empty()) return;
        while (!queue_.empty() && !running_here_) {
          if (queue_.front().route == Route::Shm) {  // runs alone, once everything before it completed
            if (in_flight.empty()) {
              alone.emplace(std::move(queue_.front()));
              queue_.pop_front();
            }
            break;
          }
          in_flight.push_back(std::move(queue_.front()));
          queue_.pop_front();
          start(in_flight.back(), in_flight);
          last_progress = Clock::now();
        }
      }
      if (alone) {  // outside the lock: callers keep submitting meanwhile
        start(*alone, in_flight);
        alone.reset();
        std::lock_guard lock(mu_);
        --outstanding_;
        last_progress = Clock::now();
        continue;
      }
      bool progressed = false;
      std::size_t finished = 0;
      for (auto it = in_flight.begin(); it != in_flight.end();) {
        if (test(*it, in_flight)) {
          it = in_flight.erase(it);
          progressed = true;
          ++finished;
        } else {
          ++it;
        }
      }
      if (finished) {
        std::lock_guard lock(mu_);
        outstanding_ -= finished;
      }
      // Post the bodies of matched collectives, in issue order, up to the first one still waiting.
      for (Task& t : in_flight) {
        if (t.stage == Stage::Fingerprint) break;
        if (t.stage == Stage::Ready) {
          post(t, in_flight);
          progressed = true;
        }
      }
      const auto now = Clock::now();
      if (progressed) last_progress = now;
      else if (now - last_progress > std::chrono::milliseconds(1)) std::this_thread::sleep_for(std::chrono::microseconds(20));
      else std::this_thread::yield();
    }
  }

  void start(Task& t, const std::deque<Task>& in_flight) {
    t.deadline = Clock::now() + t.timeout;
    if (failed_)
      return fail(t, CommError(ddp::detail::str(t.state->label, " was not run: this communicator failed earlier: ",
                                                first_error_)), in_flight);
    if (shm_ && !t.fp.is_p2p()) shm_->announce(t.fp);  // every collective: a peer in a shm op compares
    if (t.route == Route::Shm) return run_shm(t, in_flight);
    if (t.fp.is_p2p() || (!opts_.check_fingerprints && t.route == Route::Body)) return post(t, in_flight);
    // The exchange: my fingerprint (and carried data) to every peer, theirs back (mpi/fingerprint_exchange.hpp).
    t.stage = Stage::Fingerprint;
    if (const int rc = t.exchange.start(t.fp, t.data, proto_comm_, rank_, size_, exchange_pool_); rc != MPI_SUCCESS)
      fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", mpi::error_text(rc))), in_flight);
  }

  // A shared-memory all-reduce, broadcast or barrier, run to completion on this thread. It starts only when nothing else is in
  // flight (run_here, or the progress loop's `alone`), so no MPI request of this rank waits for progress
  // meanwhile. Failures: a mismatch is reported through the fingerprint exchange (report_shm_mismatch); a
  // timeout or a dead peer ends the process with MPI_Abort at exit, as an MPI op's timeout does, since the
  // peers may be stuck where only mpirun can end them.
  void run_shm(Task& t, const std::deque<Task>& in_flight) {
    try {
      mpi::ShmWatch w(t.fp, t.deadline, *shm_);
      if (t.fp.kind == OpKind::AllReduce) shm_->all_reduce(w, t.data.bytes_ptr(), t.data.count);
      else if (t.fp.kind == OpKind::Broadcast) shm_->broadcast(w, t.data.bytes_ptr(), t.data.bytes(), static_cast<int>(t.fp.root));
      else shm_->barrier_op(w);
      t.state->complete();
    } catch (const mpi::ShmMismatch& m) {
      report_shm_mismatch(t, m, in_flight);
    } catch (const TimeoutError& e) {
      abort_at_exit();
      fail(t, TimeoutError(ddp::detail::str(t.state->label, " timed out after ", t.timeout.count(), " ms ", e.what(),
                                            "; this process ends with MPI_Abort at exit, so that mpirun stops every "
                                            "rank. Raise --timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.")),
           in_flight);
    } catch (const std::exception& e) {
      abort_at_exit();
      fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", e.what())), in_flight);
    }
  }

  // The peer runs another collective than this shm op. So that every rank raises the same message as
  // for any other mismatch, this rank joins the fingerprint exchange: a peer whose op is not a shm one is
  // already in it, and a peer in a shm op finds the mismatch too and joins it as well.
  void report_shm_mismatch(Task& t, const mpi::ShmMismatch& m, const std::deque<Task>& in_flight) {
    std::string msg;
    if (opts_.check_fingerprints) {  // (else the peer's op exchanges nothing: report what it announced)
      int done = 0;
      int rc = t.exchange.start(t.fp, {}, proto_comm_, rank_, size_, exchange_pool_);
      while (rc == MPI_SUCCESS && !done && Clock::now() <= t.deadline) rc = t.exchange.test_fingerprints(done);
      if (rc == MPI_SUCCESS && done) {
        msg = t.exchange.mismatch(t.fp);
        t.exchange.drain(t.deadline, shm_ == nullptr);
      }
      if (t.exchange.pending()) {
        orphans_.push_back(std::move(t.exchange));  // MPI may still use its buffers
        abort_at_exit();
      }
    }
    if (msg.empty())
      msg = ddp::detail::str(who(rank_, size_), ": ", t.fp.full_label(), " does not match rank ", m.peer,
                             ", which announced ", m.theirs.full_label(), " in shared memory");
    fail(t, CommError(msg), in_flight);
  }

  // The process will end with MPI_Abort instead of MPI_Finalize (mpi/runtime.hpp).
  void abort_at_exit() {
    if (broken_) return;
    broken_ = true;
    mpi::Runtime::instance().mark_broken();
  }

  void post(Task& t, const std::deque<Task>& in_flight) {
    t.stage = Stage::Posted;
    if (failed_)
      return fail(t, CommError(ddp::detail::str(t.state->label, " was not run: this communicator failed earlier: ",
                                                first_error_)), in_flight);
    try {
      posting_seq_ = t.fp.seq;
      t.pending = t.body();
    } catch (const std::exception& e) {
      fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", e.what())), in_flight);
    }
  }

  // True when the task is finished (completed, failed or timed out).
  bool test(Task& t, const std::deque<Task>& in_flight) {
    if (t.state->is_done()) return true;
    if (t.stage == Stage::Ready) return false;
    if (t.stage == Stage::Fingerprint) {
      // First every peer's fingerprint, then the rest of the exchange (FingerprintExchange::test_fingerprints).
      int done = 1;
      int rc = MPI_SUCCESS;
      if (!t.fp_compared && (rc = t.exchange.test_fingerprints(done)) == MPI_SUCCESS && done) {
        t.fp_compared = true;
        if (opts_.check_fingerprints)
          if (std::string msg = t.exchange.mismatch(t.fp); !msg.empty()) {
            t.exchange.drain(t.deadline, shm_ == nullptr);
            fail(t, CommError(msg), in_flight);
            if (t.exchange.pending()) orphans_.push_back(std::move(t.exchange));  // MPI may still use its buffers
            return true;
          }
      }
      if (rc == MPI_SUCCESS && t.fp_compared) rc = t.exchange.test_all(done);
      if (rc != MPI_SUCCESS) {
        fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", mpi::error_text(rc))), in_flight);
        return true;
      }
      if (t.fp_compared && done) {
        if (t.route == Route::Carried) t.exchange.reduce(t.fp.op);
        t.exchange.release(exchange_pool_);
        if (t.route != Route::Carried) {
          t.stage = Stage::Ready;
          return false;
        }
        t.state->complete();
        return true;
      }
    } else {
      int done = 1;
      int rc = MPI_SUCCESS;
      if (t.pending.ring) {
        bool finished = false;
        rc = t.pending.ring->test(finished);
        done = finished;
      } else if (t.pending.req != MPI_REQUEST_NULL) {
        rc = MPI_Test(&t.pending.req, &done, MPI_STATUS_IGNORE);
      }
      if (rc != MPI_SUCCESS) {
        fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", mpi::error_text(rc))), in_flight);
        return true;
      }
      if (done) {
        bury(t.pending);
        try {
          if (t.pending.after) t.pending.after();
          t.state->complete();
        } catch (const std::exception& e) {
          fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", e.what())), in_flight);
        }
        return true;
      }
    }
    if (Clock::now() > t.deadline) {
      fail(t, TimeoutError(ddp::detail::str(t.state->label, " timed out after ", t.timeout.count(), " ms",
                                            t.stage == Stage::Fingerprint ? " waiting for the other ranks to reach it"
                                                                          : "",
                                            ". MPI cannot cancel it, so this process ends with MPI_Abort at exit. "
                                            "Raise --timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.")),
           in_flight);
      return true;
    }
    return false;
  }

  // Fails the task and the communicator. When an MPI request is still pending anywhere (this task's or
  // another in-flight one's), MPI cannot cancel it, so the runtime is marked broken (MPI_Abort at exit);
  // a fingerprint mismatch leaves nothing pending, so such a program can still exit normally.
  template <class E>
  void fail(Task& t, const E& e, const std::deque<Task>& in_flight) {
    if (!failed_) {
      failed_ = true;
      first_error_ = e.what();
    }
    auto pending = [](const Task& x) {
      return !x.state->is_done() && (x.exchange.pending() || x.pending.req != MPI_REQUEST_NULL ||
                                     (x.pending.ring && x.pending.ring->in_flight()));
    };
    bool any = false;
    for (const Task& x : in_flight) any = any || pending(x);
    if (any) abort_at_exit();
    bury(t.pending);
    t.state->complete(std::make_exception_ptr(e));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  CommOptions opts_;
  int rank_ = 0, size_ = 1;
  mpi::ReduceOps ops_;  // MPI's reductions (reduce, reduce_scatter) per dtype and op
  MPI_Comm proto_comm_ = MPI_COMM_NULL;  // fingerprints and rings (see the file comment)
  std::unique_ptr<shm::Collectives> shm_;  // every rank on this host (CommOptions::shm): all-reduce, broadcast, barrier
  // Touched only by the thread running ops (the progress thread, or a caller in run_here while the
  // progress thread has nothing; the hand-over goes through mu_).
  bool failed_ = false;
  bool broken_ = false;      // a request was left pending (see fail)
  std::string first_error_;
  std::vector<std::vector<std::byte>> scratch_pool_;
  mpi::ExchangePool exchange_pool_;  // receive buffers of finished fingerprint exchanges
  std::uint64_t posting_seq_ = 0;  // the seq of the op whose body post() is running
  std::vector<std::unique_ptr<mpi::RingAllreduce>> graveyard_;  // rings a failure left with requests pending
  std::vector<mpi::FingerprintExchange> orphans_;  // exchanges a mismatch left with requests pending (drain)

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::optional<OpSequence> sequence_;  // set once rank and size are known
  std::deque<Task> queue_;
  std::size_t outstanding_ = 0;  // queued or in the progress thread's hands
  bool running_here_ = false;    // a caller is running an op in submit (run_here)
  bool stop_ = false;
  std::thread thread_;
  // What Work::help holds (weakly): a Work waited on after its communicator is gone finds nothing to help.
  std::shared_ptr<MpiCommunicator*> self_ = std::make_shared<MpiCommunicator*>(this);
};

}  // namespace ddp::comm
