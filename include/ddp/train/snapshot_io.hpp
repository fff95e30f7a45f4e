// Snapshots of a training program's (model, optimizer) on any device and with any optimizer, ZeRO
// included: what the examples call at resume and at the end of each epoch.
// SPDX-License-Identifier: MIT
//
//   long epoch = ddp::train::resume_snapshot(comm, path, exec, net, opt, model_options).epoch;  //
//     collective; 0: none
//   ddp::train::save_snapshot_on_rank0(comm, path, exec, net, opt, {.epoch = e + 1},
//     model_options);  // collective
// How it works: rank 0 reads the file and broadcasts its bytes (train/snapshot_sync.hpp); every
// rank loads them into a host view of its model and optimizer (train::state_on<Cpu>: the objects
// themselves on the CPU, a copy pushed back to the GPU) and rank 0 saves from the same view. A
// parallel::ZeroRedundancyOptimizer holds only its shard, so it goes through a full optimizer over
// every parameter: consolidated onto rank 0 before a save (collective), filled from the file and
// cut back to the shard at resume (docs/decisions/0031). The files are the same with or without
// ZeRO, so either kind of run resumes the other's snapshot.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/parallel/zero.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/train/checkpoint.hpp"
#include "ddp/train/device_state.hpp"
#include "ddp/train/snapshot_sync.hpp"

namespace ddp::train {

template <class Opt>
inline constexpr bool is_zero_optimizer = false;
template <class Inner>
inline constexpr bool is_zero_optimizer<parallel::ZeroRedundancyOptimizer<Inner>> = true;

// Collective. Loads `path` (read by rank 0) into model and opt on every rank and returns what else
// it records (the epoch, the rng state, the user's metadata, e.g. optim::GradScaler::state()), or a
// SnapshotInfo with epoch 0 when rank 0 has no such file. model_args: what the model was built with
// (for the host copy on a GPU). Rank 0 (the writer) makes the directory of the snapshot file `path`
// and checks that it can write there; other ranks return. `flag` names the option that gave the
// path ("--snapshot_path"; empty: "the snapshot path"). Programs call it at start-up, so that a bad
// path fails before training rather than at the end of the first epoch, with an IoError naming the
// flag, the rank and the cause instead of std::filesystem's bare text.
inline void prepare_snapshot_path(const std::string& path, std::string_view flag, int rank,
                                  int world_size) {
  namespace fs = std::filesystem;
  if (rank != 0) return;
  const fs::path dir = fs::path(path).parent_path();
  const std::string head =
      ddp::detail::str("ddp[rank ", rank, '/', world_size,
                       "]: ", flag.empty() ? "the snapshot path" : flag, " '", path, "': ");
  const std::string fix =
      ddp::detail::str(" Give ", flag.empty() ? "it" : flag, " a file in a writable directory.");
  std::error_code ec;
  fs::create_directories(dir.empty() ? fs::path(".") : dir, ec);
  if (ec) {
    std::string why = ec.message();
    // the component that is a file, if any
    for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
      std::error_code ec2;
      if (fs::exists(p, ec2)) {
        if (!fs::is_directory(p, ec2))
          why = ddp::detail::str('\'', p.string(), "' is a file, not a directory");
        break;
      }
      if (p == p.parent_path()) break;
    }
    throw IoError(ddp::detail::str(head, "cannot create its directory '", dir.string(), "': ", why,
                                   '.', fix));
  }
  const std::string where = dir.empty() ? std::string(".") : dir.string();
  if (::access(where.c_str(), W_OK) != 0)
    throw IoError(ddp::detail::str(head, "its directory '", where,
                                   "' is not writable: ", std::strerror(errno), '.', fix));
}

template <class M, class Opt, Device D, class... ModelArgs>
SnapshotInfo resume_snapshot(comm::Communicator& comm, const std::string& path, Exec<D>& exec,
                             M& model, Opt& opt, const ModelArgs&... model_args) {
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

// Collective with a ZeRO optimizer (its shards are consolidated onto rank 0), else only rank 0 does
// anything: writes model and opt to `path` (atomically, keeping the previous file as <path>.prev).
template <class M, class Opt, Device D, class... ModelArgs>
void save_snapshot_on_rank0(comm::Communicator& comm, const std::string& path, Exec<D>& exec,
                            M& model, Opt& opt, const SnapshotInfo& info,
                            const ModelArgs&... model_args) {
  auto save = [&](auto& whole) {
    prepare_snapshot_path(path, {}, comm.rank(), comm.size());
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
