// Mismatched collectives on the mpi backend (docs/decisions/0009), under mpirun -n N:
// rank 0 runs all_reduce while the others broadcast; then all ranks all_reduce but rank 0 with one more
// element; both again with payloads that travel as several messages; all of it once with all-reduce through
// shared memory (every rank on this host) and once through MPI messages (CommOptions::shm off). Every rank must fail
// with a CommError that names a rank whose op differs and quotes that op, well inside the op timeout (nothing may wait
// for it), refuse its next op quoting that error, and the program must still exit normally. SPDX-License-Identifier: MIT
//
// Run: mpirun --allow-run-as-root --oversubscribe -n 2 ./mpi_mismatch_test   (exit 0 = pass)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ddp/comm/mpi/mpi_communicator.hpp"

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);
constexpr auto kPromptly = std::chrono::seconds(3);  // far below kTimeout: the check must not wait for it

// Runs `op` on a fresh communicator and checks that it fails promptly with a message holding every
// string in `want`. Returns the number of failed checks on this rank.
int expect_mismatch(bool shm, const std::string& name, const std::function<void(comm::Communicator&)>& op,
                    const std::vector<std::string>& want) {
  comm::MpiCommunicator c({.timeout = kTimeout, .shm = shm});
  const std::string full = name + (shm ? " (shm)" : " (messages)");
  const char* scenario = full.c_str();
  const auto t0 = Clock::now();
  std::string msg;
  try {
    op(c);
  } catch (const CommError& e) {
    msg = e.what();
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  int failed = 0;
  if (msg.empty()) {
    std::fprintf(stderr, "FAIL %s rank %d: no CommError\n", scenario, c.rank());
    return 1;
  }
  for (const auto& w : want)
    if (msg.find(w) == std::string::npos) {
      std::fprintf(stderr, "FAIL %s rank %d: message lacks \"%s\": %s\n", scenario, c.rank(), w.c_str(), msg.c_str());
      ++failed;
    }
  if (Clock::now() - t0 > kPromptly) {
    std::fprintf(stderr, "FAIL %s rank %d: took %.2f s\n", scenario, c.rank(), s);
    ++failed;
  }
  // The communicator stays failed: its next op is refused at once, quoting the mismatch (comm/failure_state.hpp).
  std::string after;
  try {
    c.barrier().wait();
  } catch (const CommError& e) {
    after = e.what();
  }
  if (after.find("barrier #") == std::string::npos ||
      after.find(" was not run: this communicator failed earlier: " + msg) == std::string::npos) {
    std::fprintf(stderr, "FAIL %s rank %d: the next barrier did not fail quoting the mismatch: \"%s\"\n", scenario,
                 c.rank(), after.c_str());
    ++failed;
  }
  std::printf("%s rank %d (%.3f s): %s\n", scenario, c.rank(), s, msg.c_str());
  return failed;
}

}  // namespace

int main() {
  int failed = 0;
  try {
    int rank = 0, n = 0;
    {
      comm::MpiCommunicator probe;
      rank = probe.rank();
      n = probe.size();
    }
    if (n < 2) {
      std::fprintf(stderr, "mpi_mismatch_test needs at least 2 ranks, got %d\n", n);
      return 1;
    }
    std::vector<float> v(4, 1.0f);
    std::vector<float> w(rank == 0 ? 5 : 4, 1.0f);
    std::vector<float> big(5000, 1.0f), other(rank == 0 ? 5000 : 1000, 1.0f);
    for (bool shm : {true, false}) {  // all-reduce through shared memory, or as carried messages
      failed += expect_mismatch(
          shm, "all_reduce vs broadcast",
          [&](comm::Communicator& c) {
            if (c.rank() == 0)
              c.all_reduce(std::span(v)).wait();
            else
              c.broadcast(std::span(v), {.root = 0}).wait();
          },
          rank == 0 ? std::vector<std::string>{"all_reduce #1 (F32 x 4, sum) does not match rank 1",
                                               "which ran broadcast #1 (F32 x 4, root 0)"}
                    : std::vector<std::string>{"broadcast #1 (F32 x 4, root 0) does not match rank 0",
                                               "which ran all_reduce #1 (F32 x 4, sum)"});
      failed += expect_mismatch(
          shm, "different counts",
          [&](comm::Communicator& c) {
            c.all_reduce(std::span(v)).wait();  // op #1 matches
            c.all_reduce(std::span(w)).wait();  // op #2 does not
          },
          rank == 0 ? std::vector<std::string>{"all_reduce #2 (F32 x 5, sum) does not match rank 1",
                                               "which ran all_reduce #2 (F32 x 4, sum)"}
                    : std::vector<std::string>{"all_reduce #2 (F32 x 4, sum) does not match rank 0",
                                               "which ran all_reduce #2 (F32 x 5, sum)"});
      // The same with all-reduces large enough to travel as several messages each (mpi::kCarryBytes):
      // the receives of chunks the peer never sends must be cancelled, or the exit below would hang.
      failed += expect_mismatch(
          shm, "chunked all_reduce vs broadcast",
          [&](comm::Communicator& c) {
            if (c.rank() == 0)
              c.all_reduce(std::span(big)).wait();
            else
              c.broadcast(std::span(big), {.root = 0}).wait();
          },
          rank == 0 ? std::vector<std::string>{"all_reduce #1 (F32 x 5000, sum) does not match rank 1",
                                               "which ran broadcast #1 (F32 x 5000, root 0)"}
                    : std::vector<std::string>{"broadcast #1 (F32 x 5000, root 0) does not match rank 0",
                                               "which ran all_reduce #1 (F32 x 5000, sum)"});
      failed += expect_mismatch(
          shm, "chunked different counts", [&](comm::Communicator& c) { c.all_reduce(std::span(other)).wait(); },
          rank == 0 ? std::vector<std::string>{"all_reduce #1 (F32 x 5000, sum) does not match rank 1",
                                               "which ran all_reduce #1 (F32 x 1000, sum)"}
                    : std::vector<std::string>{"all_reduce #1 (F32 x 1000, sum) does not match rank 0",
                                               "which ran all_reduce #1 (F32 x 5000, sum)"});
    }
    // The backend still works afterwards, and the ranks agree on the verdict.
    comm::MpiCommunicator world({.timeout = kTimeout});
    std::vector<std::int32_t> total{failed};
    world.all_reduce(std::span(total)).wait();
    if (rank == 0) std::printf("mpi mismatch checks on %d ranks: %s\n", n, total[0] ? "FAILED" : "all passed");
    return total[0] ? 1 : 0;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
