// bench_powersgd: what PowerSGD (parallel/powersgd.hpp) saves on the wire and what it costs in loss.
// SPDX-License-Identifier: MIT
//
// Usage: bench_powersgd [--steps 150] [--batch 16] [--rank 2] [--start-iter 20] [--png FILE] [--skip-train]
// World 2, ranks as threads over the tcp communicator on loopback. Prints JSON lines:
//   {"kind":"bytes", "hook":"allreduce"|"powersgd_r1|2|4", "bytes_per_step":..., "ratio":...}
//       resnet18 (torchvision's, 1000 classes): the payload one rank hands to all-reduce per step, from the
//       hook's own counters (PowerSgdState::bytes_last_step) after a real compressed step of the hook on
//       random gradients in DDP's default buckets (25 MiB, first 1 MiB); plain all-reduce = every gradient.
//   {"kind":"loss", "hook":..., "losses":[...], "final_loss":...}  the training loss per step (mean over ranks)
//       of a width-16 resnet18 on sklearn's 8x8 digits at 16x16 (tests/interop/reference/digits_to_cifar_format.py),
//       DDP world 2, batch --batch per rank, SGD lr 0.05 momentum 0.9, same seed for both hooks;
//       final_loss = the mean of the last 10 steps.
//   {"kind":"loss_diff", "allreduce":..., "powersgd":..., "difference":...}
// --png draws them with plot.py (python3-matplotlib).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include <ddp/comm/tcp/tcp_communicator.hpp>
#include <ddp/data/cifar10.hpp>
#include <ddp/data/dataset.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/parallel/powersgd.hpp>
#include <ddp/store/hash_store.hpp>

using namespace ddp;

namespace {

constexpr int kWorld = 2;

// body(comm) on kWorld threads, one TcpCommunicator each over one HashStore; rethrows the first error.
void run_ranks(const std::function<void(comm::TcpCommunicator&)>& body) {
  store::HashStore store(std::chrono::seconds(30));
  std::vector<std::exception_ptr> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r)
    threads.emplace_back([&, r] {
      try {
        comm::TcpCommunicator c(env::LaunchInfo{.rank = r, .world_size = kWorld, .master_addr = "127.0.0.1"}, store);
        body(c);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// (a) Payload per step on resnet18's gradients: one compressed step of the hook per bucket.
std::uint64_t powersgd_bytes(int rank) {
  std::uint64_t out = 0;
  run_ranks([&](comm::TcpCommunicator& c) {
    nn::ResNet<float, Cpu> net({.arch = "resnet18", .num_classes = 1000});
    const auto params = net.parameters();
    std::vector<std::int64_t> numel;
    for (auto* p : params) numel.push_back(p->numel());
    const auto layouts = parallel::assign_buckets(parallel::reverse_order(params.size()), numel, sizeof(float),
                                                  parallel::kDefaultBucketCapBytes, parallel::kDefaultFirstBucketCapBytes);
    auto st = std::make_shared<parallel::PowerSgdState<float>>(
        parallel::PowerSgdOptions{.matrix_approximation_rank = rank, .start_iter = 2});
    st->iter = st->options.start_iter;  // compress now
    auto hook = parallel::powersgd_hook<float>(st);
    std::mt19937 g(static_cast<unsigned>(c.rank()));
    std::normal_distribution<float> nd;
    for (std::size_t b = 0; b < layouts.size(); ++b) {
      std::vector<float> buf(static_cast<std::size_t>(layouts[b].numel));
      for (auto& v : buf) v = nd(g);
      std::vector<Shape> shapes;
      for (std::size_t i : layouts[b].params) shapes.push_back(params[i]->torch_shape());
      parallel::GradBucket<float> gb{.index = b, .buffer = buf, .layout = &layouts[b], .comm = &c,
                                     .is_last = b + 1 == layouts.size(), .shapes = shapes};
      auto r = hook(gb);
      r.work.wait();
      if (r.then) r.then();
    }
    if (c.rank() == 0) out = st->bytes_last_step;
  });
  return out;
}

struct Digits {
  std::unique_ptr<data::CifarBinaryDataset> train;
};

Digits load_digits() {
  const std::string dir = DDP_BENCH_OUT;
  const std::string cmd = std::string("/usr/bin/python3 ") + DDP_REFERENCE_DIR + "/digits_to_cifar_format.py " + dir +
                          " --size 16 --channels 1 > /dev/null";
  if (std::system(cmd.c_str()) != 0)
    throw IoError("bench_powersgd: " + cmd + " failed (python3-sklearn missing?); --skip-train runs part (a) only");
  nlohmann::json meta;
  std::ifstream(dir + "/digits_meta.json") >> meta;
  const data::CifarOptions co{.format = {.height = 16, .width = 16, .channels = 1, .num_classes = 10},
                              .mean = meta.at("mean").get<std::vector<float>>(),
                              .std = meta.at("std").get<std::vector<float>>()};
  return {std::make_unique<data::CifarBinaryDataset>(std::vector<std::string>{dir + "/digits_train.bin"}, co)};
}

// (b) Training loss per step (mean over ranks), DDP world 2 with the given hook.
std::vector<double> train_losses(const data::Dataset& ds, parallel::CommHookKind hook, const parallel::PowerSgdOptions& po,
                                 int steps, std::int64_t batch) {
  std::vector<std::vector<double>> losses(kWorld, std::vector<double>(static_cast<std::size_t>(steps)));
  run_ranks([&](comm::TcpCommunicator& c) {
    Exec<Cpu> exec;
    nn::ResNet<float, Cpu> net({.arch = "resnet18", .num_classes = 10, .seed = 1, .in_channels = 1, .width = 16});
    parallel::DistributedDataParallel<float, Cpu> model(net, c, {.comm_hook = hook, .powersgd = po});
    optim::SGD<float, Cpu> opt(net.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
    nn::CrossEntropyLoss<float, Cpu> ce;
    std::vector<std::int64_t> order(ds.size());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 g(7);  // same permutation on every rank; rank r takes its own slice of each global batch
    const auto per_epoch = static_cast<int>(ds.size()) / (kWorld * static_cast<int>(batch));
    for (int s = 0; s < steps; ++s) {
      if (s % per_epoch == 0) std::shuffle(order.begin(), order.end(), g);
      const std::size_t lo = static_cast<std::size_t>(((s % per_epoch) * kWorld + c.rank()) * batch);
      auto bt = data::make_batch(ds, std::span<const std::int64_t>(order.data() + lo, static_cast<std::size_t>(batch)),
                                 static_cast<std::uint64_t>(s / per_epoch));
      opt.zero_grad();
      auto logits = model.forward(exec, bt.images.cview());
      losses[static_cast<std::size_t>(c.rank())][static_cast<std::size_t>(s)] = ce.forward(exec, logits.cview(), bt.labels.cview());
      model.backward(exec, ce.backward(exec).cview());
      opt.step(exec);
    }
  });
  std::vector<double> mean(static_cast<std::size_t>(steps));
  for (std::size_t s = 0; s < mean.size(); ++s) mean[s] = (losses[0][s] + losses[1][s]) / kWorld;
  return mean;
}

double tail_mean(const std::vector<double>& v) {
  const std::size_t n = std::min<std::size_t>(10, v.size());
  return std::accumulate(v.end() - static_cast<std::ptrdiff_t>(n), v.end(), 0.0) / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cxxopts::Options options("bench_powersgd", "bytes per step and loss: plain all-reduce vs PowerSGD (world 2, threads)");
    options.add_options()
        ("steps", "digits training steps per hook", cxxopts::value<int>()->default_value("150"))
        ("batch", "digits batch per rank", cxxopts::value<std::int64_t>()->default_value("16"))
        ("rank", "PowerSGD rank for the digits run", cxxopts::value<int>()->default_value("2"))
        ("start-iter", "PowerSGD start_iter for the digits run", cxxopts::value<long>()->default_value("20"))
        ("png", "draw the results into this PNG (plot.py, python3-matplotlib)", cxxopts::value<std::string>()->default_value(""))
        ("skip-train", "part (a) only: the bytes")
        ("h,help", "this help");
    const auto args = options.parse(argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    std::vector<nlohmann::json> rows;
    auto emit = [&](nlohmann::json j) {
      std::cout << j.dump() << std::endl;
      rows.push_back(std::move(j));
    };

    nn::ResNet<float, Cpu> r18({.arch = "resnet18", .num_classes = 1000});
    std::uint64_t plain = 0;
    for (auto* p : r18.parameters()) plain += static_cast<std::uint64_t>(p->numel()) * sizeof(float);
    emit({{"kind", "bytes"}, {"hook", "allreduce"}, {"bytes_per_step", plain}, {"ratio", 1.0}});
    for (int r : {1, 2, 4}) {
      const std::uint64_t b = powersgd_bytes(r);
      emit({{"kind", "bytes"}, {"hook", "powersgd_r" + std::to_string(r)}, {"bytes_per_step", b},
            {"ratio", static_cast<double>(plain) / static_cast<double>(b)}});
    }

    if (!args.count("skip-train")) {
      const Digits digits = load_digits();
      const int steps = args["steps"].as<int>();
      const std::int64_t batch = args["batch"].as<std::int64_t>();
      const parallel::PowerSgdOptions po{.matrix_approximation_rank = args["rank"].as<int>(),
                                         .start_iter = args["start-iter"].as<long>()};
      const auto plain_losses = train_losses(*digits.train, parallel::CommHookKind::Allreduce, po, steps, batch);
      emit({{"kind", "loss"}, {"hook", "allreduce"}, {"losses", plain_losses}, {"final_loss", tail_mean(plain_losses)}});
      const auto psgd_losses = train_losses(*digits.train, parallel::CommHookKind::PowerSgd, po, steps, batch);
      const std::string name = "powersgd_r" + std::to_string(po.matrix_approximation_rank);
      emit({{"kind", "loss"}, {"hook", name}, {"losses", psgd_losses}, {"final_loss", tail_mean(psgd_losses)}});
      emit({{"kind", "loss_diff"}, {"steps", steps}, {"allreduce", tail_mean(plain_losses)}, {name, tail_mean(psgd_losses)},
            {"difference", tail_mean(psgd_losses) - tail_mean(plain_losses)}});
    }

    if (const auto png = args["png"].as<std::string>(); !png.empty()) {
      const std::string jsonl = std::string(DDP_BENCH_OUT) + "/powersgd.jsonl";
      std::ofstream f(jsonl);
      for (const auto& j : rows) f << j.dump() << "\n";
      f.close();
      const std::string cmd = std::string("/usr/bin/python3 ") + DDP_BENCH_POWERSGD_DIR + "/plot.py " + jsonl + " " + png;
      if (std::system(cmd.c_str()) != 0) std::cerr << "bench_powersgd: no PNG (see plot.py's message)\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
