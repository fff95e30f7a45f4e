// probe: prints how it was launched (its LaunchInfo as one JSON line), then proves that the ranks
// reach each other through the job's store: torchrun's own store (launcher_owns_store), ddprun's,
// or one that rank 0 hosts (mpirun, srun, env://).
// SPDX-License-Identifier: MIT
//
// Usage:           probe [--no-store] [--timeout-ms MS] [--rank R --world-size W --master-addr A
//   ...]
//                  ddprun --nproc-per-node 2 --standalone ./probe
//                  torchrun --redirects 9:1 --tee 9:1 --nproc_per_node=2 --no_python ./probe
//                  mpirun -np 2 -x MASTER_ADDR=localhost -x MASTER_PORT=29500 ./probe
// Expected output: per rank, e.g. for rank 1 of 2 under torchrun probe:
//                  {"rank":1,"world_size":2,"local_rank":1,...,
//                   "launcher_owns_store":true,"source":"torchrun"}
//                  probe: rank 1 sees 2 ranks
// How it works: every rank sets probe/rank/<r> = "<host>:<pid>" and waits for all W keys; it then
// marks probe/done/<r>. Rank 0 waits for every done key before it returns, so a store that rank 0
// hosts lives until every rank has read what it needs.
#include <unistd.h>

#include <cxxopts.hpp>
#include <ddp/core/log.hpp>
#include <ddp/env/describe.hpp>
#include <ddp/env/detect.hpp>
#include <ddp/env/flags.hpp>
#include <ddp/store/rendezvous.hpp>
#include <ddp/train/parse_args.hpp>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  try {
    const ddp::env::LaunchFlags flags = ddp::env::extract_launch_flags(argc, argv);
    cxxopts::Options options(
        "probe", "Print this process's launch info as JSON and rendezvous with its peers");
    options.add_options()("no-store", "only print the launch info")(
        "timeout-ms", "store timeout in milliseconds",
        cxxopts::value<int>()->default_value("10000"))("h,help", "help");
    const auto args = ddp::train::parse_args(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help()
                << "Launch flags (override the launcher): --rank --world-size --local-rank "
                   "--local-world-size --master-addr --master-port\n";
      return 0;
    }
    const bool use_store = args.count("no-store") == 0;
    ddp::log::init();
    const ddp::env::LaunchInfo info =
        ddp::env::detect(ddp::env::Env::process(), flags, {.need_master_addr = use_store});
    ddp::log::set_rank(info.rank, info.world_size);
    ddp::env::log_launch(info);
    std::cout << "probe: " << ddp::env::to_json(info) << std::endl;
    if (!use_store) return 0;

    const std::chrono::milliseconds timeout(args["timeout-ms"].as<int>());
    auto store = ddp::store::make_store(info, timeout);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    store->set("probe/rank/" + std::to_string(info.rank),
               std::string(host) + ":" + std::to_string(::getpid()));
    std::vector<std::string> rank_keys, done_keys;
    for (int r = 0; r < info.world_size; ++r) {
      rank_keys.push_back("probe/rank/" + std::to_string(r));
      done_keys.push_back("probe/done/" + std::to_string(r));
    }
    store->wait(rank_keys, timeout);
    int seen = 0;
    for (const auto& k : rank_keys) seen += store->get_string(k).empty() ? 0 : 1;
    std::cout << "probe: rank " << info.rank << " sees " << seen << " ranks" << std::endl;
    store->set(done_keys[static_cast<std::size_t>(info.rank)], std::string_view("1"));
    if (info.rank == 0) store->wait(done_keys, timeout);
    return seen == info.world_size ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
