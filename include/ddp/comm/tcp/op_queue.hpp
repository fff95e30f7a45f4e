// OpQueue: how the tcp backend issues ops: it numbers each one, queues it, and a progress thread
// runs the queue one op at a time, so ops complete in issue order and overlap the caller's compute.
// SPDX-License-Identifier: MIT
//
// submit: under the lock the op gets its number and label (OpSequence) and becomes a Task. A
// collective that comm::runs_inline allows (at most inline_max_bytes, or a blocking all-reduce),
// issued while nothing is queued or running, runs on the calling thread instead, saving the
// hand-off (tens of us). The progress thread hands each collective to run_collective, and a send or
// recv to run_p2p, which also takes the send/recv ops behind it up to the next collective
// (take_p2p; the batch of p2p.hpp). A send or recv queued while a batch runs wakes it (wake_fd).
// Example: all_reduce(1 KiB) on an idle queue is complete on return; all_reduce(4 MiB) completes
// on the progress thread. Work::wait() on a queued collective first in line while nothing runs
// runs it on the waiting thread (run_if_next), saving two wake-ups (docs/decisions/0051); issue
// order is kept, as only the queue's head runs, and only when nothing else does.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/tcp/mesh.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/cpu_affinity.hpp"
#include "ddp/core/fd.hpp"

namespace ddp::comm::tcp {

// A collective's algorithm, run with the op's context (fingerprint, deadline).
using Body = std::function<void(const OpContext&)>;

// One issued op.
struct Task {
  // label: "ddp[rank 0/4]: all_reduce #17 (F32 x 4)"
  std::shared_ptr<comm::detail::WorkState> state;
  Fingerprint fp;  // numbered
  // never 0: the communicator's default fills it in
  std::chrono::milliseconds timeout{0};
  // false: the shutdown barrier (finished peers may close early)
  bool strict = true;
  Body body;                     // collectives
  Transfer xfer;                 // send/recv: run batched by p2p.hpp
  Clock::time_point deadline{};  // send/recv: set when a batch admits it
};

class OpQueue {
 public:
  OpQueue(int rank, int size, std::chrono::milliseconds default_timeout,
          std::size_t inline_max_bytes)
      : size_(size),
        default_timeout_(default_timeout),
        inline_max_bytes_(inline_max_bytes),
        sequence_(rank, size) {}
  ~OpQueue() { stop(); }
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Starts the progress thread, pinned to `cpus` unless empty (ConfigError, thread stopped, when
  // the kernel refuses them). Nothing may be submitted before.
  void start(std::function<void(Task&)> run_collective, std::function<void(Task)> run_p2p,
             const std::vector<int>& cpus = {}) {
    run_collective_ = std::move(run_collective);
    run_p2p_ = std::move(run_p2p);
    wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    thread_ = std::thread([this] { loop(); });
    try {
      pin_thread(thread_, cpus, "--comm-cpus (DDP_COMM_CPUS)");
    } catch (...) {
      stop();
      throw;
    }
  }

  // Runs what is queued, then joins the thread. Idempotent.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // `bytes`: what the op moves; `body`: a collective's algorithm (empty for send/recv, whose
  // transfer comes from call.in); `strict` false only for the shutdown barrier.
  Work submit(OpCall call, std::size_t bytes, Body body, bool strict = true) {
    std::unique_lock lock(mu_);
    std::string label = sequence_.number(call);
    Task t{.state = std::make_shared<comm::detail::WorkState>(std::move(label)),
           .fp = call.fp,
           .timeout = call.timeout.count() > 0 ? call.timeout : default_timeout_,
           .strict = strict,
           .body = std::move(body)};
    const bool p2p = call.fp.is_p2p();
    if (p2p)
      t.xfer = Transfer{.peer = call.peer,
                        .is_send = call.fp.kind == OpKind::Send,
                        .data = call.in.bytes_ptr(),
                        .bytes = call.in.bytes()};
    if (!p2p)
      t.state->help = [alive = std::weak_ptr<OpQueue*>(self_), s = t.state.get()] {
        if (const auto q = alive.lock()) (*q)->run_if_next(s);
      };
    Work work(t.state);
    // Never inline send/recv: an irecv must return before the matching send is issued.
    if (!p2p && queue_.empty() && !busy_ &&
        (size_ == 1 || runs_inline(bytes, call.blocking, inline_max_bytes_))) {
      run_here(t, lock);
      return work;
    }
    queue_.push_back(std::move(t));
    lock.unlock();
    cv_.notify_all();
    if (p2p && wake_) {  // a running send/recv batch picks it up at once
      const std::uint64_t one = 1;
      (void)!::write(wake_.get(), &one, sizeof one);
    }
    return work;
  }

  // Work::wait's help: runs collective `s` on the calling thread if it is next in line and nothing
  // runs; otherwise does nothing (the progress thread runs it).
  void run_if_next(const comm::detail::WorkState* s) {
    std::unique_lock lock(mu_);
    if (busy_ || queue_.empty() || queue_.front().state.get() != s) return;
    Task t = std::move(queue_.front());
    queue_.pop_front();
    run_here(t, lock);
  }

  // For a running send/recv batch: hands the queue's leading send/recv ops to admit(Task).
  template <class F>
  void take_p2p(F&& admit) {
    std::lock_guard lock(mu_);
    while (!queue_.empty() && queue_.front().fp.is_p2p()) {
      admit(std::move(queue_.front()));
      queue_.pop_front();
    }
  }

  // An eventfd that becomes readable when a send/recv is queued; the batch's poll() watches it.
  int wake_fd() const noexcept { return wake_.get(); }

 private:
  // `lock` is held on entry, released on return.
  void run_here(Task& t, std::unique_lock<std::mutex>& lock) {
    busy_ = true;
    lock.unlock();
    run_collective_(t);
    lock.lock();
    busy_ = false;
    // Only the progress thread waits on cv_, and only for queued work: waking it for nothing would
    // cost every inline op a futex wake and a context switch.
    const bool queued = !queue_.empty();
    lock.unlock();
    if (queued) cv_.notify_all();
  }

  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock,
               [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty() && !busy_); });
      if (queue_.empty()) return;
      Task t = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      if (t.fp.is_p2p())
        run_p2p_(std::move(t));
      else
        run_collective_(t);
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  const int size_;
  const std::chrono::milliseconds default_timeout_;
  const std::size_t inline_max_bytes_;
  std::function<void(Task&)> run_collective_;
  std::function<void(Task)> run_p2p_;
  Fd wake_;

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  OpSequence sequence_;
  std::deque<Task> queue_;
  bool busy_ = false;  // an op is running (progress thread or inline)
  bool stop_ = false;
  std::thread thread_;
  // Held weakly by Work::help: a Work waited on after its communicator is gone finds no queue.
  std::shared_ptr<OpQueue*> self_ = std::make_shared<OpQueue*>(this);
};

}  // namespace ddp::comm::tcp
