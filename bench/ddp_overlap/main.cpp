// bench_ddp_overlap: how much of DDP's gradient all-reduce hides behind backward (resnet18 on CPU, run under ddprun).
// SPDX-License-Identifier: MIT
//
// Usage: ddprun --nproc-per-node 2 --standalone bench_ddp_overlap [--arch resnet18] [--width 64] [--image_size 64]
//        [--batch_size 8] [--steps 10] [--threads 1] [--bucket-cap-mb 25] [--comm-cpus 1]
// With a core left to communication: taskset -c 0 ddprun ... --comm-cpus 1 (training threads on CPU 0, the
// progress threads on CPU 1).
// Measures in one run, over --steps rounds. Each round times every variant once, one after the other (local,
// comm, then a fresh DDP wrapper per variant, each after an untimed warm-up step), so a drift of the machine's
// speed during the run (this VM's step time moves by +-25% over tens of seconds, which a variant-after-variant
// run mistook for DDP overhead or gain) reaches every variant alike; overheads are medians of per-round
// differences against that round's bare step.
//   local_ms  forward + backward + SGD step of the bare model (no communication)
//   comm_ms   all-reduce (Avg) of every gradient as one flat buffer, alone (the communication to hide)
//   ddp_ms    the same step through DistributedDataParallel (bucketed all-reduce overlapped with backward),
//             gradients copied into the buckets and back (gradient_as_bucket_view = false, torch's default)
//   ddp_view_ms  the same with gradient_as_bucket_view (gradients live in the buckets: no copy into them before
//             the all-reduce, none back after it; ddp's default on CPU, docs/decisions/0054)
//   *_no_sync_ms  each variant inside no_sync() (wrapper and buffer broadcast, no gradient all-reduce)
//   overhead*_ms  median over rounds of (variant step - bare step); hidden_fraction* = (comm - overhead) / comm,
//             clamped to [0, 1]: 1 = communication fully hidden
//   *_in_flight_ms, *_exposed_ms  from the DDP step's trace: time some bucket's all-reduce was in flight, and
//             time finish() waited after backward
// Prints one JSON line on rank 0.
#include <algorithm>
#include <chrono>
#include <cxxopts.hpp>
#include <ddp/core/cpu_affinity.hpp>
#include <ddp/core/host_memory.hpp>
#include <ddp/data/synthetic.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/train/init.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

using namespace ddp;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  try {
    train::InitFlags init(argc, argv, {.cpu_only = true});  // takes --rank, --local_rank=N, ... out of argv
    cxxopts::Options options("bench_ddp_overlap", "DDP step vs local step vs all-reduce alone");
    options.add_options()("arch", "resnet arch", cxxopts::value<std::string>()->default_value("resnet18"))(
        "width", "channel width", cxxopts::value<long>()->default_value("64"))(
        "image_size", "image size", cxxopts::value<long>()->default_value("64"))(
        "batch_size", "per rank", cxxopts::value<long>()->default_value("8"))(
        "steps", "timed steps", cxxopts::value<int>()->default_value("10"))(
        "threads", "CPU threads per rank", cxxopts::value<int>()->default_value("1"));
    init.add_options(options);
    const auto args = options.parse(argc, argv);
    log::init();
    const train::DistFlags& dist = init.read(args);
    train::Job job = train::init_process_group(init);
    comm::Communicator* comm = &job.communicator();

    kernels::cpu::ThreadPool pool(args["threads"].as<int>());
    Exec<Cpu> exec{.pool = &pool};
    const long hw = args["image_size"].as<long>(), b = args["batch_size"].as<long>();
    nn::ResNet<float, Cpu> net({.arch = args["arch"].as<std::string>(), .num_classes = 100, .width = args["width"].as<long>()});
    optim::SGD<float, Cpu> opt(net.parameters(), {.lr = 0.01, .momentum = 0.9});
    data::SyntheticDataset ds({.size = 64, .height = hw, .width = hw, .num_classes = 100, .distinct = 8});
    std::vector<std::int64_t> idx(static_cast<std::size_t>(b));
    for (long i = 0; i < b; ++i) idx[static_cast<std::size_t>(i)] = (comm->rank() * b + i) % 64;
    auto batch = data::make_batch(ds, idx, 0);
    nn::CrossEntropyLoss<float, Cpu> ce;
    const int steps = args["steps"].as<int>();

    auto step = [&](auto& model) {
      opt.zero_grad();
      auto y = model.forward(exec, batch.images.cview());
      ce.forward(exec, y.cview(), batch.labels.cview());
      model.backward(exec, ce.backward(exec).cview());
      opt.step(exec);
    };
    // One timed call of fn, every rank starting together; the slowest rank's time (a step ends for the job when
    // its last rank ends: a DDP step's time includes waiting for the slower rank, so the bare step's must too).
    auto once = [&](auto&& fn) {
      comm->barrier().wait();
      const auto t = Clock::now();
      fn();
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
      comm->all_reduce(std::span<double>(&ms, 1), {.op = comm::ReduceOp::Max}).wait();
      return ms;
    };
    // The flat buffer is allocated like the buckets (core/host_memory.hpp: huge-page advised), so the two
    // all-reduces run on the same kind of memory.
    HostVector<float> flat(static_cast<std::size_t>(net.num_parameters()), 1.0f);
    // One DDP variant: a fresh wrapper per round (two wrappers cannot share a module: each installs its hooks,
    // and a view wrapper moves the gradients into its buckets); its first step, which rebuilds the buckets, is
    // not timed. Per round: the step, the step inside no_sync() (wrapper and buffer broadcast, no gradient
    // all-reduce), and from the step's own trace (StepTrace) the time some bucket's all-reduce was in flight
    // and the time finish() waited after backward.
    struct Variant {
      std::string suffix;  // of its JSON keys: "" (copies), "_view" (gradient_as_bucket_view)
      bool view;
      std::vector<double> step, no_sync, overhead, in_flight, exposed;
      std::size_t launched_during_backward = 0;
    };
    std::vector<Variant> variants{{"", false, {}, {}, {}, {}, {}}, {"_view", true, {}, {}, {}, {}, {}}};
    std::vector<double> local, flat_comm;
    std::size_t buckets = 0;
    auto round_ddp = [&](Variant& v) {
      parallel::DdpOptions o = dist.ddp;
      o.gradient_as_bucket_view = v.view;
      parallel::DistributedDataParallel<float, Cpu> model(net, *comm, o);
      once([&] { step(model); });
      v.step.push_back(once([&] { step(model); }));
      v.overhead.push_back(v.step.back() - local.back());  // paired with this round's bare step
      v.in_flight.push_back(model.last_trace().comm_seconds() * 1e3);
      v.exposed.push_back(model.last_trace().exposed_comm_seconds() * 1e3);
      v.launched_during_backward = model.last_trace().launched_during_backward();
      v.no_sync.push_back(once([&] {
        auto guard = model.no_sync();
        step(model);
      }));
      buckets = model.buckets().size();
    };
    once([&] { step(net); });  // warm-up: first-touch of every buffer, the caching allocator
    for (int s = 0; s < steps; ++s) {
      local.push_back(once([&] { step(net); }));
      flat_comm.push_back(once([&] { comm->all_reduce(std::span<float>(flat), {.op = comm::ReduceOp::Avg}).wait(); }));
      for (Variant& v : variants) round_ddp(v);
    }
    const double local_ms = median(local), comm_ms = median(flat_comm);
    nlohmann::json out{{"bench", "ddp_overlap"}, {"arch", args["arch"].as<std::string>()},
                       {"width", args["width"].as<long>()}, {"image_size", hw}, {"batch_size", b},
                       {"world_size", comm->size()}, {"threads", args["threads"].as<int>()},
                       {"parameters", net.num_parameters()}, {"buckets", buckets}, {"rounds", steps},
                       // where the training threads may run (taskset) and where the progress thread runs
                       {"compute_cpus", allowed_cpus_text()}, {"comm_cpus", ddp::detail::join(dist.comm_cpus, ",")},
                       {"local_ms", local_ms}, {"comm_ms", comm_ms}};
    // overhead: the median of each round's (DDP step - bare step), so a drift of the machine between rounds
    // cancels; hidden = (comm - overhead) / comm, clamped to [0, 1].
    for (const Variant& v : variants) {
      const double overhead = median(v.overhead);
      out["ddp" + v.suffix + "_ms"] = median(v.step);
      out["ddp" + v.suffix + "_no_sync_ms"] = median(v.no_sync);
      out["overhead" + v.suffix + "_ms"] = overhead;
      out["hidden_fraction" + v.suffix] = std::clamp((comm_ms - overhead) / comm_ms, 0.0, 1.0);
      out["ddp" + v.suffix + "_in_flight_ms"] = median(v.in_flight);
      out["ddp" + v.suffix + "_exposed_ms"] = median(v.exposed);
      out["ddp" + v.suffix + "_buckets_launched_during_backward"] = v.launched_during_backward;
    }
    if (comm->rank() == 0) std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
