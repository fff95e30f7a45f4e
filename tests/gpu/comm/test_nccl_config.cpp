// nccl backend errors that need no GPU: a job with no visible device is a ConfigError naming the fix.
// SPDX-License-Identifier: MIT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "ddp/comm/factory.hpp"
#include "ddp/store/hash_store.hpp"

TEST_CASE("nccl: the factory builds the nccl backend, and without a visible device says what to check") {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  ddp::store::HashStore store(std::chrono::seconds(2));
  // local_rank = count: always one past the last visible device.
  const ddp::env::LaunchInfo info{.rank = 0, .world_size = 1, .local_rank = count, .master_addr = "127.0.0.1"};
  const std::string want = "ddp[rank 0/1]: --backend nccl needs CUDA device " + std::to_string(count) +
                           " (the local rank), but " + std::to_string(count) +
                           " device(s) are visible; check CUDA_VISIBLE_DEVICES and --nproc-per-node, or use --backend tcp.";
  CHECK_THROWS_WITH_AS(ddp::comm::make_communicator("nccl", info, store, {.timeout = std::chrono::seconds(2)}),
                       want.c_str(), ddp::ConfigError);
}
