// Snapshots of a training program's (model, optimizer) on any device and with any optimizer, ZeRO included:
// what the examples call at resume and at the end of each epoch.
// SPDX-License-Identifier: MIT
//
//   long epoch = ddp::train::resume_snapshot(comm, path, exec, net, opt, model_options).epoch;  // collective; 0: none
//   ddp::train::save_snapshot_on_rank0(comm, path, exec, net, opt, {.epoch = e + 1}, model_options);  // collective
// How it works: rank 0 reads the file and broadcasts its bytes (train/snapshot_sync.hpp); every rank loads them
// into a host view of its model and optimizer (train::state_on<Cpu>: the objects themselves on the CPU, a copy
// pushed back to the GPU) and rank 0 saves from the same view. A parallel::ZeroRedundancyOptimizer holds only
// its shard, so it goes through a full optimizer over every parameter: consolidated onto rank 0 before a save
// (collective), filled from the file and cut back to the shard at resume (docs/ARCHITECTURE.md D31). The
// files are the same with or without ZeRO, so either kind of run resumes the other's snapshot.
#pragma once

#include <filesystem>
#include <string>
#include <type_traits>

#include "ddp/comm/communicator.hpp"
#include "ddp/parallel/zero.hpp"
#include "ddp/train/checkpoint.hpp"
#include "ddp/train/device_state.hpp"
#include "ddp/train/snapshot_sync.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::train {

template <class Opt>
inline constexpr bool is_zero_optimizer = false;
template <class Inner>
inline constexpr bool is_zero_optimizer<parallel::ZeroRedundancyOptimizer<Inner>> = true;

// Collective. Loads `path` (read by rank 0) into model and opt on every rank and returns what else it records
// (the epoch, the rng state, the user's metadata, e.g. optim::GradScaler::state()), or a SnapshotInfo with epoch 0
// when rank 0 has no such file. model_args: what the model was built with (for the host copy on a GPU).
template <class M, class Opt, Device D, class... ModelArgs>
SnapshotInfo resume_snapshot(comm::Communicator& comm, const std::string& path, Exec<D>& exec, M& model, Opt& opt,
                             const ModelArgs&... model_args) {
  using T = typename M::value_type;
  const auto bytes = read_and_broadcast(comm, path, exec);
  if (bytes.empty()) return {};
  auto load = [&](auto& whole) {
    auto host = state_on<Cpu>(exec, model, whole, model_args...);
    SnapshotInfo info = load_snapshot_bytes<T>(bytes, host.model(), host.optimizer(), path);
    host.push(exec);
    return info;
  };
  if constexpr (is_zero_optimizer<Opt>) {
    auto full = opt.make_full();
    SnapshotInfo info = load(*full);
    opt.load_consolidated(*full);
    return info;
  } else {
    return load(opt);
  }
}

// Collective with a ZeRO optimizer (its shards are consolidated onto rank 0), else only rank 0 does anything:
// writes model and opt to `path` (atomically, keeping the previous file as <path>.prev).
template <class M, class Opt, Device D, class... ModelArgs>
void save_snapshot_on_rank0(comm::Communicator& comm, const std::string& path, Exec<D>& exec, M& model, Opt& opt,
                            const SnapshotInfo& info, const ModelArgs&... model_args) {
  auto save = [&](auto& whole) {
    if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) std::filesystem::create_directories(dir);
    auto host = state_on<Cpu>(exec, model, whole, model_args...);
    host.pull(exec);
    save_snapshot(path, host.model(), host.optimizer(), info);
  };
  if constexpr (is_zero_optimizer<Opt>) {
    if (auto full = opt.consolidate(exec, 0)) save(*full);
  } else if (comm.rank() == 0) {
    save(opt);
  }
}

}  // namespace ddp::train
