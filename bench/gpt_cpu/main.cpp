// bench_gpt_cpu: one training step of the DDP tutorial's minGPT (nn::GPT) on the CPU, timed for ddp and, in the
// same run, for PyTorch (torch_step.py under /usr/bin/python3: the same model, init, batch and threads), with the
// ratio; and, as a third row of the same rounds, the same GPT's forward written with autograd ops (gpt_ops.hpp:
// Var::parameter over the explicit model's parameters, backward by the tape) with the same optimizer step: what
// writing a model with ops costs against the explicit forward/backward (issue 41).
// SPDX-License-Identifier: MIT
//
// One step is the tutorial trainer's (minGPT-ddp trainer.py): zero the gradients, forward on int64 ids (B, T),
// mean cross-entropy over the B*T positions, backward, clip_grad_norm(1.0), AdamW(lr 3e-4, betas 0.9 / 0.95,
// weight decay 0.1 on the Linear weights: optim::linear_weight_decay_groups). Dropout 0.1 on the embeddings and
// the residual branches as in the tutorial; attention dropout 0 on both sides (the published numbers predate ddp's
// attention dropout; the tutorial's is 0.1).
// T = block_size.
// Usage: bench_gpt_cpu [--quick] [--repeats N] [--rounds N] [--threads N] [--config NAME] [--no-torch] [--profile]
//                      [--torch-active-wait] [--no-ops]
//   configurations (vocab 65, the tutorial's character-level data):
//     small     n_layer 2, n_head 4, n_embd 64,  block 64,  batch 16
//     medium    n_layer 4, n_head 4, n_embd 256, block 128, batch 8
//     tutorial  n_layer 8, n_head 8, n_embd 512, block 128, batch 8   (gpt2_train_cfg.yaml's model, CPU batch)
//   --rounds N (default 3): N rounds of (ours: build the model, warm up, time the round's steps; then PyTorch the
//   same in a child python), alternating so that load from other jobs on a shared machine hits both sides alike;
//   medians are over all rounds' steps. Steps per round: --repeats (default 5) for the tutorial shape, 2x that for
//   medium and 8x for small, whose steps are short enough that one burst of load would cover a whole round.
//   --quick: small and tutorial only, 2 repeats, 1 round. --threads: 2 by default (this machine's cores; PyTorch
//   gets the same: set_num_threads and OPENBLAS_NUM_THREADS). --config: that configuration only. --no-torch: ours
//   only (for profiling ours, e.g. under perf record). --profile: one more step of ours under a trace recorder
//   (core/trace.hpp), "ours_profile_ms": the exclusive milliseconds of each module over every block
//   ("blocks.*.mlp.1/backward": GELU's backward summed over the n_layer blocks). --torch-active-wait: PyTorch with
//   libgomp's default wait policy instead of OMP_WAIT_POLICY=PASSIVE (run_torch). --no-ops: leave out the ops row.
// Memory: "*_peak_step_mib" is the most tensor memory a step holds on top of what the model had before its first
// step (parameters, ids): gradients, optimizer state, activations, temporaries. Ours: the CPU caching pool's
// peak_bytes (size classes) minus current_bytes before the warm-up step, the largest over the rounds. PyTorch:
// ru_maxrss after its steps minus ru_maxrss before them (resident pages, so also allocator slack; torch_step.py),
// so ops/explicit compares like with like and ops/torch only roughly.
// The ops row: ops_step_s, ops_forward_s (the forward and loss, recording the tape), ops_backward_s, ops_optim_s,
// ops_peak_step_mib, ..., and the ratios ratio_ops_over_ours_time, ratio_ops_over_ours_memory (ops / explicit:
// > 1 means ops costs more), ratio_ops_over_torch_time, ratio_ops_over_torch_memory.
// Expected output: one JSON object per line, e.g.
//   {"config":"small","n_layer":2,...,"threads":2,"ours_step_s":0.05,"ours_forward_s":...,"ours_backward_s":...,
//    "ours_optim_s":...,"ours_tokens_per_s":20000,"torch_step_s":0.1,"torch_tokens_per_s":10000,
//    "ratio_torch_over_ours":2.0}
// Times are medians over all rounds' steps, each round after one warm-up step (the lists are in
// ours_step_times / torch_step_times, the fastest in *_min_step_s: the least disturbed by other jobs); ratio > 1
// means ours is faster.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/child_json.hpp"

#include <ddp/core/trace.hpp>
#include <ddp/nn/gpt.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/clip.hpp>
#include <ddp/optim/param_groups.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/storage.hpp>

#include "gpt_cpu/gpt_ops.hpp"

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  std::string name;
  std::int64_t n_layer, n_head, n_embd, block_size, vocab, batch;
  int repeat_scale;  // steps per round = --repeats x this: rounds of the smaller shapes last about as long
};

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Exclusive time (ms) of each traced module span, its own minus its children's, with "blocks.<i>." made
// "blocks.*." so that the blocks add up; key "<name>/<phase>".
nlohmann::json exclusive_ms(const std::vector<trace::Event>& events) {
  std::vector<const trace::Event*> es;
  for (const auto& e : events) es.push_back(&e);
  std::sort(es.begin(), es.end(), [](const auto* a, const auto* b) {
    return a->start != b->start ? a->start < b->start : a->end > b->end;  // parents before their children
  });
  std::map<std::string, double> ms;
  std::vector<std::pair<const trace::Event*, std::string>> open;  // the enclosing spans and their keys
  static const std::regex block(R"(blocks\.\d+(?=\.|$))");
  for (const auto* e : es) {
    while (!open.empty() && open.back().first->end <= e->start) open.pop_back();
    const double d = std::chrono::duration<double, std::milli>(e->end - e->start).count();
    const std::string key = std::regex_replace(e->name, block, "blocks.*") + "/" + e->category;
    ms[key] += d;
    if (!open.empty()) ms[open.back().second] -= d;
    open.emplace_back(e, key);
  }
  return ms;
}

struct OursTimes {
  std::vector<double> fwd, bwd, optim, total;  // seconds per timed step
  double peak_step_mib = 0;                    // the largest round's step peak (file comment)
  nlohmann::json profile;                      // exclusive_ms of the profiled step, if any
};

// Builds the model and times `repeats` steps of ours after one warm-up step (and one more under the trace
// recorder when `profile`), appending to `out`. ops: the forward and backward are gpt_ops_loss's (autograd).
void run_ours(const Config& c, int threads, int repeats, bool profile, bool ops, OursTimes& out) {
  kernels::cpu::ThreadPool pool(threads);
  Exec<Cpu> exec{.pool = &pool};
  nn::GPT<float, Cpu> model({.vocab_size = c.vocab,
                             .block_size = c.block_size,
                             .n_layer = c.n_layer,
                             .n_head = c.n_head,
                             .n_embd = c.n_embd,
                             .embd_pdrop = 0.1,
                             .resid_pdrop = 0.1});
  optim::AdamW<float, Cpu> opt(optim::linear_weight_decay_groups(model, 0.1),
                               {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95});
  const auto params = model.parameters();
  const std::int64_t b = c.batch, t = c.block_size;
  Tensor<std::int64_t, Cpu> ids(Shape{b, t}), targets(Shape{b * t});
  Generator gen(0, 0, kStreamData);
  for (std::int64_t i = 0; i < b * t; ++i) {
    ids.data()[i] = static_cast<std::int64_t>(gen.uniform_int(static_cast<std::uint64_t>(c.vocab)));
    targets.data()[i] = static_cast<std::int64_t>(gen.uniform_int(static_cast<std::uint64_t>(c.vocab)));
  }
  nn::CrossEntropyLoss<float, Cpu> ce;
  trace::Recorder rec;
  const std::size_t before = cpu_memory_stats().current_bytes;
  reset_peak_cpu_memory();
  for (int r = 0; r <= repeats + (profile ? 1 : 0); ++r) {  // r == 0: warm-up; r > repeats: the profiled step
    std::optional<trace::Activation> on;
    if (r > repeats) on.emplace(rec);
    const auto t0 = Clock::now();
    opt.zero_grad();
    Clock::time_point t1, t2;
    if (ops) {
      auto loss = bench_gpt_ops::gpt_ops_loss(model, exec, ids, targets, static_cast<std::uint64_t>(r));
      t1 = Clock::now();
      loss.backward();
      t2 = Clock::now();
    } else {
      auto logits = model.forward(exec, ids.cview());
      ce.forward(exec, logits.cview().reshape(Shape{b * t, c.vocab}), targets.cview());
      t1 = Clock::now();
      Tensor<float, Cpu> dlogits = ce.backward(exec);
      dlogits.reshape(Shape{b, t, c.vocab});
      model.backward(exec, dlogits.cview());
      t2 = Clock::now();
    }
    {
      trace::Span span("optimizer", "clip_grad_norm + AdamW");
      optim::clip_grad_norm(exec, params, 1.0);
      opt.step(exec);
    }
    const auto t3 = Clock::now();
    if (r == 0 || r > repeats) continue;
    out.fwd.push_back(seconds(t0, t1));
    out.bwd.push_back(seconds(t1, t2));
    out.optim.push_back(seconds(t2, t3));
    out.total.push_back(seconds(t0, t3));
  }
  out.peak_step_mib =
      std::max(out.peak_step_mib, static_cast<double>(cpu_memory_stats().peak_bytes - before) / (1 << 20));
  if (profile) out.profile = exclusive_ms(rec.take());
}

// Runs the PyTorch step in a child python; returns its JSON (or {"torch_error": ...}).
// torch.set_num_threads sets torch's own (OpenMP) threads; Debian's torch calls the system OpenBLAS, whose pool
// would otherwise add one thread per core on top of them: OPENBLAS_NUM_THREADS = threads. OMP_WAIT_POLICY=PASSIVE
// unless active_wait: with libgomp's default (spin before sleeping), torch's 2-thread step on this shared 2-core
// machine was 3 to 10 times slower than with passive waiting whenever other jobs held a core (medium: 3.6 s vs
// 0.31 s); passive is its better setting here, and the reference should be at its best.
nlohmann::json run_torch(const Config& c, int threads, int repeats, bool active_wait) {
  std::string cmd = "OPENBLAS_NUM_THREADS=" + std::to_string(threads) +
                    (active_wait ? "" : " OMP_WAIT_POLICY=PASSIVE") + " " + DDP_BENCH_PYTHON + " " +
                    DDP_BENCH_TORCH_SCRIPT;
  for (std::int64_t v : {c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab, c.batch}) cmd += " " + std::to_string(v);
  cmd += " " + std::to_string(threads) + " " + std::to_string(repeats);
  return ddp_bench::run_child_json(cmd);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, torch = true, profile = false, active_wait = false, with_ops = true;
  std::string only;
  int repeats = 5, threads = 2, rounds = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--config") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--no-torch")) {
      torch = false;
    } else if (!std::strcmp(argv[i], "--profile")) {
      profile = true;
    } else if (!std::strcmp(argv[i], "--torch-active-wait")) {
      active_wait = true;
    } else if (!std::strcmp(argv[i], "--no-ops")) {
      with_ops = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--repeats N] [--rounds N] [--threads N] [--config small|medium|tutorial] "
                   "[--no-torch] [--profile] [--torch-active-wait] [--no-ops]\n",
                   argv[0]);
      return 2;
    }
  }
  if (quick) {
    repeats = std::min(repeats, 2);
    rounds = 1;
  }
  std::vector<Config> configs{
      {"small", 2, 4, 64, 64, 65, 16, 8}, {"medium", 4, 4, 256, 128, 65, 8, 2}, {"tutorial", 8, 8, 512, 128, 65, 8, 1}};
  if (quick) configs.erase(configs.begin() + 1);
  if (!only.empty()) {
    std::erase_if(configs, [&](const Config& c) { return c.name != only; });
    if (configs.empty()) {
      std::fprintf(stderr, "bench_gpt_cpu: unknown --config '%s' (small, medium or tutorial)\n", only.c_str());
      return 2;
    }
  }
  try {
    for (const auto& c : configs) {
      nlohmann::json j = {{"config", c.name},   {"n_layer", c.n_layer},       {"n_head", c.n_head},
                          {"n_embd", c.n_embd}, {"block_size", c.block_size}, {"vocab_size", c.vocab},
                          {"batch", c.batch},   {"threads", threads}};
      OursTimes ours, ops;
      std::vector<double> torch_times;
      double torch_peak_mib = 0;
      for (int round = 0; round < rounds; ++round) {  // alternating, so that a neighbour's load hits all alike
        run_ours(c, threads, repeats * c.repeat_scale, profile && round == 0, false, ours);
        if (with_ops) run_ours(c, threads, repeats * c.repeat_scale, false, true, ops);
        if (!torch) continue;
        nlohmann::json tj = run_torch(c, threads, repeats * c.repeat_scale, active_wait);
        if (!tj.contains("torch_step_times")) {
          j.update(tj);  // its error
          break;
        }
        for (double s : tj["torch_step_times"]) torch_times.push_back(s);
        if (tj.contains("torch_peak_step_mib"))
          torch_peak_mib = std::max(torch_peak_mib, tj["torch_peak_step_mib"].get<double>());
        j["torch_version"] = tj["torch_version"];
      }
      const double step = median(ours.total);
      j.update({{"ours_step_s", step},
                {"ours_forward_s", median(ours.fwd)},
                {"ours_backward_s", median(ours.bwd)},
                {"ours_optim_s", median(ours.optim)},
                {"ours_tokens_per_s", static_cast<double>(c.batch * c.block_size) / step},
                {"ours_min_step_s", *std::min_element(ours.total.begin(), ours.total.end())},
                {"ours_step_times", ours.total},
                {"ours_peak_step_mib", ours.peak_step_mib},
                {"steps_per_side", ours.total.size()}});
      if (profile) j["ours_profile_ms"] = ours.profile;
      if (with_ops) {
        const double ops_step = median(ops.total);
        j.update({{"ops_step_s", ops_step},
                  {"ops_forward_s", median(ops.fwd)},
                  {"ops_backward_s", median(ops.bwd)},
                  {"ops_optim_s", median(ops.optim)},
                  {"ops_tokens_per_s", static_cast<double>(c.batch * c.block_size) / ops_step},
                  {"ops_min_step_s", *std::min_element(ops.total.begin(), ops.total.end())},
                  {"ops_step_times", ops.total},
                  {"ops_peak_step_mib", ops.peak_step_mib},
                  {"ratio_ops_over_ours_time", ops_step / step},
                  {"ratio_ops_over_ours_memory", ops.peak_step_mib / ours.peak_step_mib}});
      }
      if (!torch_times.empty()) {
        const double torch_s = median(torch_times);
        j["torch_step_s"] = torch_s;
        j["torch_min_step_s"] = *std::min_element(torch_times.begin(), torch_times.end());
        j["torch_step_times"] = torch_times;
        j["torch_tokens_per_s"] = static_cast<double>(c.batch * c.block_size) / torch_s;
        j["ratio_torch_over_ours"] = torch_s / j["ours_step_s"].get<double>();
        if (torch_peak_mib > 0) j["torch_peak_step_mib"] = torch_peak_mib;
        if (with_ops) {
          j["ratio_ops_over_torch_time"] = j["ops_step_s"].get<double>() / torch_s;
          if (torch_peak_mib > 0) j["ratio_ops_over_torch_memory"] = ops.peak_step_mib / torch_peak_mib;
        }
      }
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
