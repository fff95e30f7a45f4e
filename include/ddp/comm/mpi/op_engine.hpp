// mpi::OpEngine: how the mpi backend runs its ops. It numbers each one, checks its fingerprint
// against every rank's, posts its non-blocking MPI call in issue order and tests it against the
// op's deadline, on one thread at a time: the caller for a small (or AllreduceOptions::blocking)
// collective issued while nothing else is pending, else a progress thread, which a thread waiting
// for the only outstanding collective, still queued, replaces (run_if_next). The tcp backend's
// counterpart is tcp/op_queue.hpp.
// SPDX-License-Identifier: MIT
//
// MPI_THREAD_SERIALIZED suffices (mpi/runtime.hpp): one thread at a time runs ops, handed over
// under the queue's lock. Ordering: fingerprints go out on the protocol communicator in issue
// order; each body only after its fingerprint matched and every earlier op's body was posted, so
// all ranks post every communicator's calls in the same order (MPI matches collectives by posting
// order only). A Route::Shm op runs alone, after every earlier op completed, so that no MPI request
// of this rank waits for progress while it spins. Failure: MPI cannot cancel a collective, so an op
// that times out breaks the communicator and the process ends with MPI_Abort at exit instead of
// hanging in MPI_Finalize, which makes mpirun stop every rank (docs/decisions/0009). A fingerprint
// mismatch leaves nothing pending: such a program can exit normally.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/failure_state.hpp"
#include "ddp/comm/mpi/fingerprint_exchange.hpp"
#include "ddp/comm/mpi/mpi_check.hpp"
#include "ddp/comm/mpi/ring_allreduce.hpp"
#include "ddp/comm/mpi/runtime.hpp"
#include "ddp/comm/mpi/shm_watch.hpp"
#include "ddp/comm/shm/collectives.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/cpu_affinity.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::mpi {

// A started op: its request (or ring) and what to do once it completes (the Avg division).
struct Pending {
  MPI_Request req = MPI_REQUEST_NULL;
  std::function<void()> after;
  std::unique_ptr<RingAllreduce> ring;
};
using Body = std::function<Pending()>;  // posts the non-blocking call
// How an op runs (mpi_communicator.hpp picks one per op): Body, its own MPI call after the
// fingerprint exchange; Carried, an all-reduce whose data rides in the exchange
// (mpi/fingerprint_exchange.hpp); Ring, an all-reduce on point-to-point calls after the exchange
// (mpi/ring_allreduce.hpp); Shm, an all-reduce, broadcast or barrier through shared memory
// (comm/shm/collectives.hpp, docs/decisions/0055), run by run_shm. Every collective announces
// itself in the segment, so that a peer waiting there sees a mismatch at once (mpi/shm_watch.hpp)
// and reports it through the fingerprint exchange.
enum class Route : std::uint8_t { Body, Carried, Ring, Shm };

class OpEngine {
 public:
  // proto_comm: the fingerprint exchanges' communicator (point-to-point, tag 0); shm: the
  // shared-memory collectives when every rank runs on this host, else null. Starts the progress
  // thread, pinned to opts.progress_cpus.
  OpEngine(MPI_Comm proto_comm, int rank, int size, const CommOptions& opts,
           std::unique_ptr<shm::Collectives> shm)
      : proto_comm_(proto_comm), rank_(rank), size_(size), opts_(opts), shm_(std::move(shm)) {
    sequence_.emplace(rank_, size_);
    thread_ = std::thread([this] { progress_loop(); });
    try {
      pin_thread(thread_, opts_.progress_cpus, "--comm-cpus (DDP_COMM_CPUS)");
    } catch (...) {
      stop();
      throw;
    }
  }
  ~OpEngine() { stop(); }
  OpEngine(const OpEngine&) = delete;
  OpEngine& operator=(const OpEngine&) = delete;

  bool uses_shm() const noexcept { return shm_ != nullptr; }

  // Numbers the call, then runs it here when comm::runs_inline allows it and nothing else is queued
  // or in flight (saving the hand-off and back, about 2 x 10-50 us on a busy host), else queues it
  // for the progress thread. The element count must fit MPI's int. Every route but Body takes
  // call.in as its data and call.fp.op as its reduction.
  Work submit(OpCall call, Body body, Route route = Route::Body) {
    for (const BufferRef* b : {&call.in, &call.out})
      if (b->count > static_cast<std::size_t>(INT_MAX))
        throw ValueError(ddp::detail::str(who(rank_, size_), ": the mpi backend takes at most ",
                                          INT_MAX, " elements per call, got ", b->count,
                                          "; split the buffer."));
    std::unique_lock lock(mu_);
    std::string label = sequence_->number(call);
    Task t{.state = std::make_shared<comm::detail::WorkState>(std::move(label)),
           .timeout = call.timeout.count() > 0 ? call.timeout : opts_.timeout,
           .body = std::move(body),
           .fp = call.fp,
           .data = route != Route::Body ? call.in : BufferRef{},
           .route = route};
    Work work(t.state);
    const bool here = opts_.inline_max_bytes > 0 && !call.fp.is_p2p() && outstanding_ == 0 &&
                      !running_here_ &&
                      runs_inline(std::max(call.in.bytes(), call.out.bytes()), call.blocking,
                                  opts_.inline_max_bytes);
    if (here) {
      run_here(std::move(t), lock);
      return work;
    }
    // Never for send/recv: a recv run to completion here would block the send queued behind it.
    if (!call.fp.is_p2p())
      t.state->help = [alive = std::weak_ptr<OpEngine*>(self_), s = t.state.get()] {
        if (const auto e = alive.lock()) (*e)->run_if_next(s);
      };
    ++outstanding_;
    queue_.push_back(std::move(t));
    lock.unlock();
    cv_.notify_all();
    return work;
  }

  // Lets the progress thread finish what is queued and joins it. Idempotent.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // A request was left pending (see fail): MPI may still use this communicator's buffers and
  // communicators. Read it after stop().
  bool broken() const noexcept { return broken_; }

 private:
  // Where a task is: its fingerprint exchange in flight, matched and waiting for earlier bodies to
  // be posted, or its own MPI call posted.
  enum class Stage : std::uint8_t { Fingerprint, Ready, Posted };
  struct Task {
    std::shared_ptr<comm::detail::WorkState> state;
    std::chrono::milliseconds timeout;
    Body body;
    Fingerprint fp;
    BufferRef data;  // the buffer of an op on any route but Body (count 0: none)
    Route route = Route::Body;
    bool fp_compared = false;  // every peer's fingerprint arrived and was compared
    Pending pending;
    Clock::time_point deadline;
    Stage stage = Stage::Posted;
    FingerprintExchange exchange;
  };

  // Work::wait's help (comm/work.hpp): runs the collective whose state is `s` on the waiting thread
  // when it is the only op outstanding and still queued (the progress thread has nothing in
  // flight), saving the hand-back to the waiter; otherwise does nothing. The progress thread's
  // wake-up at submit still costs (~16 us per op on a 2-core VM at 256 KiB);
  // AllreduceOptions::blocking avoids it for a caller that waits at once.
  void run_if_next(const comm::detail::WorkState* s) {
    std::unique_lock lock(mu_);
    if (running_here_ || outstanding_ != 1 || queue_.empty() || queue_.front().state.get() != s)
      return;
    Task t = std::move(queue_.front());
    queue_.pop_front();
    --outstanding_;
    run_here(std::move(t), lock);
  }

  // Runs one task to completion on the calling thread, testing it without pause (it is what the
  // caller would wait for anyway). Only when the progress thread has nothing: ops stay in issue
  // order. `lock` holds mu_ on entry and is released on return; running_here_ keeps the progress
  // thread off MPI meanwhile.
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
    // another thread's op, waiting for this one to be posted first
    const bool queued = !queue_.empty();
    lock.unlock();
    if (queued) cv_.notify_all();
  }

  // How the progress thread works: it starts queued ops in issue order (for a collective, that
  // posts its fingerprint exchange; for send/recv, the call itself), keeps them in flight, and
  // tests them all. A collective whose fingerprints matched posts its own call once every earlier
  // op has posted its own. An op completes when its request does, so an irecv posted before a send
  // never blocks that send. While ops are in flight it tests them without pause (Open MPI
  // progresses only inside MPI calls), yielding between rounds, and naps 20 us per round only
  // after 1 ms without progress; idle, it sleeps on the condition variable.
  void progress_loop() {
    std::deque<Task> in_flight;
    std::optional<Task> alone;  // a shared-memory op, run right here (run_shm)
    auto last_progress = Clock::now();
    for (;;) {
      {
        std::unique_lock lock(mu_);
        if (in_flight.empty())
          cv_.wait(lock, [&] { return (!queue_.empty() && !running_here_) || stop_; });
        if (stop_ && queue_.empty() && in_flight.empty()) return;
        while (!queue_.empty() && !running_here_) {
          // runs alone, once everything before it completed
          if (queue_.front().route == Route::Shm) {
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
      if (progressed)
        last_progress = now;
      else if (now - last_progress > std::chrono::milliseconds(1))
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      else
        std::this_thread::yield();
    }
  }

  void start(Task& t, const std::deque<Task>& in_flight) {
    t.deadline = Clock::now() + t.timeout;
    if (refused_after_failure(t, in_flight)) return;
    // every collective: a peer in a shm op compares
    if (shm_ && !t.fp.is_p2p()) shm_->announce(t.fp);
    if (t.route == Route::Shm) return run_shm(t, in_flight);
    if (t.fp.is_p2p() || (!opts_.check_fingerprints && t.route != Route::Carried))
      return post(t, in_flight);
    // The exchange: my fingerprint (and carried data) to every peer, theirs back.
    t.stage = Stage::Fingerprint;
    if (const int rc = t.exchange.start(t.fp, t.data, proto_comm_, rank_, size_, exchange_pool_);
        rc != MPI_SUCCESS)
      fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", error_text(rc))), in_flight);
  }

  // A shared-memory op run to completion on this thread, only when nothing else is in flight
  // (run_here, or the progress loop's `alone`). A mismatch is reported through the fingerprint
  // exchange (report_shm_mismatch); a timeout or a dead peer ends the process with MPI_Abort at
  // exit, as an MPI op's timeout does: the peers may be stuck where only mpirun can end them.
  void run_shm(Task& t, const std::deque<Task>& in_flight) {
    try {
      ShmWatch w(t.fp, t.deadline, *shm_);
      if (t.fp.kind == OpKind::AllReduce)
        shm_->all_reduce(w, t.data.bytes_ptr(), t.data.count);
      else if (t.fp.kind == OpKind::Broadcast)
        shm_->broadcast(w, t.data.bytes_ptr(), t.data.bytes(), static_cast<int>(t.fp.root));
      else
        shm_->barrier_op(w);
      t.state->complete();
    } catch (const ShmMismatch& m) {
      report_shm_mismatch(t, m, in_flight);
    } catch (const TimeoutError& e) {
      abort_at_exit();
      fail(t,
           TimeoutError(ddp::detail::str(
               t.state->label, " timed out after ", t.timeout.count(), " ms ", e.what(),
               "; this process ends with MPI_Abort at exit, so that mpirun stops every "
               "rank. Raise --timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.")),
           in_flight);
    } catch (const std::exception& e) {
      abort_at_exit();
      fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", e.what())), in_flight);
    }
  }

  // The peer runs another collective than this shm op. So that every rank raises the same message
  // as for any other mismatch, this rank joins the fingerprint exchange: a peer whose op is not a
  // shm one is already in it, and a peer in a shm op finds the mismatch too and joins it as well.
  void report_shm_mismatch(Task& t, const ShmMismatch& m, const std::deque<Task>& in_flight) {
    std::string msg;
    bool exchanged = false;
    // (else the peer's op exchanges nothing: report what it announced)
    if (opts_.check_fingerprints) {
      int done = 0;
      int rc = t.exchange.start(t.fp, {}, proto_comm_, rank_, size_, exchange_pool_);
      while (rc == MPI_SUCCESS && !done && Clock::now() <= t.deadline)
        rc = t.exchange.test_fingerprints(done);
      exchanged = rc == MPI_SUCCESS && done;
      if (exchanged) msg = t.exchange.mismatch(t.fp);
    }
    if (msg.empty())
      msg = ddp::detail::str(who(rank_, size_), ": ", t.fp.full_label(), " does not match rank ",
                             m.peer, ", which announced ", m.theirs.full_label(),
                             " in shared memory");
    fail_mismatch(t, msg, exchanged, in_flight);
  }

  // Fails the task with a fingerprint mismatch. Once every peer's fingerprint arrived
  // (`exchanged`), every message of the exchange is matched first (drain), so that none meets a
  // later op. An exchange that still has requests pending is kept alive (orphans_) and breaks the
  // runtime: MPI may still write its buffers.
  void fail_mismatch(Task& t, const std::string& msg, bool exchanged,
                     const std::deque<Task>& in_flight) {
    if (exchanged) t.exchange.drain(t.deadline, /*carrying=*/shm_ == nullptr);
    if (t.exchange.pending()) {
      abort_at_exit();
      orphans_.push_back(std::move(t.exchange));
    }
    fail(t, CommError(msg), in_flight);
  }

  // The process will end with MPI_Abort instead of MPI_Finalize (mpi/runtime.hpp).
  void abort_at_exit() {
    if (broken_) return;
    broken_ = true;
    Runtime::instance().mark_broken();
  }

  // Once the communicator failed, every later op fails too, naming the first error (a peer may be
  // stuck in the failed op, so nothing more is posted). True when t was failed here.
  bool refused_after_failure(Task& t, const std::deque<Task>& in_flight) {
    try {
      failure_.throw_if_failed(t.state->label);
      return false;
    } catch (const CommError& e) {
      fail(t, e, in_flight);
      return true;
    }
  }

  // Posts the op's own MPI calls: its Body, or for Route::Ring a ring from the pool.
  void post(Task& t, const std::deque<Task>& in_flight) {
    t.stage = Stage::Posted;
    if (refused_after_failure(t, in_flight)) return;
    try {
      if (t.route != Route::Ring) {
        t.pending = t.body();
      } else {
        t.pending.ring = rings_.make(t.data, t.fp.op, proto_comm_, rank_, size_, t.fp.seq);
        if (const int rc = t.pending.ring->start(); rc != MPI_SUCCESS)
          throw CommError(error_text(rc));
      }
    } catch (const std::exception& e) {
      fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", e.what())), in_flight);
    }
  }

  // True when the task is finished (completed, failed or timed out).
  bool test(Task& t, const std::deque<Task>& in_flight) {
    if (t.state->is_done()) return true;
    if (t.stage == Stage::Ready) return false;
    if (t.stage == Stage::Fingerprint) {
      // First every peer's fingerprint, then the rest of the exchange.
      int done = 1;
      int rc = MPI_SUCCESS;
      if (!t.fp_compared && (rc = t.exchange.test_fingerprints(done)) == MPI_SUCCESS && done) {
        t.fp_compared = true;
        if (opts_.check_fingerprints)
          if (std::string msg = t.exchange.mismatch(t.fp); !msg.empty()) {
            fail_mismatch(t, msg, /*exchanged=*/true, in_flight);
            return true;
          }
      }
      if (rc == MPI_SUCCESS && t.fp_compared) rc = t.exchange.test_all(done);
      if (rc != MPI_SUCCESS) {
        fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", error_text(rc))),
             in_flight);
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
        fail(t, CommError(ddp::detail::str(t.state->label, " failed: ", error_text(rc))),
             in_flight);
        return true;
      }
      if (done) {
        rings_.retire(t.pending.ring);
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
      fail(t,
           TimeoutError(ddp::detail::str(
               t.state->label, " timed out after ", t.timeout.count(), " ms",
               t.stage == Stage::Fingerprint ? " waiting for the other ranks to reach it" : "",
               ". MPI cannot cancel it, so this process ends with MPI_Abort at exit. "
               "Raise --timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.")),
           in_flight);
      return true;
    }
    return false;
  }

  // Fails the task and the communicator. An MPI request still pending anywhere (this task's or
  // another's) cannot be cancelled, so the runtime is then marked broken (MPI_Abort at exit).
  template <class E>
  void fail(Task& t, const E& e, const std::deque<Task>& in_flight) {
    failure_.fail(e.what());
    auto pending = [](const Task& x) {
      return !x.state->is_done() && (x.exchange.pending() || x.pending.req != MPI_REQUEST_NULL ||
                                     (x.pending.ring && x.pending.ring->in_flight()));
    };
    bool any = false;
    for (const Task& x : in_flight) any = any || pending(x);
    if (any) abort_at_exit();
    rings_.retire(t.pending.ring);
    t.state->complete(std::make_exception_ptr(e));
  }

  MPI_Comm proto_comm_;
  int rank_, size_;
  CommOptions opts_;
  // every rank on this host (CommOptions::shm): all-reduce, broadcast, barrier
  std::unique_ptr<shm::Collectives> shm_;
  // Touched only by the thread running ops (the progress thread, or a caller in run_here while the
  // progress thread has nothing; the hand-over goes through mu_).
  FailureState failure_;
  bool broken_ = false;         // a request was left pending (see fail)
  RingPool rings_;              // Route::Ring's rings: scratch reused, failed ones kept alive
  ExchangePool exchange_pool_;  // receive buffers of finished fingerprint exchanges
  // exchanges a mismatch left with requests pending (drain)
  std::vector<FingerprintExchange> orphans_;

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::optional<OpSequence> sequence_;
  std::deque<Task> queue_;
  std::size_t outstanding_ = 0;  // queued or in the progress thread's hands
  bool running_here_ = false;    // a caller is running an op (run_here)
  bool stop_ = false;
  std::thread thread_;
  // What Work::help holds weakly: a Work waited on after its engine is gone finds nothing to help.
  std::shared_ptr<OpEngine*> self_ = std::make_shared<OpEngine*>(this);
};

}  // namespace ddp::comm::mpi
