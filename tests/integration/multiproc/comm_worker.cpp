// A rank of a multi-process comm test: joins the store on 127.0.0.1:<port>, builds a tcp communicator
// and runs a scenario. Exits 0 on success; on a ddp::Error prints it to stderr and exits 1.
// SPDX-License-Identifier: MIT
//
// Usage: comm_worker <rank> <world_size> <store_port> <scenario> <timeout_ms>
//   allreduce_loop: 16 MiB float all-reduces until the test kills someone (rank 0 sets key "looping"
//                   after the first one completes); at most 10000 iterations.
//   allreduce_once: one 16 MiB all-reduce, checked, then a clean exit (the destructor's barrier).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddp/comm/factory.hpp"
#include "ddp/store/tcp_store.hpp"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: comm_worker <rank> <world_size> <store_port> <scenario> <timeout_ms>\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]), world = std::atoi(argv[2]);
  const auto port = static_cast<std::uint16_t>(std::atoi(argv[3]));
  const std::string scenario = argv[4];
  const std::chrono::milliseconds timeout(std::atoll(argv[5]));
  try {
    ddp::log::set_rank(rank, world);
    ddp::store::TcpStore store("127.0.0.1", port, {.timeout = timeout, .rank = rank, .world_size = world});
    ddp::env::LaunchInfo info{.rank = rank, .world_size = world, .master_addr = "127.0.0.1", .master_port = port};
    auto comm = ddp::comm::make_communicator("tcp", info, store, {.timeout = timeout});
    std::vector<float> v(4u << 20, 1.0f);  // 16 MiB
    const int iters = scenario == "allreduce_loop" ? 10000 : 1;
    for (int i = 0; i < iters; ++i) {
      comm->all_reduce(std::span(v)).wait();
      if (i == 0 && rank == 0) store.set("looping", "1");
    }
    if (scenario == "allreduce_once" && v[0] != static_cast<float>(world)) {
      std::fprintf(stderr, "ddp[rank %d/%d]: wrong result %f\n", rank, world, static_cast<double>(v[0]));
      return 1;
    }
    return 0;
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
