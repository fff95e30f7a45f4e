// Multi-process test helpers: start a worker executable per rank with its stderr in a log file, read the
// log, and reap every process by a deadline (killing stragglers), so no test leaves a process behind.
// SPDX-License-Identifier: MIT
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "support/files.hpp"

namespace ddp::test {

struct Proc {
  pid_t pid = -1;
  std::string log;  // the worker's stderr
  int status = -1;  // waitpid status once reaped
};

// Runs `worker rank world port scenario timeout_ms` with stderr in /tmp/<tag>_<pid>_<rank>.log.
inline Proc spawn_worker(const char* worker, const std::string& tag, int rank, int world, std::uint16_t port,
                         const std::string& scenario, long timeout_ms) {
  Proc p;
  p.log = "/tmp/" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(rank) + ".log";
  const std::string r = std::to_string(rank), w = std::to_string(world), pt = std::to_string(port),
                    t = std::to_string(timeout_ms);
  p.pid = ::fork();
  if (p.pid == 0) {
    int fd = ::open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    ::execl(worker, worker, r.c_str(), w.c_str(), pt.c_str(), scenario.c_str(), t.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return p;
}

// Reaps every process by the deadline; kills the ones still running after it and returns false.
inline bool reap_all(std::vector<Proc>& procs, std::chrono::steady_clock::time_point deadline) {
  bool all = true;
  for (auto& p : procs) {
    while (p.status == -1) {
      int st = 0;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.status = st;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, &st, 0);
        p.status = st;
        all = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the reaper's polling interval
    }
  }
  return all;
}

}  // namespace ddp::test
