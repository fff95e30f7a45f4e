// Bookkeeper: everything a training loop does around its step -- step timing, throughput, rank 0's
// progress line, the metrics records, the --trace steps, the snapshot cadence -- so that the loop
// shows only the step.
// SPDX-License-Identifier: MIT
//
//   train::Bookkeeper<D> book(comm, exec, {.steps_per_epoch = steps, .first_epoch = start,
//                                          .last_epoch = epochs - 1, .save_every = 1,
//                                          .metrics_file = ..., .trace = ...});
//   for (long epoch = start; epoch < epochs; ++epoch) {
//     book.start_epoch(epoch);
//     while (auto batch = loader.next()) {
//       book.got_batch();
//       ... zero_grad, forward, loss, backward, optimizer step ...
//       book.end_step({.loss = loss, .lr = opt.lr(), .samples = batch->size()},
//                     model.last_trace());
//     }
//     book.end_epoch(epoch, [&] {
//       train::save_snapshot_on_rank0(comm, path, exec, net, opt, {.epoch = epoch + 1});
//     });
//   }
//   const train::RunTotals t = book.finish();  // collective; t.samples_per_sec()
// Steps: step is 1-based within the epoch, global_step = (epoch - epoch_base) * steps_per_epoch +
// step (a resumed run continues the numbering); --trace-steps and the metrics records count so. A
// step's time runs from the previous step's end (or start_epoch) to end_step, data wait included.
// samples_per_sec: every rank's samples (this rank's times the world size) since construction,
// per second. Output on rank 0: the train::Progress line (live on a terminal, else a line every
// log_every steps unless progress_lines is false) and the metrics records (train/metrics.hpp:
// epoch, step, global_step, loss, lr, samples_per_sec, grad_norm, tokens_per_sec, the step's extra
// fields and step_record's timings); --trace (train/trace.hpp) is collective in end_step after the
// last traced step and in finish. Snapshots: end_epoch runs `save` on every rank (saving is
// collective) after every save_every-th epoch and after last_epoch, then after_snapshot_hook().
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <iostream>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/str.hpp"
#include "ddp/parallel/step_trace.hpp"
#include "ddp/tensor/caching_pool.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/train/metrics.hpp"
#include "ddp/train/progress.hpp"
#include "ddp/train/trace.hpp"

namespace ddp::train {

// Called on every rank after each snapshot a Bookkeeper saved, with the training communicator and
// the epoch as the program counts it. Empty in programs; a test links a translation unit that sets
// it before main (the exact-resume tests' die_after_epoch.cpp kills a rank there).
inline std::function<void(comm::Communicator&, long)>& after_snapshot_hook() {
  static std::function<void(comm::Communicator&, long)> hook;
  return hook;
}

// What one step did, for the progress line and the metrics record.
struct StepStats {
  double loss = 0;
  double lr = 0;
  std::size_t samples = 0;  // this rank's samples in the step (the last batch may be short)
  std::size_t tokens = 0;   // this rank's tokens (language models); > 0 adds tokens_per_sec
  // the norm before clipping; negative: none recorded (--clip-grad-norm off)
  double grad_norm = -1;
  // more fields of the metrics record (loss_scale, skipped)
  nlohmann::json extra = nlohmann::json::object();
};

// A run's totals (finish()): every rank's samples and tokens, the seconds since construction.
struct RunTotals {
  double seconds = 0;
  long long steps = 0;  // this rank's
  double samples = 0;
  double tokens = 0;
  double samples_per_sec() const { return seconds > 0 ? samples / seconds : 0.0; }
  double tokens_per_sec() const { return seconds > 0 ? tokens / seconds : 0.0; }
};

template <Device D>
class Bookkeeper {
 public:
  struct Options {
    long long steps_per_epoch = 0;  // per rank
    // the first epoch this run trains (after a resume: the first unfinished one)
    long first_epoch = 0;
    long last_epoch = 0;  // the last epoch (inclusive); always followed by a snapshot
    // the training's first epoch: 0, or 1 where epochs count from 1 (mingpt)
    long epoch_base = 0;
    long save_every = 1;  // a snapshot after every epoch with epoch % save_every == 0
    // plain progress: a line every this many steps (and at an epoch's last)
    long long log_every = 1;
    // false: no plain progress lines (the program prints its own); a live line stays
    bool progress_lines = true;
    // records carry data_ms (false where the batch is cut from memory: no wait)
    bool data_ms = true;
    std::string metrics_file;     // rank 0's JSON lines (--metrics-file; empty: none)
    std::string tensorboard_dir;  // rank 0's TensorBoard events (--tensorboard-dir; empty: none)
    TraceOptions trace;           // --trace, --trace-steps (path empty: none)
    // the GPU's tensor memory for the records; nullptr on the CPU
    MemoryStats (*device_memory)() = nullptr;
    // redraw one line; unset: live_progress_wanted() (DDP_PROGRESS, the terminal)
    std::optional<bool> live;
    std::ostream* out = &std::cout;            // the progress line's stream
    Clock::time_point (*now)() = &Clock::now;  // the clock (tests give a fake one)
  };

  // Opens rank 0's metrics outputs (IoError if one cannot be) and reads DDP_PROGRESS on every rank
  // (ConfigError for a bad value, so that all ranks stop). comm and exec must outlive it.
  Bookkeeper(comm::Communicator& comm, Exec<D>& exec, Options o)
      : comm_(&comm),
        exec_(&exec),
        o_(std::move(o)),
        live_(o_.live.value_or(live_progress_wanted()) && comm.rank() == 0),
        metrics_(comm.rank() == 0 ? o_.metrics_file : std::string(),
                 comm.rank() == 0 ? o_.tensorboard_dir : std::string()),
        tracer_(comm, o_.trace, exec),
        t0_(o_.now()),
        progress_(*o_.out,
                  {.total_steps = (o_.last_epoch - o_.first_epoch + 1) * o_.steps_per_epoch,
                   .log_every = o_.log_every,
                   .live = live_},
                  t0_),
        start_(t0_),
        got_(t0_) {
    if (o_.save_every < 1) o_.save_every = 1;
  }
  Bookkeeper(const Bookkeeper&) = delete;
  Bookkeeper& operator=(const Bookkeeper&) = delete;

  // Epoch `epoch` begins: its first step's clock starts here (the first batch's wait counts).
  void start_epoch(long epoch) {
    epoch_ = epoch;
    step_ = 0;
    start_ = epoch_start_ = o_.now();
  }

  // The step's batch is there: the data wait ends and the step's compute begins (--trace records
  // from here). Returns the step's global_step.
  long long got_batch() {
    got_ = o_.now();
    ++step_;
    tracer_.begin_step(static_cast<long>(global_step()));
    return global_step();
  }

  // After the optimizer step: counts the step, ends its trace span (collective after
  // --trace-steps' last), prints rank 0's progress and writes its metrics record with the DDP
  // step's communication (`trace`: DistributedDataParallel::last_trace()).
  void end_step(const StepStats& s, const parallel::StepTrace& trace) {
    ++steps_;
    const auto world = static_cast<double>(comm_->size());
    samples_ += static_cast<double>(s.samples) * world;
    tokens_ += static_cast<double>(s.tokens) * world;
    const long long g = global_step();
    tracer_.end_step(static_cast<long>(g), start_, got_, *exec_);
    const Clock::time_point done = o_.now();
    const double secs = std::chrono::duration<double>(done - t0_).count();
    const double sps = secs > 0 ? samples_ / secs : 0.0;
    if (live_ || (o_.progress_lines && comm_->rank() == 0)) {
      std::string extra = ddp::detail::str("lr ", s.lr);
      if (s.tokens > 0)
        extra +=
            ddp::detail::str(" tokens/s ", static_cast<long long>(secs > 0 ? tokens_ / secs : 0.0));
      progress_.step(epoch_, step_, o_.steps_per_epoch, s.loss, sps, extra, done);
    }
    if (metrics_.enabled()) {
      nlohmann::json record{{"epoch", epoch_}, {"step", step_}, {"global_step", g},
                            {"loss", s.loss},  {"lr", s.lr},    {"samples_per_sec", sps}};
      if (!(s.grad_norm < 0)) record["grad_norm"] = s.grad_norm;  // NaN too (an overflowed step)
      if (s.tokens > 0) record["tokens_per_sec"] = secs > 0 ? tokens_ / secs : 0.0;
      record.update(s.extra);
      metrics_.write(step_record(
          std::move(record),
          {.start = start_,
           .got_batch = o_.data_ms ? std::optional<Clock::time_point>(got_) : std::nullopt,
           .done = done},
          trace, o_.device_memory));
    }
    start_ = o_.now();
  }

  // Whether epoch `epoch` ends with a snapshot: every save_every-th and the last.
  bool snapshot_due(long epoch) const {
    return epoch % o_.save_every == 0 || epoch == o_.last_epoch;
  }

  // Ends a live progress line; on a snapshot epoch runs `save` (every rank) and then
  // after_snapshot_hook(). Returns the seconds since start_epoch, the snapshot not counted.
  template <class Save>
  double end_epoch(long epoch, Save&& save) {
    const double secs = end_epoch(epoch);
    if (snapshot_due(epoch)) {
      std::forward<Save>(save)();
      if (const auto& hook = after_snapshot_hook()) hook(*comm_, epoch);
    }
    return secs;
  }
  // The same without snapshots.
  double end_epoch(long /*epoch*/) {
    progress_.end_epoch();
    return std::chrono::duration<double>(o_.now() - epoch_start_).count();
  }

  // After training (collective): writes the --trace file if its last step was not reached.
  RunTotals finish() {
    tracer_.close(*exec_);
    return {.seconds = std::chrono::duration<double>(o_.now() - t0_).count(),
            .steps = steps_,
            .samples = samples_,
            .tokens = tokens_};
  }

  // 1-based within the epoch; 0 before its first batch
  long long step() const noexcept { return step_; }
  long long global_step() const noexcept {
    return (epoch_ - o_.epoch_base) * o_.steps_per_epoch + step_;
  }

 private:
  comm::Communicator* comm_;
  Exec<D>* exec_;
  Options o_;
  bool live_;
  MetricsWriter metrics_;
  StepTracer<D> tracer_;
  Clock::time_point t0_;
  Progress progress_;
  Clock::time_point start_, got_, epoch_start_;
  long epoch_ = 0;
  long long step_ = 0;               // within the epoch
  long long steps_ = 0;              // this run
  double samples_ = 0, tokens_ = 0;  // every rank's, this run
};

}  // namespace ddp::train
