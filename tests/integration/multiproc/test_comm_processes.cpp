// Multi-process tests of the tcp backend over a real TcpStore: a clean run exits 0, and kill -9 of one
// rank in the middle of a large all-reduce makes every other rank exit non-zero promptly, naming it.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

Proc spawn(int rank, int world, std::uint16_t port, const std::string& scenario, long timeout_ms) {
  return ddp::test::spawn_worker(DDP_COMM_WORKER, "ddp_comm_worker", rank, world, port, scenario, timeout_ms);
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("multiproc tcp: 4 processes all-reduce 16 MiB and exit 0") {
    ddp::store::TcpStoreServer server("127.0.0.1", 0);
    std::vector<Proc> procs;
    for (int r = 0; r < 4; ++r) procs.push_back(spawn(r, 4, server.port(), "allreduce_once", 20000));
    CHECK(reap_all(procs, std::chrono::steady_clock::now() + 60s));
    for (auto& p : procs) {
      INFO(slurp(p.log));
      CHECK(WIFEXITED(p.status));
      CHECK(WEXITSTATUS(p.status) == 0);
      ::unlink(p.log.c_str());
    }
  }

  TEST_CASE("multiproc tcp: kill -9 of rank 2 mid all-reduce fails every other rank promptly, naming rank 2") {
    constexpr long kTimeoutMs = 20000;
    ddp::store::TcpStoreServer server("127.0.0.1", 0);
    std::vector<Proc> procs;
    for (int r = 0; r < 4; ++r) procs.push_back(spawn(r, 4, server.port(), "allreduce_loop", kTimeoutMs));
    ddp::store::TcpStore store("127.0.0.1", server.port(), {.timeout = 30s});
    store.wait("looping");  // rank 0 finished one all-reduce: the loop is running
    const auto killed_at = std::chrono::steady_clock::now();
    ::kill(procs[2].pid, SIGKILL);
    const bool reaped = reap_all(procs, killed_at + std::chrono::milliseconds(kTimeoutMs) + 5s);
    const auto took = std::chrono::steady_clock::now() - killed_at;
    CHECK(reaped);  // no process left behind
    MESSAGE("every rank exited ", std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), " ms after the kill");
    CHECK(took < 5s);  // promptly: nobody waits for the 20 s timeout
    CHECK(WIFSIGNALED(procs[2].status));
    for (int r : {0, 1, 3}) {
      const std::string err = slurp(procs[static_cast<std::size_t>(r)].log);
      INFO("rank ", r, ": ", err);
      CHECK(WIFEXITED(procs[static_cast<std::size_t>(r)].status));
      CHECK(WEXITSTATUS(procs[static_cast<std::size_t>(r)].status) == 1);
      CHECK(err.find("rank 2 closed its connection (process died?)") != std::string::npos);
      CHECK(err.find(ddp::detail::str("ddp[rank ", r, "/4]: all_reduce #")) != std::string::npos);
    }
    for (auto& p : procs) ::unlink(p.log.c_str());
  }
}
