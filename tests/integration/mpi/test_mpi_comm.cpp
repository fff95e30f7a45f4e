// The mpi backend under mpirun (label mpi): every collective x dtype x sizes on groups of 1..N ranks
// (new_group), checked bit for bit against the same local reference as the tcp tests; once with all-reduce
// through shared memory (every rank on this host) and once through MPI messages (CommOptions::shm off).
// SPDX-License-Identifier: MIT
//
// Run: mpirun --allow-run-as-root --oversubscribe -n 4 ./mpi_comm_test   (exit 0 = pass)
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "collective_checks.hpp"
#include "ddp/comm/mpi/mpi_communicator.hpp"

using namespace ddp;

template <class T>
int check_type(comm::Communicator& c, int world_rank) {
  int failed = 0;
  for (const auto& f : test::check_collectives<T>(c)) {
    std::fprintf(stderr, "FAIL world rank %d, group of %d: %s\n", world_rank, c.size(), f.c_str());
    ++failed;
  }
  return failed;
}

// Every check on one communicator, with all-reduce through shared memory (shm) or MPI messages (the carried
// exchange and the ring). Returns the number of failed checks on this rank.
int check_all(bool shm) {
  int failed = 0;
  comm::MpiCommunicator world({.timeout = std::chrono::seconds(60), .shm = shm});
  const int n = world.size();
  if (world.uses_shm() != (shm && n > 1)) {  // mpirun runs every rank on this host
    std::fprintf(stderr, "FAIL world rank %d: uses_shm() is %d with shm %d\n", world.rank(), world.uses_shm(), shm);
    ++failed;
  }
  {  // AllreduceOptions::blocking: 4 MiB, far above inline_max_bytes, runs on this thread when nothing is queued,
     // so it has completed when all_reduce returns; so has the next (the first left nothing to the progress thread)
    std::vector<float> v(1u << 20, static_cast<float>(world.rank() + 1));
    for (int i = 0; i < 2; ++i) {
      const comm::Work w = world.all_reduce(std::span(v), {.op = comm::ReduceOp::Sum, .blocking = true});
      if (!w.is_completed()) {
        std::fprintf(stderr, "FAIL world rank %d: blocking all_reduce %d returned incomplete\n", world.rank(), i);
        ++failed;
      }
      w.wait();
    }
    const float expect = static_cast<float>(n * n * (n + 1) / 2);  // n ranks' sum, then n times that
    if (v.front() != expect || v.back() != expect) {
      std::fprintf(stderr, "FAIL world rank %d: blocking all_reduce gave %g, expected %g\n", world.rank(),
                   static_cast<double>(v.front()), static_cast<double>(expect));
      ++failed;
    }
  }
  for (int k = 1; k <= n; ++k) {  // groups {0..k-1}: world sizes 1..n
    std::vector<int> ranks(static_cast<std::size_t>(k));
    std::iota(ranks.begin(), ranks.end(), 0);
    auto group = world.new_group(ranks);
    if (!group) continue;
    failed += check_type<float>(*group, world.rank()) + check_type<double>(*group, world.rank()) +
              check_type<bfloat16>(*group, world.rank()) + check_type<half>(*group, world.rank()) +
              check_type<std::int32_t>(*group, world.rank()) + check_type<std::int64_t>(*group, world.rank()) +
              check_type<std::uint8_t>(*group, world.rank());
  }
  for (const auto& f : test::check_argument_errors(world)) {  // the same words as the tcp backend
    std::fprintf(stderr, "FAIL argument errors on rank %d: %s\n", world.rank(), f.c_str());
    ++failed;
  }
  std::vector<float> v{static_cast<float>(world.rank())};  // send/recv around the ring
  if (n > 1) {
    std::vector<float> got(1);
    auto r = world.irecv(std::span(got), (world.rank() + n - 1) % n, {.tag = 3});
    world.send(std::span<const float>(v), (world.rank() + 1) % n, {.tag = 3});
    r.wait();
    if (got[0] != static_cast<float>((world.rank() + n - 1) % n)) {
      std::fprintf(stderr, "FAIL send/recv on rank %d: got %f\n", world.rank(), static_cast<double>(got[0]));
      ++failed;
    }
  }
  return failed;
}

int main() {
  try {
    int failed = 0;
    for (bool shm : {true, false})
      if (const int f = check_all(shm)) {
        std::fprintf(stderr, "FAIL world rank %d: %d checks failed with shm %s\n", 0, f, shm ? "on" : "off");
        failed += f;
      }
    comm::MpiCommunicator world({.timeout = std::chrono::seconds(60)});
    const int n = world.size();
    std::vector<std::int32_t> total{failed};
    world.all_reduce(std::span(total)).wait();
    if (world.rank() == 0)
      std::printf("mpi backend: %d ranks, groups of 1..%d, 7 dtypes: %s\n", n, n, total[0] ? "FAILED" : "all passed");
    return total[0] ? 1 : 0;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
