// Device and per-rank GPU choice of a training program: one set of rules for every example.
// SPDX-License-Identifier: MIT
//
//   const int gpus = BuildConfig::with_cuda ? cuda_devices() : 0;  // cudaGetDeviceCount (.cu/.cpp)
//   const auto choice = train::choose_device({.flag = args["device"].as<std::string>(),
//                                             .backend = dist.backend,
//                                             .built_with_cuda = BuildConfig::with_cuda,
//                                             .visible_gpus = gpus});
//   if (!choice.reason.empty()) DDP_LOG_INFO(choice.reason);  // picked without --device: say why
//   ... env::detect(...) ...
//   if (choice.is_cuda()) gpu = train::cuda_device_for(dist.backend, info.local_rank, gpus);
// The inputs are plain values (the GPU count is passed in), so every rule is unit-tested without a
// GPU. Rules (each refusal is a ConfigError naming the flag and the fix):
//   --device cpu   any backend but nccl (NCCL reduces GPU memory only)
//   --device cuda  needs a build with CUDA and a visible GPU; nccl, gloo or tcp (tcp stages CUDA
//                  tensors through pinned host memory, as torch's gloo does); not mpi, whose
//                  backend reaches host memory only (docs/decisions/0024)
//   no --device    the GPU when the build has CUDA and one is visible, except under --backend mpi;
//                  else the CPU, which --backend nccl refuses; the reason is returned to be logged
//   GPU per rank   nccl: GPU LOCAL_RANK (NCCL refuses two ranks on one GPU); gloo/tcp: ranks share
//                  the visible GPUs round-robin (LOCAL_RANK mod GPUs), so world 2-4 fits one GPU
#pragma once

#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::train {

struct DeviceRequest {
  std::string_view flag;  // --device: "" (pick), "cpu" or "cuda"
  // --backend: nccl, gloo, tcp, mpi (the comm factory refuses other names)
  std::string_view backend;
  bool built_with_cuda = false;  // ddp::BuildConfig::with_cuda of the program
  int visible_gpus = 0;          // cudaGetDeviceCount (0 without a driver or device)
};

struct DeviceChoice {
  std::string device;  // "cpu" or "cuda"
  // why, when picked without --device (for one log line); empty when --device said it
  std::string reason;
  bool is_cuda() const noexcept { return device == "cuda"; }
};

// The device for `r` by the rules of the file comment; ConfigError when they refuse it.
inline DeviceChoice choose_device(const DeviceRequest& r) {
  using ddp::detail::str;
  const bool nccl = r.backend == "nccl", mpi = r.backend == "mpi";
  if (r.flag == "cpu") {
    if (nccl)
      throw ConfigError(
          "ddp: --backend nccl reduces GPU memory, but --device cpu was given; use --backend gloo "
          "(or "
          "tcp, mpi) on the CPU, or drop --device cpu to train on the GPU");
    return {.device = "cpu"};
  }
  if (r.flag == "cuda") {
    if (!r.built_with_cuda)
      throw ConfigError(
          "ddp: --device cuda: this program was built without CUDA; reconfigure with "
          "-DDDP_WITH_CUDA=ON (and NCCL for --backend nccl) or pass --device cpu");
    if (r.visible_gpus <= 0)
      throw ConfigError(
          "ddp: --device cuda: no CUDA device is visible (check nvidia-smi and "
          "CUDA_VISIBLE_DEVICES); "
          "pass --device cpu with --backend gloo");
    if (mpi)
      throw ConfigError(
          "ddp: --device cuda with --backend mpi: the mpi backend moves host memory only; train on "
          "the "
          "GPU with --backend nccl (one GPU per rank) or --backend gloo (stages through host "
          "memory, "
          "ranks may share a GPU), or keep --backend mpi with --device cpu");
    return {.device = "cuda"};
  }
  if (!r.flag.empty())
    throw ConfigError(str("ddp: unknown --device ", ddp::detail::quoted(r.flag),
                          "; valid: cpu, cuda (or leave --device out to pick)"));
  const bool gpu = r.built_with_cuda && r.visible_gpus > 0;
  if (gpu && !mpi)
    return {.device = "cuda",
            .reason = str("--device not given: training on the GPU (", r.visible_gpus,
                          " visible; this rank uses the one its LOCAL_RANK picks)")};
  if (nccl)
    throw ConfigError(
        r.built_with_cuda
            ? "ddp: --backend nccl needs a GPU but no CUDA device is visible (check nvidia-smi and "
              "CUDA_VISIBLE_DEVICES); use --backend gloo to train on the CPU"
            : "ddp: --backend nccl needs a build with CUDA and NCCL; this one has neither, so use "
              "--backend gloo to train on the CPU (or reconfigure with -DDDP_WITH_CUDA=ON)");
  const char* why = !r.built_with_cuda ? "built without CUDA"
                    : gpu              ? "--backend mpi moves host memory only"
                                       : "no CUDA device is visible";
  return {.device = "cpu", .reason = str("--device not given: training on the CPU (", why, ")")};
}

// The CUDA device ordinal of local rank `local_rank` (0-based) among `visible_gpus` (> 0): see the
// file comment. ConfigError when nccl has more local ranks than GPUs.
inline int cuda_device_for(std::string_view backend, int local_rank, int visible_gpus) {
  if (visible_gpus <= 0)
    throw ConfigError(
        "ddp: --device cuda: no CUDA device is visible (check nvidia-smi and "
        "CUDA_VISIBLE_DEVICES); "
        "pass --device cpu with --backend gloo");
  if (local_rank < 0)
    throw ConfigError(
        ddp::detail::str("ddp: LOCAL_RANK must be >= 0, got ", local_rank, " (--local-rank)"));
  if (backend != "nccl") return local_rank % visible_gpus;
  if (local_rank >= visible_gpus)
    throw ConfigError(ddp::detail::str(
        "ddp: --backend nccl needs one GPU per process, but LOCAL_RANK ", local_rank, " sees only ",
        visible_gpus, " GPU(s); start at most ", visible_gpus,
        " process(es) per node (--nproc-per-node, mpirun -np/-npernode), "
        "make more GPUs visible (CUDA_VISIBLE_DEVICES), or use --backend gloo, whose ranks can "
        "share a GPU"));
  return local_rank;
}

}  // namespace ddp::train
