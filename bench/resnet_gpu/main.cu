// bench_resnet_gpu: training-step throughput (images/s) and peak GPU memory of ddp's ResNets on the GPU, per
// precision, beside torchvision's under PyTorch eager (torch_step.py) with the same batch, precision and
// channels_last, measured in the same run, with the ratio.
// SPDX-License-Identifier: MIT
//
// Usage: bench_resnet_gpu [--batch N] [--image-size S] [--arch A]... [--precision P]... [--conv C]... [--steps N]
//                         [--warmup N] [--python PATH] [--no-torch] [--torch-compile M]... [--peak-tflops F]
//                         [--device I]
//   defaults: batch 64, 224x224, archs resnet18 resnet50 resnet152, precisions fp32 tf32 bf16, convolutions
//   own plus cudnn and cudnn_find where built with cuDNN (tensor/conv_impl.hpp; torch_step.py sets
//   cudnn.benchmark, so cudnn_find is the like-for-like row), 20 timed steps after 5 warm-up steps, python
//   "python3" (or $DDP_BENCH_PYTHON), device 0. PyTorch runs once per arch and precision; each conv row
//   carries its numbers. --torch-compile default|max-autotune adds torch.compile rows' numbers
//   ("torch_compile_<mode>_images_per_s", ...; "..._error" where it does not compile, each child capped at
//   240 s by timeout(1), so that a row fits one device call).
// TFLOP/s: torch_step.py counts one step's floating-point operations with torch's FlopCounterMode
// ("step_flops", the same torchvision architecture as ours); each side's achieved TFLOP/s is that over its step
// time, and "ddp_fraction_of_peak" divides ddp's by --peak-tflops (default 989: the H100/H200 SXM dense bf16
// tensor-core peak; use the tf32 figure, 494, for tf32 rows).
// One step = zero_grad, forward, cross-entropy (its value read on the host, like loss.item()), backward,
// SGD (momentum 0.9) -- the same in torch_step.py. Timed with the host clock around `steps` steps after a
// device synchronisation on both sides. Peak memory: ddp's stream-ordered pool high-water mark
// (tensor/cuda/allocator.hpp; cuBLAS's own workspace is not in it) vs torch.cuda.max_memory_allocated().
// Precision: ddp's Exec<Cuda>::precision (tensor/precision.hpp: bf16 rounds conv/linear operands only;
// activations stay float32 in memory); torch: fp32 = allow_tf32 off, tf32 = allow_tf32 on (matmul and
// cudnn), bf16 = autocast(bfloat16) with float32 master weights (activations bf16 in memory).
// Output: one JSON object per line, e.g. (the numbers only show the form: nothing has been measured yet)
//   {"arch":"resnet50","batch":64,"image_size":224,"precision":"bf16","conv":"cudnn_find","gpu":"NVIDIA H100 80GB HBM3",
//    "ddp_images_per_s":812.0,"ddp_peak_mem_bytes":1.2e10,"torch_images_per_s":2400.0,
//    "torch_peak_mem_bytes":9.1e9,"ratio_ddp_over_torch":0.34,"mem_ratio_ddp_over_torch":1.3}
// ratio > 1 means ddp is faster (images/s over images/s).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/child_json.hpp"

#include <ddp/kernels/cuda/kernels.cuh>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/tensor/cuda/allocator.hpp>
#include <ddp/tensor/cuda/copy.hpp>
#include <ddp/tensor/conv_impl.hpp>
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
  int steps, warmup;
};

nlohmann::json run_ddp(const Config& c) {
  Stream stream;
  Exec<Cuda> exec = stream.exec(parse_precision(c.precision), false, c.conv);
  nlohmann::json out;
  {
    nn::ResNet<float, Cuda> model({.arch = c.arch, .num_classes = 1000});
    optim::SGD<float, Cuda> opt(model, {.lr = 0.1, .momentum = 0.9});
    Tensor<float, Cpu> xh(Shape{c.batch, c.size, c.size, 3});
    Generator(0, 0, kStreamData).fill_normal(xh.view(), 0.0, 1.0);
    Tensor<std::int64_t, Cpu> yh(Shape{c.batch});
    for (std::int64_t i = 0; i < c.batch; ++i) yh.data()[i] = (i * 37) % 1000;
    const Tensor<float, Cuda> x = to<Cuda>(xh.cview(), exec);
    const Tensor<std::int64_t, Cuda> y = to<Cuda>(yh.cview(), exec);
    nn::CrossEntropyLoss<float, Cuda> ce;
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
    const auto t0 = Clock::now();
    for (int i = 0; i < c.steps; ++i) step();
    stream.synchronize();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    out = {{"ddp_images_per_s", static_cast<double>(c.batch * c.steps) / secs},
           {"ddp_step_s", secs / c.steps},
           {"ddp_peak_mem_bytes", static_cast<double>(cuda_memory_stats().peak_bytes)},
           {"ddp_last_loss", loss}};
  }
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

// Runs torch_step.py in a child python (eager, or torch.compile in `mode`); returns its JSON, or
// {"torch_error": ...} / {"torch_compile_<mode>_error": ...}.
nlohmann::json run_torch(const Config& c, const std::string& python, int device, const std::string& mode = "none") {
  const std::string cmd = "timeout 240 " + python + " " + DDP_BENCH_TORCH_SCRIPT + " --arch " + c.arch + " --batch " +
                          std::to_string(c.batch) + " --image-size " + std::to_string(c.size) + " --precision " +
                          c.precision + " --steps " + std::to_string(c.steps) + " --warmup " +
                          std::to_string(c.warmup) + " --device " + std::to_string(device) + " --compile " + mode;
  nlohmann::json j = ddp_bench::run_child_json(cmd);
  if (mode != "none" && j.contains("torch_error"))  // the child did not start or printed no JSON
    j = {{torch_prefix(mode) + "error", j["torch_error"]}};
  return j;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--batch N] [--image-size S] [--arch A]... [--precision fp32|tf32|bf16]... "
               "[--conv own|cudnn|cudnn_find]... [--steps N] [--warmup N] [--python PATH] [--no-torch] "
               "[--torch-compile default|max-autotune]... [--peak-tflops F] [--device I]\n",
               argv0);
  return 2;
}

int run(int argc, char** argv) {
  std::int64_t batch = 64, size = 224;
  int steps = 20, warmup = 5, device = 0;
  bool torch = true;
  std::vector<std::string> archs, precisions, convs, compile_modes;
  double peak_tflops = 989.0;
  const char* env_python = std::getenv("DDP_BENCH_PYTHON");
  std::string python = env_python ? env_python : "python3";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--no-torch") {
      torch = false;
    } else if (a == "--batch" && has_value) {
      batch = std::atol(argv[++i]);
    } else if (a == "--image-size" && has_value) {
      size = std::atol(argv[++i]);
    } else if (a == "--arch" && has_value) {
      archs.push_back(argv[++i]);
    } else if (a == "--precision" && has_value) {
      precisions.push_back(argv[++i]);
    } else if (a == "--torch-compile" && has_value && (std::strcmp(argv[i + 1], "default") == 0 ||
                                                       std::strcmp(argv[i + 1], "max-autotune") == 0)) {
      compile_modes.push_back(argv[++i]);
    } else if (a == "--peak-tflops" && has_value) {
      peak_tflops = std::atof(argv[++i]);
    } else if (a == "--conv" && has_value) {
      convs.push_back(argv[++i]);
    } else if (a == "--steps" && has_value) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && has_value) {
      warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--python" && has_value) {
      python = argv[++i];
    } else if (a == "--device" && has_value) {
      device = std::atoi(argv[++i]);
    } else {
      return usage(argv[0]);
    }
  }
  if (batch < 1 || size < 32 || !(peak_tflops > 0)) return usage(argv[0]);
  if (archs.empty()) archs = {"resnet18", "resnet50", "resnet152"};
  if (precisions.empty()) precisions = {"fp32", "tf32", "bf16"};
  if (convs.empty() && resolve_conv_impl(ConvImpl::Auto) == ConvImpl::Cudnn) convs = {"own", "cudnn", "cudnn_find"};
  if (convs.empty()) convs = {"own"};
  try {
    for (const auto& p : precisions) (void)parse_precision(p);
    for (const auto& v : convs) (void)resolve_conv_impl(parse_conv_impl(v));
    if (cuda_device_count() == 0) {
      std::fprintf(stderr, "bench_resnet_gpu: no CUDA device visible\n");
      return 77;
    }
    DDP_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    for (const auto& arch : archs)
      for (const auto& prec : precisions) {
        nlohmann::json torch_result;
        for (const auto& conv : convs) {
          const Config c{arch, batch, size, prec, parse_conv_impl(conv), steps, warmup};
          nlohmann::json j = {{"arch", arch},     {"batch", batch}, {"image_size", size},   {"precision", prec},
                              {"conv", conv},     {"gpu", prop.name}, {"steps", steps}, {"channels_last", true}};
          j.update(run_ddp(c));
          if (torch && torch_result.is_null()) {
            torch_result = run_torch(c, python, device);
            for (const auto& mode : compile_modes) torch_result.update(run_torch(c, python, device, mode));
          }
          if (torch) j.update(torch_result);
          if (j.contains("torch_images_per_s")) {
            j["ratio_ddp_over_torch"] = j["ddp_images_per_s"].get<double>() / j["torch_images_per_s"].get<double>();
            j["mem_ratio_ddp_over_torch"] =
                j["ddp_peak_mem_bytes"].get<double>() / std::max(1.0, j["torch_peak_mem_bytes"].get<double>());
          }
          std::vector<std::string> sides = {"ddp_", torch_prefix("none")};  // key prefixes of each run
          for (const auto& mode : compile_modes) {
            const std::string p = torch_prefix(mode);
            sides.push_back(p);
            if (j.contains(p + "images_per_s"))  // "ratio_ddp_over_torch_compile_<mode>"
              j["ratio_ddp_over_" + p.substr(0, p.size() - 1)] =
                  j["ddp_images_per_s"].get<double>() / j[p + "images_per_s"].get<double>();
          }
          if (j.contains("step_flops")) {  // achieved TFLOP/s of each side, from torch's count of one step
            const double flops = j["step_flops"].get<double>();
            for (const auto& side : sides)
              if (j.contains(side + "step_s")) j[side + "tflops"] = flops / j[side + "step_s"].get<double>() / 1e12;
            j["peak_tflops"] = peak_tflops;
            j["ddp_fraction_of_peak"] = j["ddp_tflops"].get<double>() / peak_tflops;
          }
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        }
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace bench_gpu

int main(int argc, char** argv) { return bench_gpu::run(argc, argv); }
