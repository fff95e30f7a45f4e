// message_passing: PyTorch's distributed tutorial seed. Rank 0 sends a one-element tensor to every other rank.
// SPDX-License-Identifier: MIT
//
// Usage (one binary, any launcher; --backend gloo selects ddp's tcp backend and says so):
//   torchrun --nproc_per_node=2 --no-python ./message_passing --backend=gloo
//   python3 -m torch.distributed.launch --nproc_per_node=2 --use_env --no_python ./message_passing --backend=gloo
//   python3 -m torch.distributed.launch --nproc_per_node=2 --no_python ./message_passing   (passes --local_rank=N)
//   mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 ./message_passing --backend=tcp
//   mpirun -np 2 ./message_passing --backend=mpi
//   ddprun --nproc-per-node 2 ./message_passing
// Flags: --backend tcp|gloo|mpi|nccl, --timeout-ms (DDP_TIMEOUT_MS), --socket-ifname (DDP_SOCKET_IFNAME),
//        --shm (DDP_SHM), --store-port (DDP_STORE_PORT), plus the launch flags --rank, --world-size, --master-addr, ...
// Expected output (2 ranks), then exit code 0 on every rank:
//   Rank 0 sent data to Rank 1
//   Rank 1 has received data from rank 0
#include <cxxopts.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/env/detect.hpp>
#include <ddp/env/env.hpp>
#include <ddp/env/flags.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/rendezvous.hpp>
#include <ddp/train/parse_args.hpp>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  try {
    const ddp::env::Env env = ddp::env::Env::process();
    ddp::env::LaunchFlags launch = ddp::env::extract_launch_flags(argc, argv);  // --rank, --local_rank=N, ...
    cxxopts::Options options("message_passing", "Rank 0 sends a one-element tensor to every other rank");
    options.add_options()("backend", "tcp, gloo (= tcp), mpi or nccl", cxxopts::value<std::string>()->default_value("gloo"))(
        "timeout-ms", "collective and store timeout (DDP_TIMEOUT_MS)",
        cxxopts::value<long>()->default_value(env.get("DDP_TIMEOUT_MS").value_or("300000")))(
        "socket-ifname", "tcp: interface to listen on (DDP_SOCKET_IFNAME)",
        cxxopts::value<std::string>()->default_value(env.get("DDP_SOCKET_IFNAME").value_or("")))(
        "shm", "tcp and mpi: shared memory between ranks on one host; 0 or false turns it off (DDP_SHM)",
        cxxopts::value<std::string>()->default_value(env.get("DDP_SHM").value_or("1")))(
        "store-port", "port of the store when the launcher holds MASTER_PORT (DDP_STORE_PORT)",
        cxxopts::value<int>()->default_value(env.get("DDP_STORE_PORT").value_or("0")))("h,help", "this help");
    const auto args = ddp::train::parse_args(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << '\n';
      return 0;
    }
    ddp::log::init();
    const std::string backend = args["backend"].as<std::string>();
    const std::chrono::milliseconds timeout(args["timeout-ms"].as<long>());

    const ddp::env::LaunchInfo info =
        ddp::env::detect(env, launch, {.need_master_addr = backend != "mpi", .backend = backend});
    ddp::log::set_rank(info.rank, info.world_size);
    std::optional<std::uint16_t> store_port;
    if (const int p = args["store-port"].as<int>(); p > 0) store_port = static_cast<std::uint16_t>(p);
    // The mpi backend takes rank and size from MPI and needs no store; the others meet through one.
    std::unique_ptr<ddp::store::Store> store = backend == "mpi" ? std::make_unique<ddp::store::HashStore>(timeout)
                                                                : ddp::store::make_store(info, timeout, store_port);
    auto comm = ddp::comm::make_communicator(backend, info, *store,
                                             {.timeout = timeout,
                                              .socket_ifname = args["socket-ifname"].as<std::string>(),
                                              .shm = ddp::train::parse_flag_bool("--shm (DDP_SHM)", args["shm"].as<std::string>())});

    std::vector<float> tensor{0.0f};
    if (comm->rank() == 0) {
      tensor[0] = 1.0f;
      for (int r = 1; r < comm->size(); ++r) {
        comm->send(std::span<const float>(tensor), r);
        std::cout << "Rank 0 sent data to Rank " << r << std::endl;
      }
    } else {
      comm->recv(std::span(tensor), 0);
      std::cout << "Rank " << comm->rank() << " has received data from rank 0" << std::endl;
      if (tensor[0] != 1.0f) throw ddp::CommError("ddp: received the wrong value");
    }
    return 0;  // the communicator's destructor runs a bounded barrier: no rank exits while another still needs it
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
