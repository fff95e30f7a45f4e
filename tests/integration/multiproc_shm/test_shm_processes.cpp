// kill -9 of one of 4 local ranks in the middle of shared-memory all-reduces: every other rank exits 1
// within seconds naming the dead rank (its TCP socket is the liveness channel), and /dev/shm keeps no
// ddp-* entry (the segment was unlinked as soon as every rank mapped it). Killing rank 0, the segment's
// creator, is tested too. /proc/<pid>/maps shows that every rank really maps a (deleted) segment.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/core/str.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "support/worker_procs.hpp"

#ifndef DDP_COMM_WORKER
#error "DDP_COMM_WORKER must name the comm_worker executable"
#endif

using namespace std::chrono_literals;

namespace {

using ddp::test::Proc;
using ddp::test::reap_all;
using ddp::test::slurp;

Proc spawn(int rank, int world, std::uint16_t port, long timeout_ms) {
  return ddp::test::spawn_worker(DDP_COMM_WORKER, "ddp_shm_worker", rank, world, port, "allreduce_loop", timeout_ms);
}

// The /dev/shm/ddp-<pid>-<nonce> entries created by these processes. Segments are named after their creator's
// pid, so entries of tests running at the same time (ctest -j, the sanitizer scripts) are not counted.
std::set<std::string> shm_entries_of(const std::vector<Proc>& procs) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    for (const auto& p : procs)
      if (name.rfind(ddp::detail::str("ddp-", p.pid, '-'), 0) == 0) out.insert(name);
  }
  return out;
}

void kill_one_mid_allreduce(int victim) {
  constexpr long kTimeoutMs = 20000;
  ddp::store::TcpStoreServer server("127.0.0.1", 0);
  std::vector<Proc> procs;
  for (int r = 0; r < 4; ++r) procs.push_back(spawn(r, 4, server.port(), kTimeoutMs));
  ddp::store::TcpStore store("127.0.0.1", server.port(), {.timeout = 30s});
  store.wait("looping");  // rank 0 finished one all-reduce: the segment is mapped everywhere and unlinked
  CHECK(shm_entries_of(procs).empty());
  for (const auto& p : procs) {  // each rank maps the segment, whose name is already gone
    const std::string maps = slurp(ddp::detail::str("/proc/", p.pid, "/maps"));
    const auto at = maps.find("/dev/shm/ddp-");
    CHECK_MESSAGE(at != std::string::npos, "pid ", p.pid, " maps no ddp shared-memory segment");
    if (at != std::string::npos) CHECK(maps.substr(at, maps.find('\n', at) - at).find("(deleted)") != std::string::npos);
  }
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(procs[static_cast<std::size_t>(victim)].pid, SIGKILL);
  const bool reaped = reap_all(procs, killed_at + std::chrono::milliseconds(kTimeoutMs) + 5s);
  const auto took = std::chrono::steady_clock::now() - killed_at;
  CHECK(reaped);
  MESSAGE("every rank exited ", std::chrono::duration_cast<std::chrono::milliseconds>(took).count(),
          " ms after the kill of rank ", victim);
  CHECK(took < 5s);
  CHECK(WIFSIGNALED(procs[static_cast<std::size_t>(victim)].status));
  for (int r = 0; r < 4; ++r) {
    if (r == victim) continue;
    const std::string err = slurp(procs[static_cast<std::size_t>(r)].log);
    INFO("rank ", r, ": ", err);
    CHECK(WIFEXITED(procs[static_cast<std::size_t>(r)].status));
    CHECK(WEXITSTATUS(procs[static_cast<std::size_t>(r)].status) == 1);
    CHECK(err.find(ddp::detail::str("rank ", victim, " closed its connection (process died?)")) != std::string::npos);
    CHECK(err.find(ddp::detail::str("ddp[rank ", r, "/4]: all_reduce #")) != std::string::npos);
  }
  CHECK(shm_entries_of(procs).empty());  // nothing left behind, even by the killed process
  for (auto& p : procs) ::unlink(p.log.c_str());
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("multiproc shm: kill -9 of rank 2 mid all-reduce fails every other rank promptly, naming rank 2") {
    kill_one_mid_allreduce(2);
  }

  TEST_CASE("multiproc shm: kill -9 of rank 0 (the segment's creator) fails the others promptly") {
    kill_one_mid_allreduce(0);
  }
}
