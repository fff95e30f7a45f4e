// bench_ddp_overlap: how much of DDP's gradient all-reduce hides behind backward (resnet18 on CPU, run under ddprun).
// SPDX-License-Identifier: MIT
//
// Usage: ddprun --nproc-per-node 2 --standalone bench_ddp_overlap [--arch resnet18] [--width 64] [--image_size 64]
//        [--batch_size 8] [--steps 10] [--threads 1] [--bucket-cap-mb 25]
// Measures in one run, medians over --steps rounds. Each round times every variant once, one after the other
// (local, comm, then a fresh DDP wrapper with copies and one with views, each after an untimed warm-up step), so a
// drift of the machine's speed during the run (this VM's step time moves by +-25% over tens of seconds, which a
// variant-after-variant run mistook for DDP overhead or gain) reaches every variant alike:
//   local_ms  forward + backward + SGD step of the bare model (no communication)
//   comm_ms   all-reduce (Avg) of every gradient as one flat buffer, alone (the communication to hide)
//   ddp_ms    the same step through DistributedDataParallel (bucketed all-reduce overlapped with backward)
//   ddp_no_sync_ms  the DDP step inside no_sync() (wrapper and buffer broadcast, no gradient all-reduce)
//   ddp_view_ms, ddp_view_no_sync_ms  the same two with gradient_as_bucket_view (gradients live in the buckets:
//             no copy into them before the all-reduce, none back after it), in the same run
//   hidden = (local_ms + comm_ms - ddp_ms) / comm_ms, clamped to [0, 1]: 1 = communication fully hidden
//   (hidden_fraction with copies, hidden_fraction_view without).
// Prints one JSON line on rank 0.
#include <algorithm>
#include <chrono>
#include <cxxopts.hpp>
#include <ddp/comm/factory.hpp>
#include <ddp/data/synthetic.hpp>
#include <ddp/env/detect.hpp>
#include <ddp/env/flags.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/store/rendezvous.hpp>
#include <ddp/train/options.hpp>
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
    const env::Env env = env::Env::process();
    const env::LaunchFlags launch = env::extract_launch_flags(argc, argv);
    cxxopts::Options options("bench_ddp_overlap", "DDP step vs local step vs all-reduce alone");
    options.add_options()("arch", "resnet arch", cxxopts::value<std::string>()->default_value("resnet18"))(
        "width", "channel width", cxxopts::value<long>()->default_value("64"))(
        "image_size", "image size", cxxopts::value<long>()->default_value("64"))(
        "batch_size", "per rank", cxxopts::value<long>()->default_value("8"))(
        "steps", "timed steps", cxxopts::value<int>()->default_value("10"))(
        "threads", "CPU threads per rank", cxxopts::value<int>()->default_value("1"));
    train::add_dist_options(options, env);
    const auto args = options.parse(argc, argv);
    log::init();
    const train::DistFlags dist = train::read_dist_flags(args);
    const env::LaunchInfo info = env::detect(env, launch, {.need_master_addr = true, .backend = dist.backend});
    log::set_rank(info.rank, info.world_size);
    auto store = store::make_store(info, dist.timeout, dist.store_port);
    auto comm = comm::make_communicator(dist.backend, info, *store, dist.comm_options());

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
    // One timed call of fn, every rank starting together.
    auto once = [&](auto&& fn) {
      comm->barrier().wait();
      const auto t = Clock::now();
      fn();
      return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    };
    std::vector<float> flat(static_cast<std::size_t>(net.num_parameters()), 1.0f);
    std::vector<double> local, flat_comm, ddp_step, ddp_no_sync, view_step, view_no_sync;
    std::size_t buckets = 0, launched_during_backward = 0;
    // A fresh wrapper per round and mode (two wrappers cannot share a module: each installs its hooks, and a view
    // wrapper moves the gradients into its buckets); its first step, which rebuilds the buckets, is not timed.
    auto round_ddp = [&](bool view, std::vector<double>& with_comm, std::vector<double>& without) {
      parallel::DdpOptions o = dist.ddp;
      o.gradient_as_bucket_view = view;
      parallel::DistributedDataParallel<float, Cpu> model(net, *comm, o);
      once([&] { step(model); });
      with_comm.push_back(once([&] { step(model); }));
      without.push_back(once([&] {  // the wrapper without gradient communication (buffers still broadcast)
        auto guard = model.no_sync();
        step(model);
      }));
      buckets = model.buckets().size();
      if (!view) launched_during_backward = model.last_trace().launched_during_backward();
    };
    once([&] { step(net); });  // warm-up: first-touch of every buffer, the caching allocator
    for (int s = 0; s < steps; ++s) {
      local.push_back(once([&] { step(net); }));
      flat_comm.push_back(once([&] { comm->all_reduce(std::span<float>(flat), {.op = comm::ReduceOp::Avg}).wait(); }));
      round_ddp(false, ddp_step, ddp_no_sync);
      round_ddp(true, view_step, view_no_sync);
    }
    const double local_ms = median(local), comm_ms = median(flat_comm);
    const double ddp_ms = median(ddp_step), nosync_ms = median(ddp_no_sync);
    const double view_ms = median(view_step), view_no_sync_ms = median(view_no_sync);
    const double hidden = std::clamp((local_ms + comm_ms - ddp_ms) / comm_ms, 0.0, 1.0);
    const double hidden_view = std::clamp((local_ms + comm_ms - view_ms) / comm_ms, 0.0, 1.0);
    if (comm->rank() == 0)
      std::cout << nlohmann::json{{"bench", "ddp_overlap"}, {"arch", args["arch"].as<std::string>()},
                                  {"width", args["width"].as<long>()}, {"image_size", hw}, {"batch_size", b},
                                  {"world_size", comm->size()}, {"threads", args["threads"].as<int>()},
                                  {"parameters", net.num_parameters()}, {"buckets", buckets},
                                  {"local_ms", local_ms}, {"comm_ms", comm_ms}, {"ddp_ms", ddp_ms}, {"ddp_no_sync_ms", nosync_ms},
                                  {"overhead_ms", ddp_ms - local_ms}, {"hidden_fraction", hidden},
                                  {"buckets_launched_during_backward", launched_during_backward},
                                  {"ddp_view_ms", view_ms}, {"ddp_view_no_sync_ms", view_no_sync_ms},
                                  {"overhead_view_ms", view_ms - local_ms}, {"hidden_fraction_view", hidden_view},
                                  {"view_speedup", ddp_ms / view_ms}}
                       .dump()
                << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
