// The mpi backend's watch over a shared-memory all-reduce (comm/mpi/shm_watch.hpp, docs/decisions/0055), without MPI:
// this process is rank 0 of a two-rank segment and a forked child plays rank 1 (it maps the segment through the
// fork), so each failure the watch must report is staged for real: a peer whose process exited, a peer that
// announced another collective, a peer that never arrives.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/comm/mpi/shm_watch.hpp"
#include "ddp/comm/shm/collectives.hpp"
#include "ddp/comm/shm/segment.hpp"
#include "ddp/core/error.hpp"

using namespace ddp;
using namespace std::chrono_literals;

namespace {

// A segment for ranks 0 and 1 of which only rank 0 (this process) takes part in the setup: every all-gather
// answers with this rank's value for both.
comm::shm::Segment two_rank_segment() {
  auto seg = comm::shm::Segment::create(
      [](const std::string&, const std::string& mine) { return std::vector<std::string>{mine, mine}; }, 0, 2, true,
      comm::shm::Collectives::segment_bytes(2), "nothing");
  REQUIRE(seg);
  return seg;
}

const comm::Fingerprint kAllReduce{.kind = comm::OpKind::AllReduce, .dtype = DType::F32, .op = comm::ReduceOp::Sum,
                                   .count = 4, .seq = 1};

// Forks rank 1: it maps `seg` (inherited), announces `announced` (unless its seq is 0), tells the parent, then
// exits at once (`stay` false) or waits to be killed. Returns its pid once it has announced.
pid_t fork_peer(comm::shm::Segment& seg, const comm::Fingerprint& announced, bool stay) {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the child: async-signal-safe work only, no destructors, no doctest
    comm::shm::Collectives peer(std::move(seg), 1, 2, 0);
    if (announced.seq != 0) peer.announce(announced);
    const char one = 1;
    (void)!::write(ready[1], &one, 1);
    if (!stay) ::_exit(0);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char got = 0;
  REQUIRE(::read(ready[0], &got, 1) == 1);
  ::close(ready[0]);
  return pid;
}

void reap(pid_t pid, bool kill_first) {
  if (kill_first) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("mpi shm watch: a peer whose process exited is named with its pid") {
    auto seg = two_rank_segment();
    const pid_t pid = fork_peer(seg, {}, false);
    reap(pid, false);  // gone, not a zombie: kill(pid, 0) now fails with ESRCH
    comm::shm::Collectives me(std::move(seg), 0, 2, 0);
    std::vector<float> v(4, 1.0f);
    try {
      me.all_reduce(comm::mpi::ShmWatch(kAllReduce, ddp::Clock::now() + 10s, me),
                    reinterpret_cast<std::byte*>(v.data()), v.size());
      FAIL("the all-reduce returned");
    } catch (const CommError& e) {
      CHECK(std::string(e.what()).find("rank 1 (pid " + std::to_string(pid) + ") exited") != std::string::npos);
    }
  }

  TEST_CASE("mpi shm watch: a peer that arrived and exited before the liveness check is no failure") {
    // The worst interleaving, forced: rank 1 arrives late (after this rank's spin phase), passes the barrier and
    // exits; this rank's liveness check runs only once it is gone and reaped, so the pid check fails, and the
    // arrival must still count.
    auto seg = two_rank_segment();
    const comm::Fingerprint barrier{.kind = comm::OpKind::Barrier, .dtype = DType::U8, .op = comm::ReduceOp::Max,
                                    .seq = 1};
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // rank 1
      comm::shm::Collectives peer(std::move(seg), 1, 2, 0);
      ::usleep(20'000);
      peer.announce(barrier);
      try {
        peer.barrier_op(comm::mpi::ShmWatch(barrier, ddp::Clock::now() + 10s, peer));
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    comm::shm::Collectives me(std::move(seg), 0, 2, 0);
    me.announce(barrier);
    struct LateWatch : comm::mpi::ShmWatch {
      using comm::mpi::ShmWatch::ShmWatch;
      pid_t child = 0;
      int status = -1;
      void check(int peer) {
        if (status == -1) ::waitpid(child, &status, 0);  // rank 1 is gone before its liveness is checked
        comm::mpi::ShmWatch::check(peer);
      }
    } w(barrier, ddp::Clock::now() + 10s, me);
    w.child = pid;
    CHECK_NOTHROW(me.barrier_op(w));
    if (w.status == -1) ::waitpid(pid, &w.status, 0);
    CHECK(WIFEXITED(w.status));
    CHECK(WEXITSTATUS(w.status) == 0);
  }

  TEST_CASE("mpi shm watch: a peer that announced another collective under this number is a ShmMismatch") {
    auto seg = two_rank_segment();
    const comm::Fingerprint broadcast{.kind = comm::OpKind::Broadcast, .dtype = DType::F32, .root = 0, .count = 4,
                                      .seq = 1};
    const pid_t pid = fork_peer(seg, broadcast, true);
    comm::shm::Collectives me(std::move(seg), 0, 2, 0);
    std::vector<float> v(4, 1.0f);
    const auto t0 = ddp::Clock::now();
    try {
      me.all_reduce(comm::mpi::ShmWatch(kAllReduce, t0 + 10s, me), reinterpret_cast<std::byte*>(v.data()), v.size());
      FAIL("the all-reduce returned");
    } catch (const comm::mpi::ShmMismatch& m) {
      CHECK(m.peer == 1);
      CHECK(m.theirs.kind == comm::OpKind::Broadcast);
      CHECK(m.theirs.seq == 1);
      CHECK(ddp::Clock::now() - t0 < 2s);  // seen while waiting, not at the deadline
    }
    reap(pid, true);
  }

  TEST_CASE("mpi shm watch: a peer that announced this op and never arrives times out, naming it") {
    auto seg = two_rank_segment();
    const pid_t pid = fork_peer(seg, kAllReduce, true);
    comm::shm::Collectives me(std::move(seg), 0, 2, 0);
    std::vector<float> v(4, 1.0f);
    const auto t0 = ddp::Clock::now();
    try {
      me.all_reduce(comm::mpi::ShmWatch(kAllReduce, t0 + 300ms, me), reinterpret_cast<std::byte*>(v.data()),
                    v.size());
      FAIL("the all-reduce returned");
    } catch (const TimeoutError& e) {
      CHECK(std::string(e.what()).find("waiting for rank 1 in shared memory") != std::string::npos);
      const auto took = ddp::Clock::now() - t0;
      CHECK(took >= 300ms);
      CHECK(took < 5s);
    }
    reap(pid, true);
  }

  TEST_CASE("mpi shm watch: a peer in another pid namespace is not taken for dead by its pid") {
    // Containers that share the kernel and /dev/shm but not pids: rank 1 publishes a pid that, in this
    // process's namespace, names no process at all. Staged for real: a child unshares a pid namespace, whose
    // init sets the namespace's next pid (ns_last_pid) so that rank 1 gets a pid that is free here; rank 1 then
    // announces the all-reduce and never arrives. The watch must wait out the deadline, not report an exit.
    const int pid_max = [] {
      int v = 32768;
      std::ifstream("/proc/sys/kernel/pid_max") >> v;
      return v;
    }();
    pid_t free_here = 0;  // a pid no process has in this namespace
    for (pid_t p = pid_max - 1; p > pid_max - 1000 && free_here == 0; --p)
      if (::kill(p, 0) != 0 && errno == ESRCH) free_here = p;
    REQUIRE(free_here > 1);
    auto seg = two_rank_segment();
    int ready[2], init_pid[2];
    REQUIRE(::pipe(ready) == 0);
    REQUIRE(::pipe(init_pid) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // async-signal-safe work only; 2: no pid namespace for us (not root)
      if (::unshare(CLONE_NEWPID) != 0) ::_exit(2);
      const pid_t init = ::fork();  // pid 1 of the new namespace
      if (init < 0) ::_exit(3);
      if (init == 0) {
        const int fd = ::open("/proc/sys/kernel/ns_last_pid", O_WRONLY);  // this namespace's: its init is in it
        char num[16];
        const auto end = std::to_chars(num, num + sizeof num, free_here - 1).ptr;
        if (fd < 0 || ::write(fd, num, static_cast<std::size_t>(end - num)) != end - num) ::_exit(4);
        ::close(fd);
        const pid_t rank1 = ::fork();
        if (rank1 < 0) ::_exit(5);
        if (rank1 == 0) {
          comm::shm::Collectives peer(std::move(seg), 1, 2, 0);
          peer.announce(kAllReduce);
          const char got = ::getpid() == free_here ? 1 : 0;
          (void)!::write(ready[1], &got, 1);
          for (;;) ::pause();
        }
        int st = 0;
        ::waitpid(rank1, &st, 0);
        ::_exit(0);
      }
      (void)!::write(init_pid[1], &init, sizeof init);
      int st = 0;
      ::waitpid(init, &st, 0);
      ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 0);  // init's own failure (4, 5) reaches the test's message
    }
    ::close(ready[1]);
    ::close(init_pid[1]);
    pid_t init = 0;
    const bool have_init = ::read(init_pid[0], &init, sizeof init) == static_cast<ssize_t>(sizeof init);
    ::close(init_pid[0]);
    if (!have_init) {  // the child could not make the namespace
      int st = 0;
      ::waitpid(child, &st, 0);
      REQUIRE_MESSAGE((WIFEXITED(st) && WEXITSTATUS(st) == 2), "the namespace child failed: status ", st);
      MESSAGE("skipped: unshare(CLONE_NEWPID) needs CAP_SYS_ADMIN");
      ::close(ready[0]);
      return;
    }
    char got = 0;
    const bool announced = ::read(ready[0], &got, 1) == 1;
    ::close(ready[0]);
    comm::shm::Collectives me(std::move(seg), 0, 2, 0);
    std::string error;
    const auto t0 = ddp::Clock::now();
    if (announced) {
      std::vector<float> v(4, 1.0f);
      try {
        me.all_reduce(comm::mpi::ShmWatch(kAllReduce, t0 + 300ms, me), reinterpret_cast<std::byte*>(v.data()),
                      v.size());
        error = "the all-reduce returned";
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    const auto took = ddp::Clock::now() - t0;
    ::kill(init, SIGKILL);  // the namespace's init: the kernel kills rank 1 with it
    int st = 0;
    ::waitpid(child, &st, 0);
    const std::string ended = WIFEXITED(st) ? "exited with " + std::to_string(WEXITSTATUS(st))
                                            : "was killed by signal " + std::to_string(WTERMSIG(st));
    REQUIRE_MESSAGE(announced, "rank 1 never announced; the namespace child ", ended,
                    " (4: writing ns_last_pid failed, 5: forking rank 1 failed)");
    CHECK(got == 1);  // rank 1's pid in its namespace is one that is free here
    CHECK(me.pid_of(1) == 0);
    INFO(error);
    CHECK(error.find("waiting for rank 1 in shared memory") != std::string::npos);
    CHECK(took >= 300ms);
  }
}
