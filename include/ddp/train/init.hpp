// init_process_group: a training program's one start-up call, as
// torch.distributed.init_process_group.
// SPDX-License-Identifier: MIT
//
//   int main(int argc, char** argv) {
//     ddp::train::InitFlags init(argc, argv);   // takes --rank, --local_rank=N, ... out of argv
//     cxxopts::Options options("prog", "...");
//     options.add_options()("epochs", ...);       // the program's own flags
//     init.add_options(options);                  // --backend, --device, --timeout-ms, ...
//     const auto args = ddp::train::parse_args(options, argc, argv);
//     const ddp::train::DistFlags& dist = init.read(args);  // bad flags fail before rendezvous
//     ddp::train::Job job = ddp::train::init_process_group(init);
//     ... job.rank(), job.world_size(), job.local_rank(), job.cuda_device(), job.communicator() ...
//   }  // ~Job: the communicator's bounded barrier, then the store
// Programs with no check of their own between the parse and the join use the argv overload below
// (it also adds -h,--help).
// InitFlags reads the launch flags (env/flags.hpp), the environment (env::Env::process(); tests
// pass a fake one), the distributed flags (train/options.hpp, DistFlags) and --device
// (train/device_choice.hpp: cpu, cuda or picked; a log line says why when picked).
// init_process_group then, in order:
//   1. env::detect: which launcher started the process (torchrun, env://, mpirun, srun, ...),
//      flags over it;
//   2. makes the GPU of this local rank (train::cuda_device_for) current before any communicator
//      exists, so nccl and the staging copies find it and no rank creates a context on GPU 0;
//   3. the store: store::make_store (torchrun's agent store, or one rank 0 hosts), none for
//      --backend mpi, or the caller's (torch's `store=`: a HashStore shared by threads in tests);
//   4. comm::make_communicator(--backend), over that GPU's memory when training there.
// Torch's names (docs/decisions/0067): the process group is job.communicator();
// dist.get_rank()/get_world_size() are job.rank()/world_size(); LOCAL_RANK is job.local_rank();
// torch.cuda.set_device(local_rank) is step 2; destroy_process_group is ~Job. The header compiles
// without CUDA: step 2's runtime calls are found on the device tag Cuda and instantiated only in
// builds with CUDA (BuildConfig::with_cuda).
#pragma once

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <cxxopts.hpp>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/factory.hpp"
#include "ddp/config.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/env/detect.hpp"
#include "ddp/env/env.hpp"
#include "ddp/env/flags.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/rendezvous.hpp"
#include "ddp/store/store.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/train/device_choice.hpp"
#include "ddp/train/options.hpp"
#include "ddp/train/parse_args.hpp"

namespace ddp::train {

struct InitOptions {
  std::string default_backend = "gloo";  // --backend's default
  // the program computes on the CPU only: no --device flag, no GPU bound
  bool cpu_only = false;
};

// The start-up settings, read before any rendezvous (the file comment shows the calls' order).
class InitFlags {
 public:
  // Takes the launch flags out of argv (argc updated; ConfigError for a bad one) and keeps `env`.
  InitFlags(int& argc, char** argv, InitOptions opts = {}, env::Env env = env::Env::process())
      : opts_(std::move(opts)),
        env_(std::move(env)),
        launch_(env::extract_launch_flags(argc, argv)) {}

  // Adds the distributed flags (add_dist_options; their defaults come from DDP_* variables of the
  // environment) and, unless InitOptions::cpu_only, --device.
  void add_options(cxxopts::Options& options) const {
    add_dist_options(options, env_, opts_.default_backend);
    if (!opts_.cpu_only)
      options.add_options("distributed")("device",
                                         "cpu or cuda (default: cuda when built with CUDA and a "
                                         "GPU is visible, except for --backend mpi; "
                                         "else cpu)",
                                         cxxopts::value<std::string>()->default_value(""));
  }

  // Reads what add_options added and chooses the device (choose_device; ConfigError if refused).
  const DistFlags& read(const cxxopts::ParseResult& args);

  const DistFlags& dist() const noexcept { return dist_; }
  const DeviceChoice& device() const noexcept { return device_; }
  int visible_gpus() const noexcept { return gpus_; }
  const env::Env& environment() const noexcept { return env_; }
  const env::LaunchFlags& launch_flags() const noexcept { return launch_; }
  bool was_read() const noexcept { return read_; }

 private:
  InitOptions opts_;
  env::Env env_;
  env::LaunchFlags launch_;
  DistFlags dist_;
  DeviceChoice device_;
  int gpus_ = 0;
  bool read_ = false;
};

class Job;

namespace detail {

// The CUDA runtime through the device tag (tensor/cuda/current_device.hpp): templates, found by
// argument-dependent lookup on D = Cuda only where a build with CUDA instantiates them.
template <class D = Cuda>
int visible_gpus() {
  if constexpr (BuildConfig::with_cuda)
    return visible_devices(D{});
  else
    return 0;
}
template <class D = Cuda>
void make_current(int gpu) {
  if constexpr (BuildConfig::with_cuda)
    set_current_device(D{}, gpu);
  else
    (void)gpu;  // unreachable: choose_device refuses cuda in a build without it
}

Job join(const InitFlags& init, std::shared_ptr<store::Store> store);

}  // namespace detail

// This process's place in the job, as init_process_group left it: launch info, device, store,
// communicator. Move-only and not assignable: assigning would release the old store while the old
// communicator still uses it.
class Job {
 public:
  Job(Job&&) noexcept = default;
  Job& operator=(Job&&) = delete;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  // members in reverse order: the communicator (its bounded barrier) before the store
  ~Job() = default;

  // the communicator's: MPI's own under --backend mpi
  int rank() const noexcept { return comm_->rank(); }
  int world_size() const noexcept { return comm_->size(); }
  int local_rank() const noexcept { return info_.local_rank; }
  int local_world_size() const noexcept { return info_.local_world_size; }
  // node rank, restart count, launcher, ...
  const env::LaunchInfo& info() const noexcept { return info_; }
  const DeviceChoice& device() const noexcept { return device_; }
  // this rank's GPU, made current; -1 on the CPU
  int cuda_device() const noexcept { return gpu_; }
  comm::Communicator& communicator() const noexcept { return *comm_; }
  store::Store& store() const noexcept { return *store_; }
  // The distributed flags this job was made from: flags().ddp is what --bucket-cap-mb,
  // --comm-hook, --find-unused-parameters, --static-graph and --gradient-as-bucket-view ask of
  // DistributedDataParallel (pass it to its constructor); metrics_file, tensorboard_dir and trace
  // are the Bookkeeper's outputs. Flags a program does not pass on have no effect.
  const DistFlags& flags() const noexcept { return flags_; }

 private:
  friend Job detail::join(const InitFlags& init, std::shared_ptr<store::Store> store);
  Job() = default;

  env::LaunchInfo info_;
  DeviceChoice device_;
  DistFlags flags_;
  int gpu_ = -1;
  // shared: the caller may keep the store it passed in
  std::shared_ptr<store::Store> store_;
  std::unique_ptr<comm::Communicator> comm_;  // after store_, so destroyed before it
};

inline const DistFlags& InitFlags::read(const cxxopts::ParseResult& args) {
  dist_ = read_dist_flags(args);
  if (opts_.cpu_only) {
    if (dist_.backend == "nccl")
      throw ConfigError(
          "ddp: --backend nccl reduces GPU memory, but this program computes on the CPU only; use "
          "--backend gloo (or tcp, mpi)");
    device_ = {.device = "cpu"};
    gpus_ = 0;
  } else {
    gpus_ = detail::visible_gpus();
    device_ = choose_device({.flag = args["device"].as<std::string>(),
                             .backend = dist_.backend,
                             .built_with_cuda = BuildConfig::with_cuda,
                             .visible_gpus = gpus_});
    if (!device_.reason.empty()) DDP_LOG_INFO(device_.reason);
  }
  read_ = true;
  return dist_;
}

namespace detail {

inline Job join(const InitFlags& init, std::shared_ptr<store::Store> given) {
  if (!init.was_read())
    throw ConfigError(
        "ddp: init_process_group before InitFlags::read: parse argv, then call init.read(args) (it "
        "reads --backend and --device), then init_process_group(init)");
  const DistFlags& dist = init.dist();
  Job job;
  job.info_ =
      env::detect(init.environment(), init.launch_flags(),
                  {.need_master_addr = !given && dist.needs_store(), .backend = dist.backend});
  log::set_rank(job.info_.rank, job.info_.world_size);
  job.device_ = init.device();
  job.flags_ = dist;
  if (job.device_.is_cuda()) {
    job.gpu_ = cuda_device_for(dist.backend, job.info_.local_rank, init.visible_gpus());
    make_current(job.gpu_);
  }
  if (given)
    job.store_ = std::move(given);
  else if (dist.needs_store())
    job.store_ = store::make_store(job.info_, dist.timeout, dist.store_port);
  else  // mpi: MPI's own rendezvous; the communicator takes a store it never uses
    job.store_ = std::make_shared<store::HashStore>(dist.timeout);
  job.comm_ =
      comm::make_communicator(dist.backend, job.info_, *job.store_, dist.comm_options(job.gpu_));
  return job;
}

}  // namespace detail

// Joins the job as `init` (read) says: launch info, GPU, store, communicator (file comment).
// Collective: every rank must call it. ConfigError for a bad launch environment,
// StoreError/TimeoutError when the rendezvous fails.
inline Job init_process_group(const InitFlags& init) { return detail::join(init, nullptr); }

// The same over the caller's store (torch's `store=`), which every rank of the job must reach; rank
// and world size still come from the launcher or the --rank/--world-size flags.
inline Job init_process_group(const InitFlags& init, std::shared_ptr<store::Store> store) {
  if (!store)
    throw ConfigError(
        "ddp: init_process_group(init, store): the store is null; pass a store or call "
        "init_process_group(init)");
  return detail::join(init, std::move(store));
}

namespace detail {

// The launch flags for --help: InitFlags takes them out of argv, so cxxopts never lists them.
inline std::string launch_flags_help() {
  std::string s = "Launch flags (over the launcher's variables):";
  for (const auto& f : env::detail::kLaunchFlags) s.append(" ").append(f.flag);
  return s + "\n";
}

}  // namespace detail

// What the start-up from argv returns: the job, empty when --help was given (printed; no rendezvous
// joined), and the parsed flags, the program's own and the distributed ones.
struct Startup {
  std::optional<Job> job;
  cxxopts::ParseResult args;
};

// The whole start-up from argv (the file comment's steps): InitFlags, the distributed flags and,
// unless `options` has its own, -h,--help added to `options`, parse_args; then on --help the help
// to stdout and an empty job, else InitFlags::read and init_process_group(init).
//   cxxopts::Options options("prog", "...");
//   options.add_options()("epochs", ...);
//   auto [job, args] = ddp::train::init_process_group(argc, argv, options, {.cpu_only = true});
//   if (!job) return 0;  // --help
//   ... job->rank(), job->communicator(), args["epochs"].as<int>() ...
inline Startup init_process_group(int& argc, char** argv, cxxopts::Options& options,
                                  InitOptions opts = {}, env::Env env = env::Env::process()) {
  InitFlags init(argc, argv, std::move(opts), std::move(env));
  init.add_options(options);
  if (!detail::has_option(options, "help"))
    options.add_options()(detail::has_option(options, "h") ? "help" : "h,help",
                          "print this help and exit");
  cxxopts::ParseResult args = parse_args(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help() << detail::launch_flags_help() << std::flush;
    return {std::nullopt, std::move(args)};
  }
  init.read(args);
  return {init_process_group(init), std::move(args)};
}

}  // namespace ddp::train
