// Supervisor: runs N worker processes, prefixes their output, stops all when one fails, restarts
// them.
// SPDX-License-Identifier: MIT (Linux only)
//
// One attempt starts every worker (spawn_process: own process group, stdout and stderr into two
// pipes each), then polls the signalfd and all pipes, waking at least every monitor_interval:
//   - pipe data: LinePrefixer cuts it into whole "[rank3]: ..." lines, one write(2) each; on a
//     terminal (live_status) a worker's redrawn status line stays below them;
//   - a worker exits != 0 (or by a signal) while the job runs: the first failure; every group
//     gets SIGTERM, and SIGKILL after grace_period;
//   - SIGINT/SIGTERM/SIGHUP/SIGQUIT to the supervisor: forwarded to every group, same grace period;
//     a second one sends SIGKILL at once; no restart follows;
//   - all workers exited 0: groups still holding processes (background children) are stopped the
//     same way, so nothing outlives the job.
// An attempt ends when every worker is reaped and every group is empty; the remaining output is
// then flushed. After a failure with restarts left, the next attempt gets restart_count + 1.
// Example: 2 workers, max_restarts 1; attempt 0: rank 1 exits 3 -> rank 0 gets SIGTERM, exits 143
// (not counted as a failure) -> attempt 1 with TORCHELASTIC_RESTART_COUNT=1: both exit 0 -> exit
// code 0. With max_restarts 0: exit code 3 (the first failure's code; 128 + n for signal n).
//
// The supervisor makes itself a child subreaper (PR_SET_CHILD_SUBREAPER) and reaps with
// waitpid(-1): it owns every child of the calling process while run() executes. Not thread-safe;
// one run() at a time.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/clock.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/launch/line_prefixer.hpp"
#include "ddp/launch/process.hpp"

namespace ddp::launch {

struct SupervisorOptions {
  int nproc = 1;  // workers per attempt
  // global rank of local worker 0 (for the prefixes)
  int first_rank = 0;
  int max_restarts = 0;
  std::chrono::milliseconds grace_period{5000};     // SIGTERM -> SIGKILL
  std::chrono::milliseconds monitor_interval{100};  // longest poll() sleep
  int stdout_fd = STDOUT_FILENO;                    // where the workers' prefixed stdout lines go
  int stderr_fd = STDERR_FILENO;                    // ... and their stderr lines
  // stdout_fd is a terminal: a worker's redrawn line (rank 0's live progress) stays at the bottom,
  // the other output scrolls above (detail::Console).
  bool live_status = false;
  // adopt and reap the workers' orphaned descendants
  bool subreaper = true;
};

// The process for `local_rank` on attempt `restart_count`; the supervisor fills in stdout/stderr.
using WorkerFactory = std::function<SpawnRequest(int local_rank, int restart_count)>;

struct SupervisorResult {
  // 0, the first failing worker's code, or 128 + the signal ddprun received
  int exit_code = 0;
  int restarts = 0;         // attempts after the first
  int failed_rank = -1;     // global rank of the first failure of the last attempt; -1 if none
  int signal_received = 0;  // SIGINT/SIGTERM/... that stopped the job; 0 if none
  std::vector<pid_t> pids;  // every worker pid started, all attempts (tests check they are gone)
};

namespace detail {

inline void write_all(int fd, std::string_view data) noexcept {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      ::poll(&p, 1, 100);
      continue;
    }
    // EPIPE and the like: the reader is gone; drop the output, keep supervising
    if (n <= 0) return;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

// With `live`, the status line a worker redraws (LinePrefixer::take_status) stays the last line of
// status_fd: other output erases it, is written, and the status is redrawn under it.
class Console {
 public:
  Console(bool live, int status_fd) : live_(live), status_fd_(status_fd) {}
  // Complete lines to `fd`.
  void write(int fd, std::string_view text) {
    if (text.empty()) return;
    if (!status_.empty()) write_all(status_fd_, "\r\x1b[K");
    write_all(fd, text);
    if (!status_.empty()) write_all(status_fd_, status_);
  }
  // A worker's status changed (empty: its line was finished or it ended).
  void set_status(std::string s) {
    if (!live_ || s == status_) return;
    status_ = std::move(s);
    write_all(status_fd_, "\r\x1b[K" + status_);
  }

 private:
  bool live_;
  int status_fd_;
  std::string status_;  // shown at the bottom; empty: none
};

struct Stream {
  Fd fd;  // read end of the worker's pipe; invalid once EOF was seen
  LinePrefixer lines;
  int out_fd;  // where prefixed lines go
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;  // also the process group id
  bool exited = false;
  int status = 0;  // waitpid status once exited
  Stream out, err;
};

inline bool group_alive(pid_t pgid) noexcept { return ::kill(-pgid, 0) == 0 || errno == EPERM; }

}  // namespace detail

class Supervisor {
 public:
  // `signals` must block SIGCHLD and the signals to forward (SIGINT, SIGTERM, SIGHUP, SIGQUIT).
  Supervisor(SupervisorOptions options, SignalChannel& signals)
      : o_(std::move(options)), signals_(signals), console_(o_.live_status, o_.stdout_fd) {}

  // Runs attempts until success, a failure with no restart left, or a signal. Throws Error if a
  // worker cannot be started (after stopping and reaping those started). Never exits the process.
  SupervisorResult run(const WorkerFactory& make) {
    struct Subreaper {  // on for the run, off again however run() ends
      bool on;
      explicit Subreaper(bool enable) : on(enable) {
        if (on) ::prctl(PR_SET_CHILD_SUBREAPER, 1);
      }
      ~Subreaper() {
        if (on) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
      }
    } subreaper(o_.subreaper);
    SupervisorResult result;
    for (int attempt = 0;; ++attempt) {
      result.restarts = attempt;
      const Attempt a = run_attempt(make, attempt, result.pids);
      result.failed_rank = a.failed_rank;
      result.signal_received = a.signal;
      if (a.signal != 0) {
        result.exit_code = a.failed_rank >= 0 ? a.exit_code : 128 + a.signal;
        break;
      }
      if (a.failed_rank < 0) {
        result.exit_code = 0;
        break;
      }
      result.exit_code = a.exit_code;
      if (attempt >= o_.max_restarts) {
        if (o_.max_restarts > 0)
          DDP_LOG_ERROR("ddprun: giving up after ", o_.max_restarts, " restart(s) (--max-restarts ",
                        o_.max_restarts, "); exit code ", a.exit_code);
        break;
      }
      DDP_LOG_WARN("ddprun: restarting all ", o_.nproc, " workers (restart ", attempt + 1, " of ",
                   o_.max_restarts, ")");
    }
    return result;
  }

 private:
  struct Attempt {
    int failed_rank = -1;
    int exit_code = 0;
    int signal = 0;
  };

  Attempt run_attempt(const WorkerFactory& make, int restart_count, std::vector<pid_t>& all_pids) {
    std::vector<detail::Worker> workers;
    workers.reserve(static_cast<std::size_t>(o_.nproc));
    Attempt a;
    // set while stopping: when SIGTERM turns into SIGKILL
    std::optional<Clock::time_point> kill_at;
    bool stopping = false, killed = false;

    auto stop_all = [&](int sig) {
      for (auto& w : workers)
        if (w.pid > 0) ::kill(-w.pid, sig);
      if (sig == SIGKILL) {
        killed = true;
      } else if (!stopping) {
        kill_at = Clock::now() + o_.grace_period;
      }
      stopping = true;
    };

    try {
      for (int i = 0; i < o_.nproc; ++i) {
        Pipe out = make_pipe(), err = make_pipe();
        SpawnRequest req = make(i, restart_count);
        req.stdout_fd = out.write.get();
        req.stderr_fd = err.write.get();
        const int rank = o_.first_rank + i;
        const std::string prefix = ddp::detail::str("[rank", rank, "]: ");
        const pid_t pid = spawn_process(req);
        all_pids.push_back(pid);
        workers.push_back(
            detail::Worker{.rank = rank,
                           .pid = pid,
                           .out = {std::move(out.read), LinePrefixer(prefix), o_.stdout_fd},
                           .err = {std::move(err.read), LinePrefixer(prefix), o_.stderr_fd}});
      }
    } catch (...) {
      stop_all(SIGKILL);
      for (auto& w : workers) {
        int st = 0;
        while (::waitpid(w.pid, &st, 0) < 0 && errno == EINTR) {
        }
      }
      throw;
    }

    for (;;) {
      // 1. Wait for output, a signal, or the next deadline.
      auto timeout = o_.monitor_interval;
      if (kill_at && !killed)
        timeout = std::clamp(
            std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at - Clock::now()) +
                std::chrono::milliseconds(1),
            std::chrono::milliseconds(0), timeout);
      std::vector<pollfd> fds{{.fd = signals_.fd(), .events = POLLIN, .revents = 0}};
      std::vector<detail::Stream*> streams;
      for (auto& w : workers)
        for (detail::Stream* s : {&w.out, &w.err})
          if (s->fd.valid()) {
            fds.push_back({.fd = s->fd.get(), .events = POLLIN, .revents = 0});
            streams.push_back(s);
          }
      if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) < 0 && errno != EINTR)
        throw Error(ddp::detail::str("ddp: ddprun: poll failed: ", errno_text(errno)));

      // 2. Output.
      for (std::size_t k = 0; k < streams.size(); ++k)
        if (fds[k + 1].revents != 0) pump(*streams[k]);

      // 3. Signals to forward (SIGCHLD only wakes us up; reaping below covers it).
      for (int sig : signals_.drain()) {
        if (sig == SIGCHLD || sig == SIGPIPE) continue;
        if (a.signal == 0) {
          a.signal = sig;
          DDP_LOG_WARN("ddprun: received SIG", ::sigabbrev_np(sig),
                       "; forwarding it to all workers (SIGKILL after ", o_.grace_period.count(),
                       " ms)");
          for (auto& w : workers) ::kill(-w.pid, sig);
          if (!stopping) {
            stopping = true;
            kill_at = Clock::now() + o_.grace_period;
          }
        } else if (!killed) {
          DDP_LOG_WARN("ddprun: second signal (SIG", ::sigabbrev_np(sig),
                       "); killing all workers now");
          stop_all(SIGKILL);
        }
      }

      // 4. Reap. Unknown pids are descendants adopted as subreaper. When several workers failed
      // before this look (a rank killed, its peers failing within milliseconds), waitpid returns
      // them by rank, not by time: name one killed by a signal (the likely cause), else the first.
      int status = 0;
      pid_t pid;
      const detail::Worker* first_failed = nullptr;
      while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
        for (auto& w : workers) {
          if (w.pid != pid) continue;
          w.exited = true;
          w.status = status;
          const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
          if (failed && (first_failed == nullptr ||
                         (WIFSIGNALED(status) && !WIFSIGNALED(first_failed->status))))
            first_failed = &w;
        }
      }
      if (first_failed != nullptr && !stopping) {
        a.failed_rank = first_failed->rank;
        a.exit_code = exit_code_of(first_failed->status);
        DDP_LOG_ERROR("ddprun: worker rank ", first_failed->rank, " (pid ", first_failed->pid,
                      ") failed with ", describe_status(first_failed->status),
                      "; stopping the other workers (SIGTERM, SIGKILL after ",
                      o_.grace_period.count(), " ms)");
        stop_all(SIGTERM);
      }

      // 5. All workers done: stop what they left behind, then finish when every group is empty.
      const bool all_exited =
          std::all_of(workers.begin(), workers.end(), [](const auto& w) { return w.exited; });
      if (all_exited) {
        const bool any_alive = std::any_of(workers.begin(), workers.end(), [](const auto& w) {
          return detail::group_alive(w.pid);
        });
        if (!any_alive) break;
        if (!stopping) stop_all(SIGTERM);
      }
      if (stopping && !killed && kill_at && Clock::now() >= *kill_at) {
        DDP_LOG_WARN("ddprun: grace period of ", o_.grace_period.count(),
                     " ms over; sending SIGKILL");
        stop_all(SIGKILL);
      }
    }

    // Every writer is gone (or escaped into another session): flush what is buffered and close.
    for (auto& w : workers)
      for (detail::Stream* s : {&w.out, &w.err}) {
        if (s->fd.valid()) pump(*s, 1 << 20);
        emit(*s, s->lines.finish());
        s->fd.reset();
      }
    return a;
  }

  // Reads at most `max_reads` chunks (a chatty worker cannot starve the others) and writes the
  // complete lines; at EOF flushes the tail and closes.
  void pump(detail::Stream& s, int max_reads = 16) {
    char buf[65536];
    for (int i = 0; i < max_reads; ++i) {
      const ssize_t n = ::read(s.fd.get(), buf, sizeof buf);
      if (n > 0) {
        emit(s, s.lines.feed(std::string_view(buf, static_cast<std::size_t>(n))));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || errno != EAGAIN) {
        emit(s, s.lines.finish());
        s.fd.reset();
      }
      return;
    }
  }

  // A cleared status is erased before the lines (the finished line replaces it), a new one after.
  void emit(detail::Stream& s, std::string_view lines) {
    const std::optional<std::string> status = s.lines.take_status();
    if (status && status->empty()) console_.set_status({});
    console_.write(s.out_fd, lines);
    if (status && !status->empty()) console_.set_status(*status);
  }

  SupervisorOptions o_;
  SignalChannel& signals_;
  detail::Console console_;
};

}  // namespace ddp::launch
