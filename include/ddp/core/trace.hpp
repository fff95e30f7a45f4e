// Trace recording: timed spans of a training step (module forward/backward, each bucket's
// all-reduce, optimizer, data wait) collected in memory while a Recorder is active; train/trace.hpp
// writes them as a Chrome trace.
// SPDX-License-Identifier: MIT
//
//   ddp::trace::Recorder rec;
//   {
//     ddp::trace::Activation on(rec);           // this thread's spans now go to rec
//     ddp::trace::Span s("optimizer", "step");  // [construction, destruction)
//     opt.step(exec);
//   }
//   std::vector<ddp::trace::Event> events = rec.take();
// Cost with no Recorder active: one thread-local load per span, no allocation, no clock read. A
// recorder records only the thread that activated it, the one driving training (track kMainTrack;
// pool and loader threads record nothing). A bucket's all-reduce, run on the progress thread, is
// added by the reducer from its launch and completion times on track kCommTrack. So every event is
// added on one thread and a recorder needs no lock. Times are steady_clock (CLOCK_MONOTONIC, one
// clock per host); the trace writer pairs it with the system clock to align hosts. GPU: a span
// measures the host; Recorder::set_synchronize(f) makes every span wait for the device before it
// ends, showing device time at the cost of serialising the steps.
#pragma once

#include <chrono>
#include <concepts>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/clock.hpp"

namespace ddp::trace {

inline constexpr int kMainTrack = 0;  // the thread that drives forward, backward and the optimizer
inline constexpr int kCommTrack = 1;  // collectives in flight (may overlap one another)

// One argument shown with an event: a number, or a string (escaped by whoever writes the trace).
struct Arg {
  std::string key;
  double number = 0.0;
  std::string text;
  bool is_number = true;
};
// A numeric argument: number_arg("bucket", 2).
inline Arg number_arg(std::string key, double value) {
  return {.key = std::move(key), .number = value, .text = {}, .is_number = true};
}

struct Event {
  std::string name;  // "layer1.0.conv1", "all-reduce bucket 2", "optimizer"
  // "forward", "backward", "allreduce", "optimizer", "data", "step", "ddp", "loss"
  std::string category;
  Clock::time_point start, end;
  int track = kMainTrack;
  std::vector<Arg> args;
};

// Collects the events of the thread that activated it; not thread-safe (see the file comment).
class Recorder {
 public:
  Recorder() = default;
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  void add(Event e) { events_.push_back(std::move(e)); }
  // Every event recorded so far, in the order they ended; the recorder is empty afterwards.
  std::vector<Event> take() { return std::exchange(events_, {}); }
  std::size_t size() const { return events_.size(); }
  // Called at the end of every span before its end time is read (nullptr: none).
  void set_synchronize(std::function<void()> f) { synchronize_ = std::move(f); }
  void synchronize() const {
    if (synchronize_) synchronize_();
  }

 private:
  std::vector<Event> events_;
  std::function<void()> synchronize_;
};

namespace detail {
inline Recorder*& active_slot() noexcept {
  thread_local Recorder* slot = nullptr;
  return slot;
}
}  // namespace detail

// The recorder this thread's spans go to, or nullptr when tracing is off.
inline Recorder* active() noexcept { return detail::active_slot(); }

// Makes `rec` this thread's active recorder while it lives (nesting restores the previous one).
// Destroy it on the thread that made it.
class Activation {
 public:
  explicit Activation(Recorder& rec) : prev_(std::exchange(detail::active_slot(), &rec)) {}
  Activation(const Activation&) = delete;
  Activation& operator=(const Activation&) = delete;
  ~Activation() { detail::active_slot() = prev_; }

 private:
  Recorder* prev_;
};

// A span on the calling thread from construction to destruction, recorded only if a recorder was
// active when it began. `name` is copied only then.
class Span {
 public:
  Span(std::string_view category, std::string_view name) : rec_(active()) {
    if (!rec_) return;
    event_.category = category;
    event_.name = name;
    event_.start = Clock::now();
  }
  // The same with one string argument, computed by text() only when the span is recorded.
  template <std::invocable F>
  Span(std::string_view category, std::string_view name, std::string key, F&& text)
      : Span(category, name) {
    if (rec_) arg(std::move(key), std::string(std::forward<F>(text)()));
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  ~Span() {
    if (!rec_) return;
    try {
      rec_->synchronize();
      event_.end = Clock::now();
      rec_->add(std::move(event_));
      // a trace never fails the step it watches (the exception being thrown, if any, goes on)
    } catch (...) {
    }
  }
  // Whether this span is recorded: guards work that only its arguments need.
  explicit operator bool() const noexcept { return rec_ != nullptr; }
  void arg(std::string key, double v) {
    if (rec_)
      event_.args.push_back({.key = std::move(key), .number = v, .text = {}, .is_number = true});
  }
  void arg(std::string key, std::string v) {
    if (rec_)
      event_.args.push_back(
          {.key = std::move(key), .number = 0.0, .text = std::move(v), .is_number = false});
  }

 private:
  Recorder* rec_;
  Event event_;
};

}  // namespace ddp::trace
