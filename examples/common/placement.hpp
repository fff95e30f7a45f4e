// How an example joins its job: the device by train::choose_device's rules, then launch info -> the rank's
// GPU (made current before the communicator exists) -> store -> communicator. The two CUDA runtime calls
// it needs are declared in cuda_device.hpp and defined in cuda_device.cpp (compiled only when ddp::cuda
// exists).
// SPDX-License-Identifier: MIT
//
//   const ddp_example::Placement where = ddp_example::place(args["device"].as<std::string>(), dist.backend);
//   ... other flag checks, so that bad flags fail before any rendezvous ...
//   ddp_example::Job job = ddp_example::join(dist, where, env, launch);   // job.gpu: -1 on the CPU
// The CUDA calls are made only under `if constexpr (ddp::BuildConfig::with_cuda)`, so a CPU-only build needs
// no definition (a function named only in a discarded statement is not odr-used).
#pragma once

#include <memory>
#include <string_view>

#include <ddp/comm/communicator.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/config.hpp>
#include <ddp/core/log.hpp>
#include <ddp/env/detect.hpp>
#include <ddp/env/flags.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/rendezvous.hpp>
#include <ddp/train/device_choice.hpp>
#include <ddp/train/options.hpp>

#include "cuda_device.hpp"

namespace ddp_example {

struct Placement {
  ddp::train::DeviceChoice choice;
  int gpus = 0;  // visible CUDA devices

  bool is_cuda() const noexcept { return choice.is_cuda(); }
  // This local rank's GPU (train::cuda_device_for), made current; -1 on the CPU. Called before the
  // communicator is built, so nccl's device guard finds it current and no context is created on GPU 0 by
  // ranks that train elsewhere.
  int bind(std::string_view backend, int local_rank) const {
    if (!is_cuda()) return -1;
    const int gpu = ddp::train::cuda_device_for(backend, local_rank, gpus);
    if constexpr (ddp::BuildConfig::with_cuda) use_cuda_device(gpu);
    return gpu;
  }
};

// The device for --device `flag` and --backend `backend` (ConfigError when the rules refuse it); logs why
// when it picked one itself.
inline Placement place(std::string_view flag, std::string_view backend) {
  Placement p;
  if constexpr (ddp::BuildConfig::with_cuda) p.gpus = cuda_devices();
  p.choice = ddp::train::choose_device(
      {.flag = flag, .backend = backend, .built_with_cuda = ddp::BuildConfig::with_cuda, .visible_gpus = p.gpus});
  if (!p.choice.reason.empty()) DDP_LOG_INFO(p.choice.reason);
  return p;
}

// One rank's place in the job. Members are destroyed in reverse order: the communicator (whose destructor
// runs a bounded barrier) before the store it rendezvoused through.
struct Job {
  ddp::env::LaunchInfo info;
  int gpu = -1;  // this rank's CUDA device; -1 on the CPU
  std::unique_ptr<ddp::store::Store> store;
  std::unique_ptr<ddp::comm::Communicator> comm;
};

// Launch info (env::detect) -> GPU (Placement::bind) -> store (none for mpi) -> communicator.
inline Job join(const ddp::train::DistFlags& dist, const Placement& where, const ddp::env::Env& env,
                const ddp::env::LaunchFlags& launch) {
  Job job;
  job.info = ddp::env::detect(env, launch, {.need_master_addr = dist.needs_store(), .backend = dist.backend});
  ddp::log::set_rank(job.info.rank, job.info.world_size);
  job.gpu = where.bind(dist.backend, job.info.local_rank);
  job.store = dist.needs_store() ? ddp::store::make_store(job.info, dist.timeout, dist.store_port)
                                 : std::make_unique<ddp::store::HashStore>(dist.timeout);
  job.comm = ddp::comm::make_communicator(dist.backend, job.info, *job.store, dist.comm_options(job.gpu));
  return job;
}

}  // namespace ddp_example
