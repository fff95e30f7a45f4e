// --trace FILE: a Chrome / Perfetto trace (JSON "traceEvents") of chosen training steps on every
// rank, merged by rank 0 into one file with one process track per rank.
// SPDX-License-Identifier: MIT
//
//   ddp::train::StepTracer<Cpu> tracer(comm, {.path = "trace.json", .first = 3, .last = 5});
//   while (auto batch = loader.next()) {
//     const auto got_batch = Clock::now();
//     tracer.begin_step(g);           // records from step `first` on: every span of core/trace.hpp
//     ... forward, loss, backward, optimizer ...
//     tracer.end_step(g, previous_step_end, got_batch, exec);  // "step g", "data wait"; writes
//   }                                                            // at `last`
//   tracer.close(exec);               // writes what was recorded if `last` was never reached
// Per rank (pid = rank), thread 0 shows the step, its data wait, every module's forward and
// backward nested as the model nests them (root "model"), the loss, DDP's "wait for all-reduces"
// and the optimizer; the "all-reduce" threads show each gradient bucket from launch to completion
// (overlapping buckets on separate lanes, so each thread's spans nest). Args carry the module's
// description, the bucket's index, step, parameter count and bytes. Timestamps: each rank maps
// its steady clock to system-clock microseconds since the Unix epoch (one pair of readings at
// start); rank 0 subtracts the earliest, so the trace starts at 0 ("otherData.start_unix_us" keeps
// the absolute time). Across hosts, alignment is that of their clocks (NTP: well under a ms).
// Writing (end_step at `last`, or close) is collective: each rank broadcasts a length and its
// bytes over the training communicator (parallel::Broadcaster<D>, so nccl stages them through the
// GPU), then rank 0 writes the file atomically. A resnet18 step is ~130 spans, ~25 KB per rank.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/core/trace.hpp"
#include "ddp/parallel/transport.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/train/atomic_file.hpp"

namespace ddp::train {

struct TraceOptions {
  std::string path;  // the trace file (--trace); empty: tracing off
  // the first traced step, 1-based and counted over epochs (global_step in the metrics)
  long first = 3;
  long last = 5;  // the last traced step (inclusive)
};

// "--trace-steps" "N" or "FIRST:LAST" (1-based, inclusive); ConfigError naming the flag.
inline void parse_trace_steps(const std::string& text, TraceOptions& o) {
  const auto bad = [&](const char* why) {
    return ConfigError(
        ddp::detail::str("ddp: --trace-steps ", ddp::detail::quoted(text), " ", why,
                         "; give one step (\"4\") or an inclusive range (\"3:5\"), counted from 1 "
                         "over all epochs"));
  };
  const auto number = [&](std::string_view s) {
    long v = 0;
    if (s.empty() || s.size() > 12) throw bad("is not a step number");
    for (char c : s) {
      if (c < '0' || c > '9') throw bad("is not a step number");
      v = v * 10 + (c - '0');
    }
    return v;
  };
  const auto colon = text.find(':');
  o.first = number(std::string_view(text).substr(0, colon));
  o.last = colon == std::string::npos ? o.first : number(std::string_view(text).substr(colon + 1));
  if (o.first < 1) throw bad("starts before step 1");
  if (o.last < o.first) throw bad("ends before it starts");
}

namespace detail {

// Microseconds on the system clock for a steady-clock time, given one reading of both clocks.
struct ClockPair {
  Clock::time_point steady = Clock::now();
  std::chrono::system_clock::time_point system = std::chrono::system_clock::now();
  double unix_us(Clock::time_point t) const {
    const auto since =
        std::chrono::duration_cast<std::chrono::nanoseconds>(system.time_since_epoch()) +
        std::chrono::duration_cast<std::chrono::nanoseconds>(t - steady);
    // ~1.8e18 ns does not fit a double's 53 bits (256 ns steps); whole microseconds (~1.8e12) and
    // the rest do.
    return static_cast<double>(since.count() / 1000) +
           static_cast<double>(since.count() % 1000) / 1000.0;
  }
};

// Chrome "X" (complete) events. Main-track spans on tid 0; communication events on tids 1, 2, ...:
// the lowest lane whose previous event has ended, so every thread's spans nest.
inline nlohmann::json chrome_events(std::vector<trace::Event> events, int rank,
                                    const ClockPair& clock) {
  std::sort(events.begin(), events.end(), [](const trace::Event& a, const trace::Event& b) {
    return a.start != b.start ? a.start < b.start : a.end > b.end;  // parents before their children
  });
  nlohmann::json out = nlohmann::json::array();
  std::vector<Clock::time_point> lane_end;  // per communication lane: the end of its last event
  for (const trace::Event& e : events) {
    int tid = 0;
    if (e.track == trace::kCommTrack) {
      std::size_t lane = 0;
      while (lane < lane_end.size() && lane_end[lane] > e.start) ++lane;
      if (lane == lane_end.size()) lane_end.push_back(e.end);
      lane_end[lane] = e.end;
      tid = 1 + static_cast<int>(lane);
    }
    nlohmann::json args = nlohmann::json::object();
    for (const trace::Arg& a : e.args) {
      if (a.is_number)
        args[a.key] = a.number;
      else
        args[a.key] = a.text;
    }
    const double ts = clock.unix_us(e.start);
    out.push_back({{"ph", "X"},
                   {"name", e.name},
                   {"cat", e.category},
                   {"pid", rank},
                   {"tid", tid},
                   {"ts", ts},
                   {"dur", std::max(0.0, clock.unix_us(e.end) - ts)},
                   {"args", std::move(args)}});
  }
  return out;
}

// Every rank's events shifted so the earliest starts at 0, with process and thread names.
// `per_rank[r]` is rank r's chrome_events.
inline nlohmann::json merge_chrome_trace(const std::vector<nlohmann::json>& per_rank,
                                         const TraceOptions& o) {
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& events : per_rank)
    for (const auto& e : events) origin = std::min(origin, e["ts"].get<double>());
  if (!std::isfinite(origin)) origin = 0.0;
  nlohmann::json all = nlohmann::json::array();
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    const int pid = static_cast<int>(r);
    all.push_back({{"ph", "M"},
                   {"name", "process_name"},
                   {"pid", pid},
                   {"args", {{"name", ddp::detail::str("rank ", r)}}}});
    all.push_back({{"ph", "M"},
                   {"name", "process_sort_index"},
                   {"pid", pid},
                   {"args", {{"sort_index", pid}}}});
    all.push_back({{"ph", "M"},
                   {"name", "thread_name"},
                   {"pid", pid},
                   {"tid", 0},
                   {"args", {{"name", "train"}}}});
    int lanes = 0;
    for (const auto& e : per_rank[r]) lanes = std::max(lanes, e["tid"].get<int>());
    for (int t = 1; t <= lanes; ++t)
      all.push_back(
          {{"ph", "M"},
           {"name", "thread_name"},
           {"pid", pid},
           {"tid", t},
           {"args",
            {{"name", t == 1 ? std::string("all-reduce") : ddp::detail::str("all-reduce ", t)}}}});
    for (auto e : per_rank[r]) {
      e["ts"] = e["ts"].get<double>() - origin;
      all.push_back(std::move(e));
    }
  }
  return {{"traceEvents", std::move(all)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"producer", "ddp --trace"},
            {"start_unix_us", origin},
            {"ranks", per_rank.size()},
            {"steps", ddp::detail::str(o.first, ":", o.last)}}}};
}

// Every rank's string on every rank (collective): r broadcasts its length, then its bytes.
template <Device D>
std::vector<std::string> exchange_strings(comm::Communicator& comm, const Exec<D>& exec,
                                          const std::string& mine) {
  parallel::Broadcaster<D> bc(comm);
  const int world = comm.size();
  std::vector<std::string> all(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::int64_t n = r == comm.rank() ? static_cast<std::int64_t>(mine.size()) : 0;
    bc.broadcast_host(std::span<std::int64_t>(&n, 1), exec, r);
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n));
    if (r == comm.rank()) std::copy(mine.begin(), mine.end(), bytes.begin());
    bc.broadcast_host(std::span<std::uint8_t>(bytes), exec, r);
    all[static_cast<std::size_t>(r)].assign(bytes.begin(), bytes.end());
  }
  return all;
}

}  // namespace detail

// Every rank constructs one with the same options and calls begin_step/end_step for the same steps.
template <Device D>
class StepTracer {
 public:
  // On a GPU every span of a traced step waits for exec's stream before it ends: the trace shows
  // device time (serialising those steps). exec must outlive the tracer.
  StepTracer(comm::Communicator& comm, TraceOptions o, Exec<D>& exec)
      : comm_(&comm), o_(std::move(o)) {
    rec_.set_synchronize([&exec] { synchronize(exec); });  // a no-op on the CPU (tensor/device.hpp)
  }
  StepTracer(const StepTracer&) = delete;
  StepTracer& operator=(const StepTracer&) = delete;

  bool enabled() const noexcept { return !o_.path.empty(); }
  const TraceOptions& options() const noexcept { return o_; }

  // Step `step` (1-based over epochs) begins its compute: recording starts at o.first.
  void begin_step(long step) {
    if (enabled() && !written_ && step >= o_.first && step <= o_.last && !on_) on_.emplace(rec_);
  }
  // Adds the "step" span (from `started`, the previous step's end, so it includes the data wait)
  // and "data wait" (started .. got_batch); after o.last writes the trace (collective).
  void end_step(long step, Clock::time_point started, Clock::time_point got_batch,
                const Exec<D>& exec) {
    if (!on_) return;
    const Clock::time_point now = Clock::now();
    const trace::Arg number = trace::number_arg("step", static_cast<double>(step));
    rec_.add({.name = ddp::detail::str("step ", step),
              .category = "step",
              .start = started,
              .end = now,
              .track = trace::kMainTrack,
              .args = {number}});
    rec_.add({.name = "data wait",
              .category = "data",
              .start = started,
              .end = got_batch,
              .track = trace::kMainTrack,
              .args = {number}});
    if (step >= o_.last) write(exec);
  }
  // After training (collective): writes the trace if the run ended before o.last (before o.first:
  // no events, and rank 0 says so on stderr).
  void close(const Exec<D>& exec) {
    if (enabled() && !written_) write(exec);
  }

 private:
  void write(const Exec<D>& exec) {
    on_.reset();
    written_ = true;
    const std::string mine = detail::chrome_events(rec_.take(), comm_->rank(), clock_).dump();
    const std::vector<std::string> all = detail::exchange_strings(*comm_, exec, mine);
    if (comm_->rank() != 0) return;
    std::vector<nlohmann::json> per_rank;
    std::size_t events = 0;
    for (const std::string& s : all) {
      per_rank.push_back(nlohmann::json::parse(s));
      events += per_rank.back().size();
    }
    const std::string text = detail::merge_chrome_trace(per_rank, o_).dump();
    const auto* p = reinterpret_cast<const std::uint8_t*>(text.data());
    write_file_atomic(o_.path, {std::span<const std::uint8_t>(p, text.size())}, {},
                      "trace file (--trace)");
    if (events == 0)
      std::cerr
          << "ddp: --trace " << o_.path << ": no step in " << o_.first << ":" << o_.last
          << " ran, so the trace has no events; pick steps the run reaches with --trace-steps\n";
  }

  comm::Communicator* comm_;
  TraceOptions o_;
  trace::Recorder rec_;
  std::optional<trace::Activation> on_;  // recording
  detail::ClockPair clock_;
  bool written_ = false;
};

}  // namespace ddp::train
