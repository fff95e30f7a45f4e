// ddp's DistributedDataParallel against PyTorch's (torch 1.13, gloo, CPU) on the same weights, data and plan, world 2
// and 4: the parameters and buffers every rank ends with (label torch; skipped when /usr/bin/python3 has no torch).
// SPDX-License-Identifier: MIT
//
// ddp_torch_reference.py defines the scenarios (model, plan, options, and how torch's side was computed; see its
// header) and writes torch's results; this file runs ddp's side from the same files. Ranks are threads here
// (tcp communicator over loopback), processes there.
// Tolerances: the local arithmetic differs (our conv, BatchNorm and GEMM kernels sum in another order than
// oneDNN/MKL), and for world 4 so does the order of the all-reduce's sum; both give float32 rounding
// differences of ~1e-7 relative per step, which momentum carries over steps. The fp16 and bf16 hooks round
// gradients to 10 and 7 mantissa bits, so a rounding difference of 1e-7 can move a rounded value by one unit
// of the 16-bit format: 1e-3 and 1e-2 relative in a gradient, less in the parameters.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <ddp/nn/loss.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/safetensors.hpp>

#include "../../unit/comm/comm_harness.hpp"
#include "torch_ddp_common.hpp"

using namespace ddp;
using test::torch_ddp::Net;
using test::torch_ddp::split;

namespace {

struct Pass {
  char kind;                       // S, N or E
  std::vector<std::string> modes;  // per rank
};
using Plan = std::vector<std::vector<Pass>>;

// The plan grammar of ddp_torch_reference.py.
Plan parse_plan(const std::string& plan, int world) {
  Plan steps;
  for (const auto& step : split(plan, ';')) {
    std::vector<Pass> passes;
    for (const auto& p : split(step, ',')) {
      const auto parts = split(p, ':');
      REQUIRE(parts.size() == 2);
      const auto modes = split(parts[1], '|');
      Pass pass{.kind = parts[0].at(0), .modes = {}};
      for (int r = 0; r < world; ++r) pass.modes.push_back(modes[std::min<std::size_t>(static_cast<std::size_t>(r), modes.size() - 1)]);
      passes.push_back(pass);
    }
    steps.push_back(passes);
  }
  return steps;
}

int run_reference(int world, const std::string& out_dir) {
  return test::torch_ddp::run_python(std::string(DDP_TORCH_DDP_DIR) + "/ddp_torch_reference.py", world, out_dir);
}

struct Outcome {
  double worst = 0;          // the largest rel_diff over every parameter and float buffer of every rank
  std::string worst_tensor;  // where
  bool counters_equal = true;
};

// Runs ddp's side of `scenario` at `world` and compares every rank with torch's file.
Outcome run_scenario(const std::string& dir, const std::string& scenario, int world, const train::SafetensorsFile& init) {
  std::vector<train::SafetensorsFile> theirs;
  for (int r = 0; r < world; ++r)
    theirs.push_back(train::read_safetensors(ddp::detail::str(dir, "/", scenario, "_w", world, "_r", r, ".safetensors")));
  const auto& meta = theirs[0].metadata;
  const Plan plan = parse_plan(meta.at("plan"), world);
  parallel::DdpOptions options;  // field by field: GCC 12 misreads a designated initializer that skips powersgd
  options.find_unused_parameters = meta.at("find_unused") == "1";
  options.comm_hook = parallel::parse_comm_hook(meta.at("hook"));
  options.static_graph = meta.at("static_graph") == "1";
  options.gradient_as_bucket_view = meta.at("gradient_as_bucket_view") == "1";
  const test::torch_ddp::Inputs in(init);

  Outcome out;
  std::vector<std::string> notes(static_cast<std::size_t>(world));
  auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& c) {
    const int rank = c.rank();
    Exec<Cpu> exec;
    Net net;
    train::detail::load_state_dict_from(init, "init.safetensors", net, /*strict=*/false);
    parallel::DistributedDataParallel<float, Cpu> model(net, c, options);
    optim::SGD<float, Cpu> opt(net.parameters(), in.sgd);
    std::int64_t k = 0;
    for (const auto& step : plan) {
      opt.zero_grad();
      bool trained = false;
      for (const Pass& pass : step) {
        const std::int64_t lo = (k++ * world + rank) * in.batch;
        net.mode = pass.modes[static_cast<std::size_t>(rank)];
        if (pass.kind == 'E') {
          const Tensor<float, Cpu> x = in.images(lo);
          auto guard = model.no_grad();
          net.eval();
          model.forward(exec, x.cview());
          net.train();
          continue;
        }
        trained = true;
        if (pass.kind == 'N') {
          auto guard = model.no_sync();
          test::torch_ddp::forward_backward(exec, model, in, lo);
        } else {
          test::torch_ddp::forward_backward(exec, model, in, lo);
        }
      }
      if (trained) opt.step(exec);
    }
    // Compare (the main thread reads `out` after every rank joined; each rank writes its own note).
    // A manual reference runs without torch's DDP, so its buffers never follow rank 0: compare parameters only
    // (in training mode they do not depend on the running statistics).
    const auto cmp = test::torch_ddp::compare(net, theirs[static_cast<std::size_t>(rank)], meta.at("kind") != "manual");
    notes[static_cast<std::size_t>(rank)] = ddp::detail::str(cmp.worst, ' ', cmp.where, ' ', cmp.counters ? 1 : 0);
  });
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank ", r, ": ", test::message(errors[r]));
    REQUIRE(!errors[r]);
    const auto parts = split(notes[r], ' ');
    const double d = std::stod(parts[0]);
    if (d >= out.worst) out.worst = d, out.worst_tensor = ddp::detail::str("rank ", r, " ", parts[1]);
    out.counters_equal = out.counters_equal && parts[2] == "1";
  }
  return out;
}

}  // namespace

TEST_CASE("DistributedDataParallel matches torch's on the same weights, data and plan (world 2 and 4)") {
  // scenario -> the tolerance it must meet (see the file comment).
  const std::map<std::string, double> tolerance{{"plain", 1e-6},   {"find_unused", 1e-6}, {"nosync_unused", 1e-6},
                                                {"buffers", 1e-6}, {"fp16", 1e-3},        {"bf16", 1e-3},
                                                {"bucket_view", 1e-6}, {"bucket_view_unused", 1e-6},
                                                {"static_graph", 1e-6}, {"static_graph_unused", 1e-6}};
  for (int world : {2, 4}) {
    CAPTURE(world);
    const std::string dir = ddp::detail::str(DDP_TORCH_DDP_OUT, "/w", world);
    const int rc = run_reference(world, dir);
    if (rc == 77) {
      MESSAGE("SKIP: ddp_torch_reference.py could not import torch");
      std::exit(77);
    }
    REQUIRE(rc == 0);
    const auto init = train::read_safetensors(dir + "/init.safetensors");
    for (const auto& scenario : split(init.metadata.at("scenarios"), ',')) {
      CAPTURE(scenario);
      if (scenario == "shapes") {
        // torch raises on the rank whose shapes differ (the others raise when its group times out); ddp raises
        // on every rank at once, naming the rank.
        for (int r = 0; r < world; ++r)
          CHECK(train::read_safetensors(ddp::detail::str(dir, "/shapes_w", world, "_r", r, ".safetensors"))
                    .metadata.at("raised") == "yes");
        std::vector<int> raised(static_cast<std::size_t>(world), 0);
        auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& c) {
          Net net(c.rank() == 1 ? 5 : 3);
          try {
            parallel::DistributedDataParallel<float, Cpu> model(net, c);
          } catch (const ValueError& e) {
            raised[static_cast<std::size_t>(c.rank())] =
                std::string(e.what()).find("rank 1 differs from rank 0 at parameter #3") != std::string::npos;
          }
        });
        for (const auto& e : errors) CHECK(!e);
        CHECK(raised == std::vector<int>(static_cast<std::size_t>(world), 1));
        continue;
      }
      const Outcome o = run_scenario(dir, scenario, world, init);
      MESSAGE("world ", world, ", ", scenario, ": max relative difference to torch ", o.worst, " (", o.worst_tensor, ")");
      CHECK(o.worst <= tolerance.at(scenario));
      CHECK(o.counters_equal);
    }
  }
}
