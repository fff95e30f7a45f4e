// Ranks as processes inside one doctest case: the test binary re-runs itself (/proc/self/exe) once per rank,
// with only the current case, and each copy runs that rank's part over a FileStore they share.
// SPDX-License-Identifier: MIT
//
// Why processes and not threads: ranks that share a GPU must not share a CUDA context when a collective holds
// a stream (the staged gloo backend, docs/decisions/0023). In one process, one rank's work on the legacy
// default stream (an upload, a memset) waits for every blocking stream, the other rank's held one included,
// whose hold waits for this rank: the first GPU run (2026-11-27, H200) timed out that way in every test whose
// ranks were threads. Launchers start one process per rank, so this is also what users run.
//
//   TEST_CASE(kName) {
//     const auto me = ddp::test::as_rank_processes(kName, 2);  // the parent runs 2 ranks, CHECKs each passed
//     if (!me) return;
//     ddp::store::FileStore store(me->store_path);             // a rank's process: its part, checks included
//     ... rank me->rank of me->world ...
//   }
// A rank's doctest failures make its process exit non-zero; the parent reports each failed rank with the end
// of its output. Every process is reaped by the deadline (stragglers are killed).
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store/store.hpp"
#include "support/temp_dir.hpp"

namespace ddp::test {

struct RankProcess {
  int rank = 0;
  int world = 1;
  std::string store_path;  // the FileStore every rank opens
};

// This process's rank, when it is one of run_rank_processes' children (DDP_TEST_RANK_PROCESS="rank world path").
inline std::optional<RankProcess> rank_process() {
  const char* v = std::getenv("DDP_TEST_RANK_PROCESS");
  if (!v || !*v) return std::nullopt;
  RankProcess p;
  std::istringstream in(v);
  if (!(in >> p.rank >> p.world >> p.store_path)) return std::nullopt;
  return p;
}

// Runs the doctest case named `test_name` as `world` rank processes and CHECKs that each exits 0 within
// `timeout`. doctest filters split at commas and take * and ? as wildcards: a comma in the name becomes '?'.
inline void run_rank_processes(std::string test_name, int world,
                               std::chrono::seconds timeout = std::chrono::seconds(240)) {
  for (char& c : test_name)
    if (c == ',') c = '?';
  TempDir dir("ddp_ranks_");
  const std::string store = dir.file("store");
  struct Child {
    pid_t pid = -1;
    std::string log;
    int status = -1;
  };
  std::vector<Child> children(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    Child& c = children[static_cast<std::size_t>(r)];
    c.log = dir.file("rank" + std::to_string(r) + ".log");
    const std::string env = std::to_string(r) + " " + std::to_string(world) + " " + store;
    const std::string filter = "-tc=" + test_name;
    c.pid = ::fork();
    if (c.pid == 0) {  // only exec-safe calls until execl
      const int fd = ::open(c.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::setenv("DDP_TEST_RANK_PROCESS", env.c_str(), 1);
      ::execl("/proc/self/exe", "rank_process", filter.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    REQUIRE_MESSAGE(c.pid > 0, "fork failed for rank ", r);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (Child& c : children) {
    while (c.status == -1) {
      int st = 0;
      if (::waitpid(c.pid, &st, WNOHANG) == c.pid) {
        c.status = st;
      } else if (std::chrono::steady_clock::now() > deadline) {
        for (Child& k : children)
          if (k.status == -1) ::kill(k.pid, SIGKILL);
        ::waitpid(c.pid, &st, 0);
        c.status = st;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    const Child& c = children[static_cast<std::size_t>(r)];
    std::ifstream in(c.log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.size() > 6000) text = "..." + text.substr(text.size() - 6000);
    INFO("rank ", r, " of ", world, " (", test_name, "), its output:\n", text);
    const bool passed = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
    const std::string how = WIFSIGNALED(c.status) ? "killed by signal " + std::to_string(WTERMSIG(c.status))
                                                  : "exit status " + std::to_string(WEXITSTATUS(c.status));
    CHECK_MESSAGE(passed, how);
  }
}

// The usual shape of such a case: in the parent, runs it as `world` rank processes and returns nullopt (the
// parent's part is done); in a rank's process, returns its rank.
inline std::optional<RankProcess> as_rank_processes(const std::string& test_name, int world) {
  if (auto me = rank_process()) return me;
  run_rank_processes(test_name, world);
  return std::nullopt;
}

// What one rank hands the others for a comparison: `v` under `key` in the store (share), read back by any
// rank, waiting for it within the store's timeout (fetch).
template <class T>
void share(store::Store& store, const std::string& key, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  store.set(key, std::span<const std::uint8_t>(p, v.size() * sizeof(T)));
}
template <class T>
std::vector<T> fetch(store::Store& store, const std::string& key) {
  const auto bytes = store.get(key);
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace ddp::test
