// bench_resnet_gpu: training-step throughput (images/s) and peak GPU memory of ddp's ResNets on the GPU, per
// precision, beside torchvision's under PyTorch eager (torch_step.py) with the same batch, precision and
// channels_last, measured in the same run, with the ratio; --profile adds device time per op class on both sides.
// SPDX-License-Identifier: MIT
//
// Usage: bench_resnet_gpu [--batch N] [--image-size S] [--arch A]... [--precision P]... [--conv C]...
//                         [--activations fp32|bf16]... [--steps N] [--warmup N] [--python PATH] [--no-torch]
//                         [--torch-compile M]... [--torch-timeout S] [--peak-tflops F] [--profile [--profile-steps N]]
//                         [--device I] [--recompute-relu off|on]...
//        bench_resnet_gpu --device-info [--device I]
//   defaults: batch 64, 224x224, archs resnet18 resnet50 resnet152, precisions fp32 tf32 bf16, convolutions
//   own plus cudnn and cudnn_find where built with cuDNN (tensor/conv_impl.hpp; torch_step.py sets
//   cudnn.benchmark, so cudnn_find is the like-for-like row), activations fp32, 20 timed steps after 5 warm-up
//   steps, python "python3" (or $DDP_BENCH_PYTHON), each torch child capped at 240 s by timeout(1), device 0.
// Rows and their order: for each arch and precision PyTorch runs first (a child process, once; its numbers go
// into every row of the pair), then one ddp row per conv and activations. PyTorch first: its number is the
// reference a row is read against, so a ddp failure (or a device fault that ends this process) cannot take
// it along, and it runs while this process holds no cached memory, so the two sides never share the GPU's
// memory. Each ddp row starts and ends by returning the pool's cached blocks to the driver
// (release_cached_cuda_memory), so a row's reserved bytes are its own.
// A row that throws prints its row with "ddp_error" (the exception's text) and the next row runs; the exit
// status is then 1 (also when a requested torch run failed: "torch_error"), else 0.
// --activations bf16: ddp's ResNet<float, Cuda, bfloat16>, activations and their gradients stored in bf16,
// parameters and optimizer in float (docs/decisions/0070; each op widens to float and rounds its stores, so today
// it saves memory, not time). "fp32 bf16" gives one row each. PyTorch's bf16 (autocast) keeps its activations in
// bf16 either way.
// --recompute-relu on: ddp's ResNet frees its relu(bn) outputs after forward and recomputes them in backward
// (ResNetOptions::recompute_relu, docs/decisions/0068; off by default); "off on" gives one row each.
// --profile: after the timed steps, --profile-steps (default 3) more steps run with CUDA events around every
// op (kernels/cuda/op_profile.cuh, docs/decisions/0060): "ddp_profile" holds ms and calls per step per op
// class ("conv.wgrad.cudnn", "bn_act_forward.stats", "add", "fill", "optimizer.sgd", "loss.cross_entropy", ...;
// "(unscoped)" is what ran outside every scope), and the table is printed on stderr. torch_step.py
// --profile adds torch.profiler's top kernels ("torch_profile_top") and their sums by the same classes
// ("torch_profile_classes", by kernel name). The profiled steps are not the timed ones.
// --device-info: one JSON line with the device's properties, the CUDA runtime and driver, cuBLAS and the
// cuDNN library this process loaded; nothing else runs.
// TFLOP/s: torch_step.py counts one step's floating-point operations with torch's FlopCounterMode
// ("step_flops", the same torchvision architecture as ours); each side's achieved TFLOP/s is that over its step
// time, and "ddp_fraction_of_peak" divides ddp's by --peak-tflops (default 989: the H100/H200 SXM dense bf16
// tensor-core peak; use the tf32 figure, 494, for tf32 rows).
// One step = zero_grad, forward, cross-entropy (its value read on the host, like loss.item()), backward,
// SGD (momentum 0.9) -- the same in torch_step.py. Timed with the host clock around `steps` steps after a
// device synchronisation on both sides.
// Memory, both sides, high-water marks over the timed steps:
//   <side>_peak_allocated_bytes  blocks handed to tensors: ddp's pool in its size classes
//                                (CachingPool::round_size), torch.cuda.max_memory_allocated (512-B rounded)
//   <side>_peak_reserved_bytes   obtained from the driver: ddp's pool (it only grows between releases, so its
//                                reserved bytes after the steps are the peak; "ddp_pool_returned_blocks" > 0
//                                says an out-of-memory retry returned blocks mid-row, making it a lower
//                                bound), torch.cuda.max_memory_reserved
//   <side>_peak_requested_bytes  the bytes the callers asked for, before rounding: ddp's pool
//                                (MemoryStats::peak_requested_bytes), torch's "requested_bytes.all.peak"
// cuBLAS's and cuDNN's own workspaces outside the pools are on neither side.
// Precision: ddp's Exec<Cuda>::precision (tensor/precision.hpp: bf16 rounds conv/linear operands only;
// activations stay float32 in memory); torch: fp32 = allow_tf32 off, tf32 = allow_tf32 on (matmul and
// cudnn), bf16 = autocast(bfloat16) with float32 master weights (activations bf16 in memory).
// Output: one JSON object per line, e.g. (the numbers only show the form)
//   {"arch":"resnet50","batch":64,"image_size":224,"precision":"bf16","conv":"cudnn_find","activations":"fp32",
//    "gpu":"NVIDIA H100 80GB HBM3","ddp_images_per_s":812.0,"ddp_peak_allocated_bytes":1.2e10,
//    "ddp_peak_reserved_bytes":1.3e10,"torch_images_per_s":2400.0,"torch_peak_allocated_bytes":9.1e9,
//    "torch_peak_reserved_bytes":9.6e9,"ratio_ddp_over_torch":0.34,"mem_ratio_allocated_ddp_over_torch":1.3,...}
// ratio > 1 means ddp is faster (images/s over images/s).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/child_json.hpp"

#include <ddp/config.hpp>
#include <ddp/core/error.hpp>
#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/kernels/cuda/op_profile.cuh>
#include <ddp/kernels/op_profile.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/tensor/conv_impl.hpp>
#include <ddp/tensor/cuda/allocator.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/cuda/stream.hpp>
#include <ddp/tensor/precision.hpp>
#include <ddp/tensor/random.hpp>

namespace bench_gpu {  // named: a using-directive at global (or unnamed-namespace) scope makes ddp::log clash
                       // with ::log inside CUDA's math headers
using namespace ddp;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string arch;
  std::int64_t batch, size;
  std::string precision;
  ConvImpl conv;
  std::string activations;  // "fp32" | "bf16"
  int steps, warmup, profile_steps;  // profile_steps 0: no profile
  bool recompute_relu;
};

// The pool's cached blocks back to the driver, the previous row's peak forgotten.
void release_pool() {
  release_cached_cuda_memory();
  reset_peak_cuda_memory();
}

// A: the activations' element type (float, or bfloat16 for --activations bf16).
template <class A>
nlohmann::json run_ddp(const Config& c) {
  release_pool();
  Stream stream;
  Exec<Cuda> exec = stream.exec(parse_precision(c.precision), false, c.conv);
  nlohmann::json out;
  {
    nn::ResNet<float, Cuda, A> model({.arch = c.arch, .num_classes = 1000, .recompute_relu = c.recompute_relu});
    optim::SGD<float, Cuda> opt(model, {.lr = 0.1, .momentum = 0.9});
    Tensor<float, Cpu> xf(Shape{c.batch, c.size, c.size, 3});
    Generator(0, 0, kStreamData).fill_normal(xf.view(), 0.0, 1.0);
    Tensor<A, Cpu> xh(xf.shape());
    for (std::int64_t i = 0; i < xf.numel(); ++i) xh.data()[i] = A(xf.data()[i]);
    Tensor<std::int64_t, Cpu> yh(Shape{c.batch});
    for (std::int64_t i = 0; i < c.batch; ++i) yh.data()[i] = (i * 37) % 1000;
    const Tensor<A, Cuda> x = to<Cuda>(xh.cview(), exec);
    const Tensor<std::int64_t, Cuda> y = to<Cuda>(yh.cview(), exec);
    nn::CrossEntropyLoss<A, Cuda> ce;
    double loss = 0.0;
    auto step = [&] {
      opt.zero_grad();
      auto logits = model.forward(exec, x.cview());
      loss = ce.forward(exec, logits.cview(), y.cview());
      model.backward(exec, ce.backward(exec).cview());
      opt.step(exec);
    };
    for (int i = 0; i < c.warmup; ++i) step();
    stream.synchronize();
    reset_peak_cuda_memory();
    const CudaMemoryStats m0 = cuda_memory_stats();
    const std::int64_t frees0 = ddp::detail::cuda_pool().stats().device_frees;
    const auto t0 = Clock::now();
    for (int i = 0; i < c.steps; ++i) step();
    stream.synchronize();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const CudaMemoryStats m = cuda_memory_stats();
    out = {{"ddp_images_per_s", static_cast<double>(c.batch * c.steps) / secs},
           {"ddp_step_s", secs / c.steps},
           {"ddp_peak_allocated_bytes", static_cast<double>(m.peak_bytes)},
           {"ddp_peak_reserved_bytes", static_cast<double>(m.reserved_bytes)},
           {"ddp_peak_requested_bytes", static_cast<double>(m.peak_requested_bytes)},
           {"ddp_device_mallocs_in_timed_steps", m.device_mallocs - m0.device_mallocs},
           {"ddp_pool_returned_blocks", ddp::detail::cuda_pool().stats().device_frees - frees0},
           {"ddp_last_loss", loss}};
    if (c.profile_steps > 0) {
      kernels::cuda::CudaOpProfiler profiler;
      kernels::OpProfile profile;
      const auto p0 = Clock::now();
      {
        const kernels::cuda::CudaOpProfiling on(profiler);
        for (int i = 0; i < c.profile_steps; ++i) step();
      }
      profiler.collect(profile, c.profile_steps);  // waits for the last event
      const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - p0).count();
      out["ddp_profile"] = nlohmann::json::parse(profile.json());
      out["ddp_profile"]["wall_ms_per_step"] = wall_ms / c.profile_steps;  // host clock, events included
      std::fprintf(stderr, "ddp op classes, %s %s b%lld conv %s (device ms per step over %d profiled steps):\n%s",
                   c.arch.c_str(), c.precision.c_str(), static_cast<long long>(c.batch),
                   std::string(conv_impl_name(c.conv)).c_str(), c.profile_steps, profile.table().c_str());
    }
  }
  release_pool();
  return out;
}

// The prefix of torch_step.py's keys for a run: "torch_" for eager ("none"), "torch_compile_<mode>_" with '-' as
// '_' for torch.compile ("max-autotune" -> "torch_compile_max_autotune_").
std::string torch_prefix(const std::string& mode) {
  if (mode == "none") return "torch_";
  std::string p = "torch_compile_" + mode + "_";
  std::replace(p.begin(), p.end(), '-', '_');
  return p;
}

struct TorchOptions {
  std::string python;
  int device, timeout_s, profile_steps;
};

// Runs torch_step.py in a child python (eager, or torch.compile in `mode`); returns its JSON, or
// {"torch_error": ...} / {"torch_compile_<mode>_error": ...}.
nlohmann::json run_torch(const Config& c, const TorchOptions& t, const std::string& mode = "none") {
  std::string cmd = "timeout " + std::to_string(t.timeout_s) + " " + t.python + " " + DDP_BENCH_TORCH_SCRIPT +
                    " --arch " + c.arch + " --batch " + std::to_string(c.batch) + " --image-size " +
                    std::to_string(c.size) + " --precision " + c.precision + " --steps " + std::to_string(c.steps) +
                    " --warmup " + std::to_string(c.warmup) + " --device " + std::to_string(t.device) +
                    " --compile " + mode;
  if (mode == "none" && t.profile_steps > 0) cmd += " --profile " + std::to_string(t.profile_steps);
  nlohmann::json j = ddp_bench::run_child_json(cmd);
  if (j.contains("torch_error") && j["torch_error"].is_string() && j["torch_error"].get<std::string>().empty())
    j["torch_error"] = "torch_step.py printed nothing: it crashed or ran past --torch-timeout " +
                       std::to_string(t.timeout_s) + " s (its stderr is in this program's)";
  if (mode != "none" && j.contains("torch_error"))  // the child did not start or printed no JSON
    j = {{torch_prefix(mode) + "error", j["torch_error"]}};
  return j;
}

// The libraries of `name` (e.g. "libcudnn") this process has mapped, from /proc/self/maps.
nlohmann::json loaded_libraries(const std::string& name) {
  std::set<std::string> paths;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const auto base = path.rfind('/');
    if (path.compare(base + 1, name.size(), name) == 0) paths.insert(path);
  }
  return nlohmann::json(std::vector<std::string>(paths.begin(), paths.end()));
}

nlohmann::json device_info(int device) {
  cudaDeviceProp p{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  auto attr = [device](cudaDeviceAttr a) {
    int v = 0;
    return cudaDeviceGetAttribute(&v, a, device) == cudaSuccess ? v : -1;
  };
  int runtime = 0, driver = 0, cublas_major = 0, cublas_minor = 0, cublas_patch = 0;
  DDP_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  DDP_CUDA_CHECK(cudaDriverGetVersion(&driver));
  DDP_CUBLAS_CHECK(cublasGetProperty(MAJOR_VERSION, &cublas_major));
  DDP_CUBLAS_CHECK(cublasGetProperty(MINOR_VERSION, &cublas_minor));
  DDP_CUBLAS_CHECK(cublasGetProperty(PATCH_LEVEL, &cublas_patch));
  std::size_t free_b = 0, total_b = 0;
  DDP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {{"device_properties",
           {{"device", device},
            {"name", p.name},
            {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
            {"multiprocessors", p.multiProcessorCount},
            {"total_global_mem_bytes", static_cast<double>(p.totalGlobalMem)},
            {"free_mem_bytes_now", static_cast<double>(free_b)},
            {"l2_cache_bytes", p.l2CacheSize},
            {"persisting_l2_max_bytes", p.persistingL2CacheMaxSize},
            {"shared_mem_per_sm_bytes", static_cast<double>(p.sharedMemPerMultiprocessor)},
            {"shared_mem_per_block_optin_bytes", static_cast<double>(p.sharedMemPerBlockOptin)},
            {"registers_per_sm", p.regsPerMultiprocessor},
            {"max_threads_per_sm", p.maxThreadsPerMultiProcessor},
            {"memory_bus_width_bits", p.memoryBusWidth},
            {"clock_khz", attr(cudaDevAttrClockRate)},
            {"memory_clock_khz", attr(cudaDevAttrMemoryClockRate)},
            {"ecc", attr(cudaDevAttrEccEnabled)},
            {"pci_bus_id", p.pciBusID},
            {"cuda_runtime", runtime},
            {"cuda_driver", driver},
            {"cublas", std::to_string(cublas_major) + "." + std::to_string(cublas_minor) + "." +
                           std::to_string(cublas_patch)},
            {"built_with_cudnn", BuildConfig::with_cudnn},
            {"cudnn_libraries_loaded", loaded_libraries("libcudnn")},
            {"conv_default", std::string(conv_impl_name(resolve_conv_impl(ConvImpl::Auto)))}}}};
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--batch N] [--image-size S] [--arch A]... [--precision fp32|tf32|bf16]... "
               "[--conv own|cudnn|cudnn_find]... [--activations fp32|bf16]... [--steps N] [--warmup N] "
               "[--python PATH] [--no-torch] [--torch-compile default|max-autotune]... [--torch-timeout S] "
               "[--peak-tflops F] [--profile] [--profile-steps N] [--device I] [--recompute-relu off|on]...\n"
               "       %s --device-info [--device I]\n",
               argv0, argv0);
  return 2;
}

// The derived numbers of a row: ratios of speed and memory, achieved TFLOP/s.
void add_ratios(nlohmann::json& j, const std::vector<std::string>& compile_modes, double peak_tflops) {
  if (!j.contains("ddp_images_per_s")) return;
  const double ddp = j["ddp_images_per_s"].get<double>();
  if (j.contains("torch_images_per_s")) j["ratio_ddp_over_torch"] = ddp / j["torch_images_per_s"].get<double>();
  for (const char* kind : {"allocated", "reserved", "requested"}) {
    const std::string d = std::string("ddp_peak_") + kind + "_bytes", t = std::string("torch_peak_") + kind + "_bytes";
    if (j.contains(d) && j.contains(t))
      j[std::string("mem_ratio_") + kind + "_ddp_over_torch"] =
          j[d].get<double>() / std::max(1.0, j[t].get<double>());
  }
  std::vector<std::string> sides = {"ddp_", torch_prefix("none")};  // key prefixes of each run
  for (const auto& mode : compile_modes) {
    const std::string p = torch_prefix(mode);
    sides.push_back(p);
    if (j.contains(p + "images_per_s"))  // "ratio_ddp_over_torch_compile_<mode>"
      j["ratio_ddp_over_" + p.substr(0, p.size() - 1)] = ddp / j[p + "images_per_s"].get<double>();
  }
  if (j.contains("step_flops")) {  // achieved TFLOP/s of each side, from torch's count of one step
    const double flops = j["step_flops"].get<double>();
    for (const auto& side : sides)
      if (j.contains(side + "step_s")) j[side + "tflops"] = flops / j[side + "step_s"].get<double>() / 1e12;
    j["peak_tflops"] = peak_tflops;
    j["ddp_fraction_of_peak"] = j["ddp_tflops"].get<double>() / peak_tflops;
  }
}

int run(int argc, char** argv) {
  std::int64_t batch = 64, size = 224;
  int steps = 20, warmup = 5, device = 0, torch_timeout = 240, profile_steps = 3;
  bool torch = true, profile = false, info = false;
  std::vector<std::string> archs, precisions, convs, compile_modes, activations;
  std::vector<bool> recompute;
  double peak_tflops = 989.0;
  const char* env_python = std::getenv("DDP_BENCH_PYTHON");
  std::string python = env_python ? env_python : "python3";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--no-torch") {
      torch = false;
    } else if (a == "--profile") {
      profile = true;
    } else if (a == "--device-info") {
      info = true;
    } else if (a == "--batch" && has_value) {
      batch = std::atol(argv[++i]);
    } else if (a == "--image-size" && has_value) {
      size = std::atol(argv[++i]);
    } else if (a == "--arch" && has_value) {
      archs.push_back(argv[++i]);
    } else if (a == "--precision" && has_value) {
      precisions.push_back(argv[++i]);
    } else if (a == "--activations" && has_value &&
               (std::strcmp(argv[i + 1], "fp32") == 0 || std::strcmp(argv[i + 1], "bf16") == 0)) {
      activations.push_back(argv[++i]);
    } else if (a == "--recompute-relu" && has_value &&
               (std::strcmp(argv[i + 1], "off") == 0 || std::strcmp(argv[i + 1], "on") == 0)) {
      recompute.push_back(std::strcmp(argv[++i], "on") == 0);
    } else if (a == "--torch-compile" && has_value && (std::strcmp(argv[i + 1], "default") == 0 ||
                                                       std::strcmp(argv[i + 1], "max-autotune") == 0)) {
      compile_modes.push_back(argv[++i]);
    } else if (a == "--torch-timeout" && has_value) {
      torch_timeout = std::atoi(argv[++i]);
    } else if (a == "--peak-tflops" && has_value) {
      peak_tflops = std::atof(argv[++i]);
    } else if (a == "--conv" && has_value) {
      convs.push_back(argv[++i]);
    } else if (a == "--steps" && has_value) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && has_value) {
      warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--profile-steps" && has_value) {
      profile_steps = std::atoi(argv[++i]);
    } else if (a == "--python" && has_value) {
      python = argv[++i];
    } else if (a == "--device" && has_value) {
      device = std::atoi(argv[++i]);
    } else {
      return usage(argv[0]);
    }
  }
  if (batch < 1 || size < 32 || !(peak_tflops > 0) || torch_timeout < 1 || profile_steps < 1) return usage(argv[0]);
  if (archs.empty()) archs = {"resnet18", "resnet50", "resnet152"};
  if (precisions.empty()) precisions = {"fp32", "tf32", "bf16"};
  if (activations.empty()) activations = {"fp32"};
  if (recompute.empty()) recompute = {false};
  int failures = 0;
  try {
    if (convs.empty() && resolve_conv_impl(ConvImpl::Auto) == ConvImpl::Cudnn) convs = {"own", "cudnn", "cudnn_find"};
    if (convs.empty()) convs = {"own"};
    for (const auto& p : precisions) (void)parse_precision(p);
    for (const auto& v : convs) (void)resolve_conv_impl(parse_conv_impl(v));
    if (cuda_device_count() == 0) {
      std::fprintf(stderr, "bench_resnet_gpu: no CUDA device visible\n");
      return 77;
    }
    DDP_CUDA_CHECK(cudaSetDevice(device));
    if (info) {
      std::printf("%s\n", device_info(device).dump().c_str());
      return 0;
    }
    cudaDeviceProp prop{};
    DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const TorchOptions topt{python, device, torch_timeout, profile ? profile_steps : 0};
    for (const auto& arch : archs)
      for (const auto& prec : precisions) {
        nlohmann::json torch_result = nlohmann::json::object();
        if (torch) {  // first: see the header
          const Config c{arch, batch, size, prec, ConvImpl::Auto, "fp32", steps, warmup, 0, false};
          torch_result = run_torch(c, topt);
          for (const auto& mode : compile_modes) torch_result.update(run_torch(c, topt, mode));
          if (torch_result.contains("torch_error")) ++failures;
        }
        for (const auto& conv : convs)
          for (const auto& act : activations)
          for (const bool rec : recompute) {
            const Config c{arch, batch, size, prec, parse_conv_impl(conv), act, steps, warmup,
                           profile ? profile_steps : 0, rec};
            nlohmann::json j = {{"arch", arch},       {"batch", batch},         {"image_size", size},
                                {"precision", prec},  {"conv", conv},           {"activations", act},
                                {"gpu", prop.name},   {"steps", steps},         {"warmup", warmup},
                                {"channels_last", true}, {"recompute_relu", rec}};
            {
              try {
                j.update(act == "bf16" ? run_ddp<bfloat16>(c) : run_ddp<float>(c));
              } catch (const std::exception& e) {
                ++failures;
                j["ddp_error"] = e.what();
                std::fprintf(stderr, "bench_resnet_gpu: row %s %s b%lld conv %s: %s\n", arch.c_str(), prec.c_str(),
                             static_cast<long long>(batch), conv.c_str(), e.what());
                (void)cudaGetLastError();  // a non-sticky error (out of memory) must not fail the next row
                try {
                  release_pool();
                } catch (const std::exception& e2) {  // a sticky device fault: every later row reports it too
                  j["ddp_error_release"] = e2.what();
                }
              }
            }
            j.update(torch_result);
            add_ratios(j, compile_modes, peak_tflops);
            std::printf("%s\n", j.dump().c_str());
            std::fflush(stdout);
          }
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_resnet_gpu: %s\n", e.what());
    return 1;
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace bench_gpu

int main(int argc, char** argv) { return bench_gpu::run(argc, argv); }
