// bench_resnet_cpu: one ResNet training step (forward + cross-entropy + backward + SGD) on the CPU, timed for
// ddp and, in the same run, for torchvision (tests/../torch_step.py under /usr/bin/python3), with the ratio.
// SPDX-License-Identifier: MIT
//
// Usage: bench_resnet_cpu [--quick] [--repeats N]
//   configurations: {resnet18, resnet50} x {224x224 batch 16, 32x32 batch 64} x {1, 2 threads}
//   --quick: only 2 threads and resnet18 at 224 plus both archs at 32 (for a fast look)
// Expected output: one JSON object per line, e.g.
//   {"arch":"resnet18","batch":16,"image_size":224,"threads":2,"ddp_step_s":1.9,"ddp_forward_s":0.6,
//    "ddp_backward_s":1.2,"ddp_sgd_s":0.03,"blas_core":"SkylakeX","torch_step_s":1.5,"ratio_ddp_over_torch":1.27}
// Times are medians over --repeats steps after one warm-up step; ratio > 1 means ddp is slower.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/child_json.hpp"

#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/tensor/random.hpp>

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string arch;
  std::int64_t batch, size;
  int threads;
};

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

nlohmann::json run_ddp(const Config& c, int repeats) {
  kernels::cpu::ThreadPool pool(c.threads);
  Exec<Cpu> exec{.pool = &pool};
  nn::ResNet<float, Cpu> model({.arch = c.arch, .num_classes = 1000});
  optim::SGD<float, Cpu> opt(model, {.lr = 0.1, .momentum = 0.9});
  Tensor<float, Cpu> x(Shape{c.batch, c.size, c.size, 3});
  Generator(0, 0, kStreamData).fill_normal(x.view(), 0.0, 1.0);
  Tensor<std::int64_t, Cpu> y(Shape{c.batch});
  for (std::int64_t i = 0; i < c.batch; ++i) y.data()[i] = (i * 37) % 1000;
  nn::CrossEntropyLoss<float, Cpu> ce;
  std::vector<double> fwd, bwd, sgd, total;
  for (int r = 0; r <= repeats; ++r) {  // r == 0: warm-up
    const auto t0 = Clock::now();
    opt.zero_grad();
    auto logits = model.forward(exec, x.cview());
    ce.forward(exec, logits.cview(), y.cview());
    const auto t1 = Clock::now();
    model.backward(exec, ce.backward(exec).cview());
    const auto t2 = Clock::now();
    opt.step(exec);
    const auto t3 = Clock::now();
    if (r == 0) continue;
    fwd.push_back(seconds(t0, t1));
    bwd.push_back(seconds(t1, t2));
    sgd.push_back(seconds(t2, t3));
    total.push_back(seconds(t0, t3));
  }
  // OpenBLAS's kernel set (its OPENBLAS_CORETYPE): a generic one on an AVX-512 CPU is ~5x slower per GEMM
  // (docs/decisions/0080), so every row says which one ran.
  const char* core = blas::core_name();
  return {{"ddp_step_s", median(total)}, {"ddp_forward_s", median(fwd)}, {"ddp_backward_s", median(bwd)},
          {"ddp_sgd_s", median(sgd)}, {"blas_core", core ? core : "none"}};
}

// Runs the torchvision step in a child python; returns its JSON (or {"torch_error": ...}).
nlohmann::json run_torch(const Config& c, int repeats) {
  const std::string cmd = std::string(DDP_BENCH_PYTHON) + " " + DDP_BENCH_TORCH_SCRIPT + " " + c.arch + " " +
                          std::to_string(c.batch) + " " + std::to_string(c.size) + " " + std::to_string(c.threads) +
                          " " + std::to_string(repeats);
  return ddp_bench::run_child_json(cmd);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--repeats N]\n", argv[0]);
      return 2;
    }
  }
  std::vector<Config> configs;
  for (const char* arch : {"resnet18", "resnet50"})
    for (const auto& [batch, size] : {std::pair<std::int64_t, std::int64_t>{16, 224}, {64, 32}})
      for (int threads : {1, 2}) {
        if (quick && (threads == 1 || (size == 224 && std::string(arch) == "resnet50"))) continue;
        configs.push_back({arch, batch, size, threads});
      }
  try {
    for (const auto& c : configs) {
      nlohmann::json j = {{"arch", c.arch}, {"batch", c.batch}, {"image_size", c.size}, {"threads", c.threads}};
      j.update(run_ddp(c, repeats));
      j.update(run_torch(c, repeats));
      if (j.contains("torch_step_s"))
        j["ratio_ddp_over_torch"] = j["ddp_step_s"].get<double>() / j["torch_step_s"].get<double>();
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
