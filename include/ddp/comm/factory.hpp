// make_communicator: the backend by name (--backend), the one place that knows which backends were
// built.
// SPDX-License-Identifier: MIT
//
//   auto comm = ddp::comm::make_communicator(flags.backend, info, store,
//                                            {.timeout = flags.timeout});
//
// Names: "tcp" (CPU sockets, always built), "gloo" (the tutorials' word: selects tcp and says so
// once), "mpi" (needs ddp::mpi), "nccl" (needs ddp::nccl). Unknown names are a ConfigError listing
// the valid ones. Device tensors: with opts.cuda_device = N >= 0 the collectives take tensors on
// CUDA device N. nccl runs on device N; tcp/gloo and mpi are wrapped in a StagedCommunicator that
// stages them through pinned host memory with nccl's stream semantics (docs/decisions/0023; needs
// ddp::cuda), so several ranks can share a GPU:
//   auto comm = make_communicator("gloo", info, store,
//                                 {.timeout = t, .cuda_device = info.local_rank});
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/tcp/tcp_communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/config.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/store/store.hpp"
#if DDP_WITH_MPI
#  include "ddp/comm/mpi/mpi_communicator.hpp"
#endif
#if DDP_WITH_NCCL
#  include "ddp/comm/nccl/nccl_communicator.hpp"
#endif
#if DDP_WITH_CUDA
#  include "ddp/comm/staging/cuda/staging_device.hpp"
// the GPU train/init.hpp binds before the communicator exists
#  include "ddp/tensor/cuda/current_device.hpp"
#endif

namespace ddp::comm {

inline constexpr std::string_view kBackendNames = "tcp, gloo (= tcp), mpi, nccl";

namespace detail {

inline void log_gloo_alias_once() {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    DDP_LOG_INFO(
        "--backend gloo selects ddp's tcp backend (CPU ring/halving-doubling over sockets)");
}

[[noreturn]] inline void not_built(std::string_view backend, std::string_view macro_name,
                                   std::string_view cmake_opt) {
  throw ConfigError(
      ddp::detail::str("ddp: --backend ", backend, " requested but ddp was built without ",
                       macro_name, "; reconfigure with -D", cmake_opt, "=ON or use --backend tcp"));
}

// The host-memory backends, by name (nullptr for any other name).
inline std::unique_ptr<Communicator> make_host_communicator(std::string_view backend,
                                                            const env::LaunchInfo& info,
                                                            store::Store& store,
                                                            const CommOptions& opts) {
  if (backend == "tcp") return std::make_unique<TcpCommunicator>(info, store, opts);
  if (backend == "gloo") {
    detail::log_gloo_alias_once();
    return std::make_unique<TcpCommunicator>(info, store, opts);
  }
  if (backend == "mpi") {
#if DDP_WITH_MPI
    auto comm = std::make_unique<MpiCommunicator>(opts);
    if (info.world_size > 1 && (comm->size() != info.world_size || comm->rank() != info.rank))
      throw ConfigError(ddp::detail::str("ddp: --backend mpi: MPI says rank ", comm->rank(), " of ",
                                         comm->size(), " but the launcher (", info.source,
                                         ") says rank ", info.rank, " of ", info.world_size,
                                         "; start the job with mpirun, or use --backend tcp."));
    return comm;
#else
    detail::not_built(backend, "MPI", "DDP_WITH_MPI");
#endif
  }
  return nullptr;
}

// A host backend for tensors on CUDA device opts.cuda_device, staged through pinned host memory.
inline std::unique_ptr<Communicator> make_staged(std::string_view backend,
                                                 const env::LaunchInfo& info, store::Store& store,
                                                 const CommOptions& opts) {
#if DDP_WITH_CUDA
  // Checked before connecting, so that every rank fails the same way instead of waiting for this
  // one.
  const int device =
      CudaStagingDevice::usable(opts.cuda_device, info.rank, info.world_size, backend);
  return std::make_unique<CudaStagedCommunicator>(
      make_host_communicator(backend, info, store, opts), CudaStagingDevice(device), opts);
#else
  (void)info, (void)store;
  throw ConfigError(
      ddp::detail::str("ddp: --backend ", backend,
                       " with CUDA tensors (CommOptions::cuda_device = ", opts.cuda_device,
                       ") needs ddp built with CUDA: link ddp::cuda, or leave "
                       "cuda_device at -1 for host tensors."));
#endif
}

}  // namespace detail

// Builds and connects the communicator for this process. Collective over all ranks of `info`: every
// rank must call it (with the same backend and opts.cuda_device sign) before any of them can
// return. The store must outlive it.
inline std::unique_ptr<Communicator> make_communicator(std::string_view backend,
                                                       const env::LaunchInfo& info,
                                                       store::Store& store,
                                                       const CommOptions& opts = {}) {
  if (backend == "nccl") {
#if DDP_WITH_NCCL
    // One GPU per local rank unless the caller chose one.
    return std::make_unique<NcclCommunicator>(
        info, store, opts, opts.cuda_device >= 0 ? opts.cuda_device : info.local_rank);
#else
    detail::not_built(backend, "NCCL", "DDP_WITH_NCCL");
#endif
  }
  if (backend == "tcp" || backend == "gloo" || backend == "mpi") {
    if (opts.cuda_device >= 0) return detail::make_staged(backend, info, store, opts);
    return detail::make_host_communicator(backend, info, store, opts);
  }
  throw ConfigError(ddp::detail::str("ddp: unknown --backend ", ddp::detail::quoted(backend),
                                     "; valid: ", kBackendNames, "."));
}

}  // namespace ddp::comm
