// ddprun: start N workers with torchrun's environment, host their store, supervise and restart them.
// SPDX-License-Identifier: MIT
//
// Usage:           ddprun [--nproc-per-node N] [--nnodes M --node-rank R --master-addr A --master-port P]
//                         [--standalone] [--max-restarts K] [--run-id ID] [--monitor-interval S]
//                         [--grace-period S] PROGRAM [ARGS...]          (ddprun --help lists every flag)
// Expected output: each worker's lines prefixed with its rank, e.g. for `ddprun --nproc-per-node 2 echo hi`
//                  "[rank0]: hi" and "[rank1]: hi"; the exit code is 0, the first failing worker's code,
//                  or 128 + the signal that stopped the job.
#include <unistd.h>

#include <ddp/launch/agent.hpp>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    const ddp::launch::LaunchOptions options = ddp::launch::parse_launch_args(args);
    if (options.help) {
      std::cout << ddp::launch::usage_text();
      return 0;
    }
    ddp::log::init();
    const ddp::launch::EnvMap parent = ddp::launch::env_map_from(environ);
    for (const auto& flag : options.ignored)
      if (ddp::launch::detail::canonical_flag(flag) != "no-python")  // expected in torchrun commands: no note
        std::cerr << "ddprun: note: " << flag << " is accepted for torchrun compatibility and ignored\n";
    if (ddp::launch::sets_omp_threads(parent, options))
      std::cerr << "WARNING:ddprun:\n" << ddp::launch::kOmpNotice << std::flush;
    return ddp::launch::run_agent(options, parent).exit_code;
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
