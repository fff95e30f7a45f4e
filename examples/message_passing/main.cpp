// message_passing: PyTorch's distributed tutorial seed. Rank 0 sends a one-element tensor to every
// other rank.
// SPDX-License-Identifier: MIT
//
// Usage (one binary, any launcher; --backend gloo selects ddp's tcp backend and says so):
//   torchrun --nproc_per_node=2 --no-python ./message_passing --backend=gloo
//   python3 -m torch.distributed.launch --nproc_per_node=2 --use_env --no_python ./message_passing
//     --backend=gloo
//   python3 -m torch.distributed.launch --nproc_per_node=2 --no_python ./message_passing   (passes
//     --local_rank=N)
//   mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 ./message_passing --backend=tcp
//   mpirun -np 2 ./message_passing --backend=mpi
//   ddprun --nproc-per-node 2 ./message_passing
// Flags: --backend tcp|gloo|mpi, --timeout-ms (DDP_TIMEOUT_MS), --socket-ifname
//        (DDP_SOCKET_IFNAME), --shm (DDP_SHM), --store-port (DDP_STORE_PORT) and the other
//        distributed flags of train/options.hpp, plus the launch flags --rank, --world-size,
//        --master-addr, ... The tensor is host memory, so nccl is refused.
// Expected output (2 ranks), then exit code 0 on every rank:
//   Rank 0 sent data to Rank 1
//   Rank 1 has received data from rank 0
#include <cxxopts.hpp>
#include <ddp/core/error.hpp>
#include <ddp/core/log.hpp>
#include <ddp/train/init.hpp>
#include <ddp/train/parse_args.hpp>
#include <iostream>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  try {
    // Takes --rank, --local_rank=N, ... out of argv; the program computes on the host only.
    ddp::train::InitFlags init(argc, argv, {.cpu_only = true});
    cxxopts::Options options("message_passing",
                             "Rank 0 sends a one-element tensor to every other rank");
    options.add_options()("h,help", "this help");
    // --backend, --timeout-ms, --socket-ifname, --shm, --store-port, ...
    init.add_options(options);
    const auto args = ddp::train::parse_args(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << '\n';
      return 0;
    }
    ddp::log::init();
    init.read(args);
    // Launcher -> store (none for mpi) -> communicator.
    ddp::train::Job job = ddp::train::init_process_group(init);
    ddp::comm::Communicator& comm = job.communicator();

    std::vector<float> tensor{0.0f};
    if (comm.rank() == 0) {
      tensor[0] = 1.0f;
      for (int r = 1; r < comm.size(); ++r) {
        comm.send(std::span<const float>(tensor), r);
        std::cout << "Rank 0 sent data to Rank " << r << std::endl;
      }
    } else {
      comm.recv(std::span(tensor), 0);
      std::cout << "Rank " << comm.rank() << " has received data from rank 0" << std::endl;
      if (tensor[0] != 1.0f) throw ddp::CommError("ddp: received the wrong value");
    }
    // the communicator's destructor runs a bounded barrier: no rank exits while another still needs
    // it
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
