// WaitReport: while a rank blocks at rendezvous, says every interval whom it is waiting for, at
// info level.
// SPDX-License-Identifier: MIT
//
//   WaitReport report(timeout, ddp::detail::str("rank ", j, " to join"), "; is it started?");
//   store.wait(keys, timeout);      // every 20 s: "ddp[rank 0/2] INFO: waiting for rank 1 to join
//     (20 s of 300 s);
//                                   //              is it started?"
//
// Without it a rank whose peer never started is silent for the whole timeout (300 s by default),
// and users kill it before the error that names the peer (docs/decisions/0066). A thread of its
// own, so the wait it watches keeps its own deadline and error message; it is created once per
// rendezvous step, never per collective. The interval is 20 s, inside the 10-30 s band where a user
// still waits; tests shorten it with set_wait_report_interval(). The times printed are the
// interval's multiples, not measured.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"

namespace ddp {

namespace detail {
inline std::atomic<std::int64_t>& wait_report_interval_ms() {
  static std::atomic<std::int64_t> ms{20000};
  return ms;
}
// "20 s" when the timeout is at least 10 s, else "150 ms".
inline std::string wait_report_time(std::chrono::milliseconds t, bool seconds) {
  return seconds ? str(t.count() / 1000, " s") : str(t.count(), " ms");
}
}  // namespace detail

// Process-wide; 0 turns the reports off.
inline void set_wait_report_interval(std::chrono::milliseconds every) noexcept {
  detail::wait_report_interval_ms().store(every.count());
}

class WaitReport {
 public:
  // `who` completes "waiting for ...", `hint` follows the times. Reports stop at `timeout` or
  // destruction.
  WaitReport(std::chrono::milliseconds timeout, std::string who, std::string hint = {})
      : timeout_(timeout),
        every_(detail::wait_report_interval_ms().load()),
        who_(std::move(who)),
        hint_(std::move(hint)) {
    if (every_.count() > 0 && every_ < timeout_) thread_ = std::thread([this] { run(); });
  }
  WaitReport(const WaitReport&) = delete;
  WaitReport& operator=(const WaitReport&) = delete;
  ~WaitReport() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  // Changes whom the next reports name (e.g. fewer ranks left to connect).
  void set_who(std::string who) {
    std::lock_guard lock(mu_);
    who_ = std::move(who);
  }

 private:
  void run() {
    const auto start = std::chrono::steady_clock::now();
    const bool seconds = timeout_ >= std::chrono::seconds(10);
    std::unique_lock lock(mu_);
    for (std::chrono::milliseconds at = every_; at < timeout_; at += every_) {
      if (cv_.wait_until(lock, start + at, [this] { return done_; })) return;
      DDP_LOG_INFO("waiting for ", who_, " (", detail::wait_report_time(at, seconds), " of ",
                   detail::wait_report_time(timeout_, seconds), ')', hint_);
    }
  }

  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds every_;
  std::string who_;
  std::string hint_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started after every other member is ready
};

}  // namespace ddp
