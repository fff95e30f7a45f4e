// ddp's join (uneven inputs) against torch 1.13's DistributedDataParallel inside `with model.join():` (gloo, CPU),
// world 2 and 4: rank r trains on its own number of batches (rank 0 first, last, or with none), SGD with momentum
// and weight decay; every rank's parameters and buffers after join() must match torch's (label torch; skipped when
// /usr/bin/python3 has no torch).
// SPDX-License-Identifier: MIT
//
// join_torch_reference.py defines the scenarios and writes torch's results; ranks are threads here (tcp
// communicator over loopback), processes there. What must agree: joined ranks add zero gradients and the others
// divide by the full world size; buffers follow the highest rank still training; at the end every rank has the
// model of the highest last joiner. Tolerance 1e-6 relative, as in tests/interop/torch_ddp (float32 rounding of our kernels
// and of the reduction order, carried by momentum).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <ddp/nn/loss.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/safetensors.hpp>

#include "../torch_ddp/torch_ddp_common.hpp"
#include "../../unit/comm/comm_harness.hpp"

using namespace ddp;
using test::torch_ddp::split;

namespace {

struct Outcome {
  double worst = 0;    // over every parameter and float buffer of every rank
  std::string where;
  bool counters_equal = true;
};

Outcome run_scenario(const std::string& dir, const std::string& scenario, int world, const train::SafetensorsFile& init) {
  std::vector<train::SafetensorsFile> theirs;
  for (int r = 0; r < world; ++r)
    theirs.push_back(train::read_safetensors(ddp::detail::str(dir, "/", scenario, "_w", world, "_r", r, ".safetensors")));
  const auto& meta = theirs[0].metadata;
  std::vector<int> steps;
  for (const auto& s : split(meta.at("steps"), ',')) steps.push_back(std::stoi(s));
  REQUIRE(static_cast<int>(steps.size()) == world);
  const auto modes = split(meta.at("modes"), '|');
  const parallel::DdpOptions options{.find_unused_parameters = meta.at("find_unused") == "1"};
  const test::torch_ddp::Inputs in(init);

  std::vector<test::torch_ddp::Comparison> got(static_cast<std::size_t>(world));
  auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& c) {
    const int rank = c.rank();
    Exec<Cpu> exec;
    test::torch_ddp::Net net;
    train::detail::load_state_dict_from(init, "init.safetensors", net, /*strict=*/false);
    net.mode = modes[std::min<std::size_t>(static_cast<std::size_t>(rank), modes.size() - 1)];
    parallel::DistributedDataParallel<float, Cpu> model(net, c, options);
    optim::SGD<float, Cpu> opt(net.parameters(), in.sgd);
    {
      auto joining = model.join_context();
      for (int s = 0; s < steps[static_cast<std::size_t>(rank)]; ++s) {
        const std::int64_t lo = (static_cast<std::int64_t>(s) * world + rank) * in.batch;
        opt.zero_grad();
        test::torch_ddp::forward_backward(exec, model, in, lo);
        opt.step(exec);
      }
      model.join();
    }
    got[static_cast<std::size_t>(rank)] =
        test::torch_ddp::compare(net, theirs[static_cast<std::size_t>(rank)], /*buffers=*/true);
  });
  Outcome out;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank ", r, ": ", test::message(errors[r]));
    REQUIRE(!errors[r]);
    if (got[r].worst >= out.worst) out.worst = got[r].worst, out.where = ddp::detail::str("rank ", r, " ", got[r].where);
    out.counters_equal = out.counters_equal && got[r].counters;
  }
  return out;
}

}  // namespace

TEST_CASE("join: DistributedDataParallel with uneven inputs matches torch's Join (world 2 and 4)") {
  // Both references at once: each is mostly python start-up, and the test should stay well under 15 s.
  const std::vector<int> worlds{2, 4};
  std::vector<int> rc(worlds.size(), -1);
  {
    std::vector<std::jthread> refs;
    for (std::size_t i = 0; i < worlds.size(); ++i)
      refs.emplace_back([&, i] {
        rc[i] = test::torch_ddp::run_python(std::string(DDP_TORCH_JOIN_DIR) + "/join_torch_reference.py", worlds[i],
                                            ddp::detail::str(DDP_TORCH_JOIN_OUT, "/w", worlds[i]));
      });
  }
  for (std::size_t i = 0; i < worlds.size(); ++i) {
    const int world = worlds[i];
    CAPTURE(world);
    if (rc[i] == 77) {
      MESSAGE("SKIP: join_torch_reference.py could not import torch");
      std::exit(77);
    }
    REQUIRE(rc[i] == 0);
    const std::string dir = ddp::detail::str(DDP_TORCH_JOIN_OUT, "/w", world);
    const auto init = train::read_safetensors(dir + "/init.safetensors");
    for (const auto& scenario : split(init.metadata.at("scenarios"), ',')) {
      CAPTURE(scenario);
      const Outcome o = run_scenario(dir, scenario, world, init);
      MESSAGE("world ", world, ", ", scenario, ": max relative difference to torch ", o.worst, " (", o.where, ")");
      CHECK(o.worst <= 1e-6);
      CHECK(o.counters_equal);
    }
  }
}
