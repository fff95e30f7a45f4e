// Progress: rank 0's report of a training run with an ETA, live on a terminal, plain lines in a
// log.
// SPDX-License-Identifier: MIT
//
//   train::Progress progress(std::cout, {.total_steps = (epochs - start_epoch) * steps,
//                                        .log_every = 10,
//                                        .live = train::live_progress_wanted()});
//   progress.step(epoch, step, steps, loss, samples_per_sec, "lr 0.1");  // each optimizer step
//   progress.end_epoch();                                                 // after each epoch
//
// Live (a terminal): one line redrawn in place ('\r', erase to end of line), at most every 100 ms
// and at each epoch's last step; end_epoch() keeps that line and starts the next.
// Plain (a pipe or file; or a terminal other ranks share, see stdout_shared_by): a line every
// log_every steps and at each epoch's last step:
//   "epoch 1 step 3/20 loss 2.3100 samples/s 812.5 lr 0.1 eta 0:42"
// ETA = steps left x the mean step time since this run's first step (so data loading and
// evaluation between epochs count): h:mm:ss, or m:ss under an hour.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>

#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/env/env.hpp"

namespace ddp::train {

// "epoch 1 step 3/20 loss 2.3100 samples/s 812.5": the fields every progress report starts with.
inline std::string progress_line(long long epoch, long long step, long long steps, double loss,
                                 double samples_per_sec) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "epoch %lld step %lld/%lld loss %.4f samples/s %.1f", epoch, step,
                steps, loss, samples_per_sec);
  return buf;
}

// The variable showing that a launcher puts other ranks' output on this process's terminal, or "".
// Their lines would be glued onto the open (unterminated) redrawn line, and a relaying launcher may
// hold an open line back until a newline.
//   OMPI_COMM_WORLD_SIZE  Open MPI's mpirun: each rank's stdout is a pty mpirun relays, so
//                         isatty() says yes although every rank ends up on mpirun's terminal
//   PMIX_RANK             PMIx launchers: Open MPI 5's prterun, PRRTE, srun --mpi=pmix, MPICH
//                         built with PMIx
//   PMI_RANK, PMI_ID      MPICH's Hydra (PMI_ID with -pmi-port), Intel MPI, Cray PALS,
//                         srun --mpi=pmi2 (pipes, which isatty() refuses; a pty would be shared)
//   MV2_COMM_WORLD_SIZE   MVAPICH2's mpirun_rsh (output relayed over ssh)
//   SLURM_STEP_ID         an srun task (srun relays every task's output; --pty gives task 0 a
//                         pty); an sbatch script has no step id and writes to its own file
//   LOCAL_WORLD_SIZE > 1  torchrun without --redirects/--tee: the node's workers share its
//                         terminal (one worker per node has it alone)
// ddprun needs no entry: its workers write to pipes, and on a terminal it sets DDP_PROGRESS=live
// for them and keeps rank 0's line below the others (launch/supervisor.hpp).
inline std::string_view stdout_shared_by(const env::Env& env) {
  for (std::string_view v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_ID",
                             "MV2_COMM_WORLD_SIZE", "SLURM_STEP_ID"})
    if (env.has(v)) return v;
  if (const auto n = env.get("LOCAL_WORLD_SIZE"); n && env::detail::parse_int(*n).value_or(1) > 1)
    return "LOCAL_WORLD_SIZE";
  return {};
}

// Whether rank 0 should redraw one line: DDP_PROGRESS=live or lines decides; unset or auto, stdout
// must be a terminal that understands '\r' and erase-line (TERM set, not "dumb") and not shared
// with other ranks (stdout_shared_by). Throws ConfigError for any other DDP_PROGRESS.
inline bool live_progress_wanted(const env::Env& env, bool stdout_is_terminal) {
  const std::string mode = env.get("DDP_PROGRESS").value_or("auto");
  if (mode == "live") return true;
  if (mode == "lines") return false;
  if (mode != "auto")
    throw ConfigError(
        ddp::detail::str("DDP_PROGRESS='", mode, "' is not one of auto, live, lines"));
  const std::string term = env.get("TERM").value_or("");
  return stdout_is_terminal && !term.empty() && term != "dumb" && stdout_shared_by(env).empty();
}

// The same for this process: its environment and its stdout.
inline bool live_progress_wanted() {
  return live_progress_wanted(env::Env::process(), ::isatty(STDOUT_FILENO) == 1);
}

// "h:mm:ss", or "m:ss" under an hour; seconds rounded up (a countdown that shows 0:00 is done).
inline std::string format_eta(double seconds) {
  const long long s = seconds <= 0 ? 0 : static_cast<long long>(seconds + 0.999);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

class Progress {
 public:
  struct Options {
    long long total_steps = 0;  // steps this run will take (all epochs left); <= 0: no ETA
    // plain mode: a line every this many steps (and at an epoch's last step)
    long long log_every = 1;
    bool live = false;  // redraw one line in place (live_progress_wanted())
    std::chrono::milliseconds redraw_every{100};  // live mode: at most this often
  };

  Progress(std::ostream& out, Options o, Clock::time_point start = Clock::now())
      : out_(out), o_(o), start_(start) {
    if (o_.log_every < 1) o_.log_every = 1;
  }
  ~Progress() {
    // a live line ends before whatever the program prints next
    if (open_) out_ << '\n' << std::flush;
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `step` is 1-based; `extra` (e.g. "lr 0.1") goes before the ETA.
  void step(long long epoch, long long step, long long steps, double loss, double samples_per_sec,
            std::string_view extra = {}, Clock::time_point now = Clock::now()) {
    ++done_;
    const bool last = step == steps;
    if (o_.live) {
      if (!last && open_ && now - drawn_ < o_.redraw_every) return;
      drawn_ = now;
      out_ << '\r' << line(epoch, step, steps, loss, samples_per_sec, extra, now) << "\033[K"
           << std::flush;
      open_ = true;
    } else if (step % o_.log_every == 0 || last) {
      out_ << line(epoch, step, steps, loss, samples_per_sec, extra, now) << std::endl;
    }
  }

  // Live mode: keeps the epoch's last line on screen and starts a new one for the next epoch.
  void end_epoch() {
    if (open_) out_ << '\n' << std::flush;
    open_ = false;
  }

 private:
  // progress_line's fields, `extra`, then "eta m:ss" when the total is known.
  std::string line(long long epoch, long long step, long long steps, double loss,
                   double samples_per_sec, std::string_view extra, Clock::time_point now) const {
    std::string s = progress_line(epoch, step, steps, loss, samples_per_sec);
    if (!extra.empty()) s.append(" ").append(extra);
    if (o_.total_steps > 0 && done_ > 0) {
      const double per_step =
          std::chrono::duration<double>(now - start_).count() / static_cast<double>(done_);
      const long long left = o_.total_steps > done_ ? o_.total_steps - done_ : 0;
      s.append(" eta ").append(format_eta(per_step * static_cast<double>(left)));
    }
    return s;
  }

  std::ostream& out_;
  Options o_;
  Clock::time_point start_;
  Clock::time_point drawn_{};
  long long done_ = 0;  // steps reported this run
  bool open_ = false;   // live mode: a line is on screen without its newline
};

}  // namespace ddp::train
