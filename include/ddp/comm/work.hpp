// Work: the handle every collective returns. It completes once, with success or with the op's
// exception.
// SPDX-License-Identifier: MIT
//
// Contract:
// - Copyable; copies share one state. Thread-safe: any thread may wait, poll or read the exception.
// - wait() blocks until the op completes and rethrows its failure (CommError naming the op, its
//   sequence number and the peer; TimeoutError when the op's own timeout ran out). Backends
//   guarantee that every op completes within its timeout, so wait() is bounded.
// - wait(timeout) additionally gives up after `timeout` with a TimeoutError naming the op; the op
//   itself keeps running (the caller may wait again). It never drops its argument.
// - A default-constructed Work is already completed (used for no-op calls such as world size 1).
// - A backend may let the waiter run the op itself: WorkState::help, when set, is called by wait()
//   (not by wait(timeout), which must return at its timeout) before it blocks; the tcp backend's
//   queue runs a collective that is first in line and not yet started on the waiting thread, which
//   saves the two thread hand-offs of a caller that waits at once (tcp/op_queue.hpp).
//
//   Work w = comm.all_reduce(std::span(grad));   // returns at once; the progress thread runs it
//   compute_something_else();
//   w.wait();                                      // throws ddp::CommError if a peer died
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm {

namespace detail {

// The state a backend completes. `label` is the op as messages name it: "ddp[rank 0/4]: all_reduce
// #17 (F32 x 4)".
struct WorkState {
  explicit WorkState(std::string l) : label(std::move(l)) {}

  void complete(std::exception_ptr e = nullptr) {
    {
      std::lock_guard lock(mu);
      if (done) return;
      error = std::move(e);
      done = true;
      completed_at = std::chrono::steady_clock::now();
    }
    cv.notify_all();
  }

  bool is_done() {
    std::lock_guard lock(mu);
    return done;
  }

  const std::string label;
  // Set by the backend before the Work is handed out, never changed after; may run the op on the
  // calling thread (see the file comment). Must tolerate being called after the op completed, and
  // from several waiters.
  std::function<void()> help;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  // when complete() ran (traces, communication time)
  std::chrono::steady_clock::time_point completed_at;
};

}  // namespace detail

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

  // A Work that is already finished (optionally with an error).
  static Work completed(std::string label, std::exception_ptr error = nullptr) {
    auto s = std::make_shared<detail::WorkState>(std::move(label));
    s->complete(std::move(error));
    return Work(std::move(s));
  }

  // Never blocks.
  bool is_completed() const {
    if (!state_) return true;
    std::lock_guard lock(state_->mu);
    return state_->done;
  }

  // Blocks until the op completes; rethrows its exception.
  void wait() const {
    if (!state_) return;
    if (state_->help) state_->help();
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
    if (state_->error) std::rethrow_exception(state_->error);
  }

  // Like wait(), but throws TimeoutError if the op has not completed after `timeout`.
  void wait(std::chrono::milliseconds timeout) const {
    if (!state_) return;
    std::unique_lock lock(state_->mu);
    if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; }))
      throw TimeoutError(
          ddp::detail::str(state_->label, " did not complete within Work::wait(", timeout.count(),
                           " ms); the op keeps running under its own timeout (--timeout-ms, "
                           "DDP_TIMEOUT_MS). Wait again or raise the timeout passed to wait()."));
    if (state_->error) std::rethrow_exception(state_->error);
  }

  // The op's failure, or nullptr while running or after success. Never blocks.
  std::exception_ptr exception() const {
    if (!state_) return nullptr;
    std::lock_guard lock(state_->mu);
    return state_->error;
  }

  // When the op completed (the backend's thread, not the waiter), or nullopt while it runs and for
  // a default-constructed Work (nothing ran). Never blocks.
  std::optional<std::chrono::steady_clock::time_point> completed_at() const {
    if (!state_) return std::nullopt;
    std::lock_guard lock(state_->mu);
    if (!state_->done) return std::nullopt;
    return state_->completed_at;
  }

  // "ddp[rank 0/4]: all_reduce #17 (F32 x 4)"; empty for a default-constructed Work.
  std::string label() const { return state_ ? state_->label : std::string(); }

 private:
  std::shared_ptr<detail::WorkState> state_;
};

// Waits for every Work and clears `works`, dropping errors: for code that is already unwinding
// another error, or abandoning a step.
inline void wait_all_noexcept(std::vector<Work>& works) noexcept {
  for (Work& w : works) {
    try {
      w.wait();
    } catch (...) {
    }
  }
  works.clear();
}

}  // namespace ddp::comm
