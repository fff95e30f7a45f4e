// bench_mpi_parts: where the mpi backend's all-reduce time goes (docs/decisions/0038). In one
// program, per size: Open MPI's own calls (blocking MPI_Allreduce, MPI_Iallreduce + MPI_Wait or busy
// MPI_Test), a fingerprint exchange alone (32 bytes per rank: MPI_Iallgather, MPI_Allgather, or
// MPI_Isend/MPI_Irecv with the next rank), a ring reduce-scatter + all-gather over MPI_Isend/MPI_Irecv with
// a persistent scratch buffer, and ddp's MpiCommunicator with and without fingerprints, and with every op
// on its progress thread (inline_max_bytes = 0). float32, sum, in place.
// SPDX-License-Identifier: MIT
//
// Run: mpirun -np 2 --bind-to none bench_mpi_parts [--min-bytes 1024] [--max-bytes 268435456] [--reps 3]
// Output (rank 0), one line per size and variant, the median of --reps timed runs:
//   {"bytes": 1024, "variant": "mpi_allreduce", "time_us": 2.1, "busbw_GBps": 0.97}
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ddp/comm/mpi/mpi_communicator.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void busy_wait(MPI_Request* r) {
  int done = 0;
  while (!done) MPI_Test(r, &done, MPI_STATUS_IGNORE);
}

// Ring all-reduce (sum) over point-to-point calls: n-1 reduce-scatter steps into a scratch block, then
// n-1 all-gather steps straight into place. Blocks are count/n elements (the last takes the rest).
void ring_allreduce(float* buf, std::size_t count, std::vector<float>& scratch, MPI_Comm comm) {
  int r = 0, n = 1;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &n);
  if (n == 1) return;
  const std::size_t base = count / static_cast<std::size_t>(n);
  auto off = [&](int b) { return base * static_cast<std::size_t>(b); };
  auto len = [&](int b) { return b == n - 1 ? count - off(b) : base; };
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  scratch.resize(count - off(n - 1));
  for (int s = 0; s < n - 1; ++s) {
    const int sb = ((r - s) % n + n) % n, rb = ((r - s - 1) % n + n) % n;
    MPI_Request q[2];
    MPI_Irecv(scratch.data(), static_cast<int>(len(rb)), MPI_FLOAT, prev, 1, comm, &q[0]);
    MPI_Isend(buf + off(sb), static_cast<int>(len(sb)), MPI_FLOAT, next, 1, comm, &q[1]);
    MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
    ddp::comm::reduce_into(buf + off(rb), scratch.data(), len(rb), ddp::DType::F32, ddp::comm::ReduceOp::Sum);
  }
  for (int s = 0; s < n - 1; ++s) {
    const int sb = ((r + 1 - s) % n + n) % n, rb = ((r - s) % n + n) % n;
    MPI_Request q[2];
    MPI_Irecv(buf + off(rb), static_cast<int>(len(rb)), MPI_FLOAT, prev, 2, comm, &q[0]);
    MPI_Isend(buf + off(sb), static_cast<int>(len(sb)), MPI_FLOAT, next, 2, comm, &q[1]);
    MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t min_bytes = 1024, max_bytes = 256u << 20;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--min-bytes") min_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--max-bytes") max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm comm, fp_comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_dup(MPI_COMM_WORLD, &fp_comm);
  {
    ddp::comm::MpiCommunicator with_fp({.timeout = std::chrono::seconds(120)});
    ddp::comm::MpiCommunicator without_fp({.timeout = std::chrono::seconds(120), .check_fingerprints = false});
    // Every op through the progress thread (no inline run on the caller): the thread hop's cost.
    ddp::comm::MpiCommunicator no_inline({.timeout = std::chrono::seconds(120), .inline_max_bytes = 0});
    std::vector<float> scratch;
    for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      std::vector<float> v(bytes / sizeof(float), 1.0f);
      const int cnt = static_cast<int>(v.size());
      const int iters = bytes <= (1u << 20) ? 200 : bytes <= (16u << 20) ? 20 : 5;
      std::uint64_t fp[4] = {1, 2, 3, 4}, fps[64];
      const std::vector<std::pair<std::string, std::function<void()>>> variants = {
          {"mpi_allreduce", [&] { MPI_Allreduce(MPI_IN_PLACE, v.data(), cnt, MPI_FLOAT, MPI_SUM, comm); }},
          {"mpi_iallreduce_wait",
           [&] {
             MPI_Request q;
             MPI_Iallreduce(MPI_IN_PLACE, v.data(), cnt, MPI_FLOAT, MPI_SUM, comm, &q);
             MPI_Wait(&q, MPI_STATUS_IGNORE);
           }},
          {"mpi_iallreduce_test",
           [&] {
             MPI_Request q;
             MPI_Iallreduce(MPI_IN_PLACE, v.data(), cnt, MPI_FLOAT, MPI_SUM, comm, &q);
             busy_wait(&q);
           }},
          {"fp_iallgather_only",
           [&] {
             MPI_Request q;
             MPI_Iallgather(fp, 4, MPI_UINT64_T, fps, 4, MPI_UINT64_T, fp_comm, &q);
             busy_wait(&q);
           }},
          {"fp_allgather_blocking_only",
           [&] { MPI_Allgather(fp, 4, MPI_UINT64_T, fps, 4, MPI_UINT64_T, fp_comm); }},
          {"fp_p2p_exchange_only",
           [&] {
             MPI_Request q[2];
             MPI_Irecv(fps, 4, MPI_UINT64_T, (rank + 1) % n, 0, fp_comm, &q[0]);
             MPI_Isend(fp, 4, MPI_UINT64_T, (rank + 1) % n, 0, fp_comm, &q[1]);
             int done = 0;
             while (!done) MPI_Testall(2, q, &done, MPI_STATUSES_IGNORE);
           }},
          {"ring_p2p", [&] { ring_allreduce(v.data(), v.size(), scratch, comm); }},
          {"ddp_fp_on", [&] { with_fp.all_reduce(std::span(v)).wait(); }},
          {"ddp_fp_off", [&] { without_fp.all_reduce(std::span(v)).wait(); }},
          {"ddp_fp_on_progress_thread", [&] { no_inline.all_reduce(std::span(v)).wait(); }},
      };
      for (const auto& [name, f] : variants) {
        std::vector<double> t;
        for (int k = 0; k < 3; ++k) f();
        for (int rep = 0; rep < reps; ++rep) {
          MPI_Barrier(comm);
          const auto t0 = Clock::now();
          for (int i = 0; i < iters; ++i) f();
          t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
        }
        std::sort(t.begin(), t.end());
        const double us = t[t.size() / 2];
        if (rank == 0)
          std::printf("{\"bytes\": %zu, \"variant\": \"%s\", \"time_us\": %.2f, \"busbw_GBps\": %.3f}\n", bytes,
                      name.c_str(), us, static_cast<double>(bytes) / us / 1e3 * 2.0 * (n - 1) / n);
        std::fflush(stdout);
      }
    }
  }
  MPI_Comm_free(&fp_comm);
  MPI_Comm_free(&comm);
  MPI_Finalize();
  return 0;
}
