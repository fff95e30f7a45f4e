// bench_zero_state: optimizer-state bytes per rank with and without ZeroRedundancyOptimizer (ZeRO-1,
// parallel/zero.hpp, docs/decisions/0031), for resnet18 / resnet50 with SGD (momentum) and AdamW at world
// 1, 2 and 4.
// SPDX-License-Identifier: MIT
//
// Usage: bench_zero_state [--archs resnet18,resnet50] [--worlds 1,2,4] [--image_size 32] [--batch_size 2]
//                         > zero_state.jsonl
//        bench/zero_state/plot.py zero_state.jsonl zero_state.png
// Ranks are threads on loopback (tcp communicator over one HashStore); each runs one real DDP step (forward,
// backward, all-reduce, optimizer step) on a small synthetic batch so that the optimizer state exists; its
// size does not depend on the images. Prints one JSON line per (arch, optimizer, world, zero):
//   state_bytes_per_rank  the state tensors each rank holds (SGD: momentum buffers; AdamW: exp_avg and
//                         exp_avg_sq; step counters not counted), parallel::optimizer_state_bytes
//   max_state_bytes       the largest of them (what bounds memory), and its ratio to the unsharded state
//   param_bytes           the model's parameters (for scale: SGD state = 1x, AdamW = 2x of it unsharded)
// Not part of CI (resnet50 at world 4 takes ~2 GB and a minute on two cores).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cxxopts.hpp>
#include <ddp/comm/tcp/tcp_communicator.hpp>
#include <ddp/data/synthetic.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/parallel/zero.hpp>
#include <ddp/store/hash_store.hpp>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace ddp;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) out.push_back(part);
  return out;
}

struct Setup {
  std::string arch;
  std::string optimizer;  // sgd | adamw
  int world = 1;
  bool zero = false;
  std::int64_t image_size = 32, batch_size = 2;
};

// One DDP step on rank `comm.rank()`; returns the optimizer-state bytes this rank holds after it.
template <class Inner>
std::size_t step_and_measure(const Setup& s, comm::Communicator& comm, std::int64_t& parameters) {
  Exec<Cpu> exec;
  nn::ResNet<float, Cpu> net({.arch = s.arch, .num_classes = 1000});
  parameters = net.num_parameters();
  parallel::DistributedDataParallel<float, Cpu> model(net, comm);
  data::SyntheticDataset ds({.size = 64, .height = s.image_size, .width = s.image_size, .distinct = 8});
  std::vector<std::int64_t> idx;
  for (std::int64_t i = 0; i < s.batch_size; ++i) idx.push_back((comm.rank() * s.batch_size + i) % 64);
  const auto batch = data::make_batch(ds, idx, 0);
  nn::CrossEntropyLoss<float, Cpu> ce;
  auto step = [&](auto& opt) {
    opt.zero_grad();
    auto y = model.forward(exec, batch.images.cview());
    ce.forward(exec, y.cview(), batch.labels.cview());
    model.backward(exec, ce.backward(exec).cview());
    opt.step(exec);
  };
  typename std::remove_cvref_t<decltype(std::declval<Inner&>().options())> o;
  if constexpr (std::same_as<Inner, optim::SGD<float, Cpu>>) o = {.lr = 0.01, .momentum = 0.9};
  if (s.zero) {
    parallel::ZeroRedundancyOptimizer<Inner> opt(net, o, comm);
    step(opt);
    return opt.state_bytes();
  }
  Inner opt(net, o);
  step(opt);
  return parallel::optimizer_state_bytes(opt);
}

nlohmann::json run(const Setup& s) {
  store::HashStore store(std::chrono::seconds(60));
  std::vector<std::size_t> bytes(static_cast<std::size_t>(s.world));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(s.world));
  std::int64_t parameters = 0;
  std::vector<std::thread> ranks;
  for (int r = 0; r < s.world; ++r)
    ranks.emplace_back([&, r] {
      try {
        comm::TcpCommunicator c(env::LaunchInfo{.rank = r, .world_size = s.world, .master_addr = "127.0.0.1"}, store,
                                {.timeout = std::chrono::seconds(120)});
        std::int64_t n = 0;
        bytes[static_cast<std::size_t>(r)] = s.optimizer == "sgd"
                                                 ? step_and_measure<optim::SGD<float, Cpu>>(s, c, n)
                                                 : step_and_measure<optim::AdamW<float, Cpu>>(s, c, n);
        if (r == 0) parameters = n;
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  const std::size_t param_bytes = static_cast<std::size_t>(parameters) * sizeof(float);
  const std::size_t unsharded = param_bytes * (s.optimizer == "sgd" ? 1 : 2);
  const std::size_t max_bytes = *std::max_element(bytes.begin(), bytes.end());
  return {{"bench", "zero_state"},
          {"arch", s.arch},
          {"optimizer", s.optimizer},
          {"world_size", s.world},
          {"zero", s.zero},
          {"parameters", parameters},
          {"param_bytes", param_bytes},
          {"state_bytes_per_rank", bytes},
          {"max_state_bytes", max_bytes},
          {"max_over_unsharded", static_cast<double>(max_bytes) / static_cast<double>(unsharded)}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cxxopts::Options options("bench_zero_state", "optimizer-state bytes per rank with and without ZeRO-1");
    options.add_options()("archs", "comma-separated resnet archs", cxxopts::value<std::string>()->default_value("resnet18,resnet50"))(
        "worlds", "comma-separated world sizes", cxxopts::value<std::string>()->default_value("1,2,4"))(
        "image_size", "image size of the step", cxxopts::value<long>()->default_value("32"))(
        "batch_size", "per rank", cxxopts::value<long>()->default_value("2"));
    const auto args = options.parse(argc, argv);
    for (const auto& arch : split(args["archs"].as<std::string>()))
      for (const std::string optimizer : {"sgd", "adamw"})
        for (const auto& world : split(args["worlds"].as<std::string>()))
          for (bool zero : {false, true})
            std::cout << run(Setup{.arch = arch, .optimizer = optimizer, .world = std::stoi(world), .zero = zero,
                                   .image_size = args["image_size"].as<long>(),
                                   .batch_size = args["batch_size"].as<long>()})
                             .dump()
                      << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
