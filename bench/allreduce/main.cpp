// bench_allreduce: all-reduce bus bandwidth in nccl-tests' terms, as JSON lines, for the tcp and mpi backends.
// SPDX-License-Identifier: MIT
//
// Usage:
//   bench_allreduce --nproc 2                        tcp: forks 2 ranks on 127.0.0.1 (store on a free port)
//   mpirun -n 2 bench_allreduce --backend mpi        mpi: ranks from mpirun (built with ddp::mpi)
//   options: --min-bytes 4 --max-bytes 268435456 --iters-scale 1 --inline-max-bytes 65536 --shm 1 (DDP_SHM)
//            --check-fingerprints 1 (mpi)
// Expected output: one line per size, from rank 0:
//   {"backend": "tcp", "ranks": 2, "bytes": 16777216, "time_us": 9800.0, "algbw_GBps": 1.71, "busbw_GBps": 1.71,
//    "copy_us": 1500.0}
// algbw = bytes / time; busbw = algbw * 2(n-1)/n (what each link carries in a bandwidth-optimal all-reduce).
// copy_us (from 1 MiB; else 0): every rank memcpy's its buffer at the same time, the least memory traffic any
// in-place all-reduce has (each rank's buffer read and written once); copy_us / time_us is the share of that
// bound the all-reduce reaches.
// compare_gloo.py runs this beside PyTorch's gloo on the same sizes and prints the ratios.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <string>
#include <vector>

#include "ddp/comm/factory.hpp"
#include "ddp/core/host_memory.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/train/parse_args.hpp"

namespace {

struct Flags {
  std::string backend;
  int nproc;
  std::size_t min_bytes, max_bytes, inline_max_bytes;
  double iters_scale;
  bool shm;
  bool check_fingerprints;
};

void run(ddp::comm::Communicator& comm, const Flags& f) {
  for (std::size_t bytes = f.min_bytes; bytes <= f.max_bytes; bytes *= 4) {
    // Allocated as ddp allocates tensors and buckets (core/host_memory.hpp: huge-page advised from 4 MiB), which
    // is also numpy's policy, so the mpi4py reference (np.ones) and ours run on the same kind of pages.
    ddp::HostVector<float> v(bytes / sizeof(float), 1.0f);
    const int iters = std::max(1, static_cast<int>(f.iters_scale * (bytes <= (1u << 20) ? 200 : bytes <= (16u << 20) ? 20 : 5)));
    // Blocking, as the references' MPI_Allreduce and torch's dist.all_reduce (async_op=False) are: the op may run
    // on this thread at any size (AllreduceOptions::blocking).
    const ddp::comm::AllreduceOptions o{.blocking = true};
    for (int i = 0; i < 3; ++i) comm.all_reduce(std::span(v), o).wait();  // warm-up: connections, scratch, pages
    comm.barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) comm.all_reduce(std::span(v), o).wait();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    const int n = comm.size();
    const double algbw = static_cast<double>(bytes) / us / 1e3;
    // The memory-traffic bound (from 1 MiB, where bandwidth is what counts): an in-place all-reduce reads and
    // writes every rank's buffer at least once, the traffic of one memcpy of it per rank. So every rank copies
    // its buffer into another at the same time, between two barriers (the slowest rank's time, as above).
    double copy_us = 0;
    if (bytes >= (1u << 20)) {
      ddp::HostVector<float> w(v.size(), 0.0f);
      std::memcpy(w.data(), v.data(), bytes);  // warm-up: fault in w's pages
      comm.barrier().wait();
      const auto c0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) std::memcpy((i % 2 ? v : w).data(), (i % 2 ? w : v).data(), bytes);
      comm.barrier().wait();
      copy_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count() / iters;
    }
    if (comm.rank() == 0)
      std::printf("{\"backend\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"time_us\": %.1f, \"algbw_GBps\": %.3f, "
                  "\"busbw_GBps\": %.3f, \"copy_us\": %.1f}\n",
                  std::string(comm.backend()).c_str(), n, bytes, us, algbw, algbw * 2.0 * (n - 1) / n, copy_us);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options opts("bench_allreduce", "All-reduce bus bandwidth (nccl-tests formulas) as JSON lines");
  opts.add_options()("backend", "tcp or mpi", cxxopts::value<std::string>()->default_value("tcp"))(
      "nproc", "tcp: ranks to fork on this host", cxxopts::value<int>()->default_value("2"))(
      "min-bytes", "smallest size", cxxopts::value<std::size_t>()->default_value("4"))(
      "max-bytes", "largest size", cxxopts::value<std::size_t>()->default_value("268435456"))(
      "iters-scale", "multiplies the iteration counts", cxxopts::value<double>()->default_value("1"))(
      "inline-max-bytes", "tcp: CommOptions::inline_max_bytes", cxxopts::value<std::size_t>()->default_value("65536"))(
      "shm", "tcp and mpi: shared memory between local ranks, true or false (DDP_SHM)",
      cxxopts::value<std::string>()->default_value(std::getenv("DDP_SHM") ? std::getenv("DDP_SHM") : "1"))(
      "check-fingerprints", "mpi: all-gather each op's fingerprint first, true or false (CommOptions::check_fingerprints)",
      cxxopts::value<std::string>()->default_value("1"))(
      "h,help", "this help");
  try {
    auto a = opts.parse(argc, argv);
    if (a.count("help")) {
      std::printf("%s\n", opts.help().c_str());
      return 0;
    }
    const Flags f{a["backend"].as<std::string>(), a["nproc"].as<int>(), a["min-bytes"].as<std::size_t>(),
                  a["max-bytes"].as<std::size_t>(), a["inline-max-bytes"].as<std::size_t>(), a["iters-scale"].as<double>(),
                  ddp::train::parse_flag_bool(std::getenv("DDP_SHM") && !a.count("shm") ? "DDP_SHM" : "--shm",
                                              a["shm"].as<std::string>()),
                  ddp::train::parse_flag_bool("--check-fingerprints", a["check-fingerprints"].as<std::string>())};
    const ddp::comm::CommOptions copts{.timeout = std::chrono::seconds(120), .inline_max_bytes = f.inline_max_bytes,
                                       .shm = f.shm, .check_fingerprints = f.check_fingerprints};
    if (f.backend != "tcp") {  // mpi (or an error listing the backends): rank and size come from the backend
      ddp::store::HashStore unused;
      auto comm = ddp::comm::make_communicator(f.backend, ddp::env::LaunchInfo{}, unused, copts);
      run(*comm, f);
      return 0;
    }
    ddp::store::TcpStoreServer server("127.0.0.1", 0);
    std::vector<pid_t> kids;
    for (int rank = 0; rank < f.nproc; ++rank) {
      const pid_t pid = ::fork();
      if (pid != 0) {
        kids.push_back(pid);
        continue;
      }
      int rc = 0;
      try {
        ddp::store::TcpStore store("127.0.0.1", server.port(), {.timeout = std::chrono::seconds(60)});
        ddp::env::LaunchInfo info{.rank = rank, .world_size = f.nproc, .master_addr = "127.0.0.1"};
        auto comm = ddp::comm::make_communicator("tcp", info, store, copts);
        run(*comm, f);
      } catch (const ddp::Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        rc = 1;
      }
      std::fflush(stdout);
      ::_exit(rc);  // the forked child must not run the parent's destructors (the store server)
    }
    int worst = 0;
    for (pid_t k : kids) {
      int st = 0;
      ::waitpid(k, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) worst = 1;
    }
    return worst;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
