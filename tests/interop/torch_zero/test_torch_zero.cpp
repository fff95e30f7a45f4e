// ddp's DDP + ZeroRedundancyOptimizer against torch 1.13's DDP + torch.distributed.optim.ZeroRedundancyOptimizer
// (gloo, CPU), world 2 and 4, over SGD (momentum, weight decay) and AdamW (two parameter groups): the partition,
// every rank's parameters after the plan, and the optimizer state consolidated to rank 0 (label torch; skipped
// when /usr/bin/python3 has no torch).
// SPDX-License-Identifier: MIT
//
// zero_torch_reference.py defines the scenarios and writes torch's results; this file runs ddp's side on the same
// files (tests/interop/torch_ddp's model and data; ranks are threads here, processes there).
// Tolerance: 1e-6 relative (max |ours - torch| / max(1e-3, max |torch|) per tensor), as tests/interop/torch_ddp: our
// conv, BatchNorm and GEMM kernels and the world-4 all-reduce sum in another order than torch's, ~1e-7 per step.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <ddp/nn/loss.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/param_groups.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/parallel/zero.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/safetensors.hpp>

#include "../torch_ddp/torch_ddp_common.hpp"
#include "../../unit/comm/comm_harness.hpp"

using namespace ddp;

namespace {

using test::torch_ddp::split;

// "lr=0.1,momentum=0.9" -> {lr: 0.1, momentum: 0.9}
std::map<std::string, double> parse_options(const std::string& s) {
  std::map<std::string, double> out;
  for (const auto& kv : split(s, ',')) {
    const auto parts = split(kv, '=');
    out[parts.at(0)] = std::stod(parts.at(1));
  }
  return out;
}

// One tensor of a parameter's shape from torch's file, in our layout.
std::vector<float> ours_from_torch(const train::TensorEntry& e, const nn::Parameter<float, Cpu>& p) {
  std::vector<float> v(static_cast<std::size_t>(p.numel()));
  if (p.layout() == nn::Layout::Krsc)
    train::detail::oihw_to_krsc(reinterpret_cast<const float*>(e.data.data()), v.data(), p.shape());
  else
    v = e.as<float>();
  return v;
}

struct Outcome {
  double worst = 0;   // largest rel_diff over every parameter of every rank and every consolidated state tensor
  std::string where;  // which
  bool partition_equal = true;
  bool state_names_equal = true;  // the same parameters have state, with the same step counts
};

void note(Outcome& o, double d, const std::string& where) {
  if (d >= o.worst) o.worst = d, o.where = where;
}

template <class Inner>
Outcome run(const std::string& dir, const std::string& scenario, int world, const train::SafetensorsFile& init) {
  const auto theirs = train::read_safetensors(ddp::detail::str(dir, "/", scenario, "_w", world, ".safetensors"));
  const auto& meta = theirs.metadata;
  const auto opts = parse_options(meta.at("options"));
  const std::int64_t steps = std::stoll(meta.at("steps"));
  const test::torch_ddp::Inputs in(init);
  std::vector<Outcome> per_rank(static_cast<std::size_t>(world));

  auto errors = test::run_ranks(world, [&](comm::TcpCommunicator& c) {
    const int rank = c.rank();
    Outcome& out = per_rank[static_cast<std::size_t>(rank)];
    Exec<Cpu> exec;
    test::torch_ddp::Net net;
    train::detail::load_state_dict_from(init, "init.safetensors", net, /*strict=*/false);
    parallel::DistributedDataParallel<float, Cpu> model(net, c);
    std::vector<optim::ParamGroup<float, Cpu>> groups =
        meta.at("decay").empty() ? std::vector<optim::ParamGroup<float, Cpu>>{{.params = net.parameters()}}
                                 : optim::weight_decay_groups(net, std::stod(meta.at("decay")));
    typename std::remove_cvref_t<decltype(std::declval<Inner&>().options())> o;
    if constexpr (std::same_as<Inner, optim::SGD<float, Cpu>>)
      o = {.lr = opts.at("lr"), .momentum = opts.at("momentum"), .weight_decay = opts.at("weight_decay")};
    else
      o = {.lr = opts.at("lr"), .eps = opts.at("eps"), .weight_decay = opts.at("weight_decay")};
    parallel::ZeroRedundancyOptimizer<Inner> opt(std::move(groups), o, c);
    for (std::int64_t k = 0; k < steps; ++k) {
      opt.zero_grad();
      test::torch_ddp::forward_backward(exec, model, in, (k * world + rank) * in.batch);
      opt.step(exec);
    }
    // The partition, in net.parameters() order (torch's named_parameters()).
    const auto params = net.parameters();
    REQUIRE(ddp::detail::join([&] {
              std::vector<std::string> names;
              for (auto* p : params) names.push_back(p->name());
              return names;
            }(), ",") == meta.at("names"));
    const auto torch_owner = split(meta.at("partition"), ',');
    for (std::size_t i = 0; i < params.size(); ++i) {
      std::size_t z = 0;  // index of params[i] in opt.parameters() (the groups may reorder)
      while (opt.parameters()[z] != params[i]) ++z;
      out.partition_equal = out.partition_equal && std::to_string(opt.owner(z)) == torch_owner[i];
    }
    for (auto* p : params)
      note(out, test::torch_ddp::rel_diff(p->value().data(), ours_from_torch(theirs.at("param." + p->name()), *p)),
           ddp::detail::str("rank ", rank, " ", p->name()));
    auto full = opt.consolidate(exec, 0);
    if (!full) return;
    const auto& fp = full->parameters();
    for (std::size_t i = 0; i < fp.size(); ++i) {
      for (const optim::StateTensor& st : Inner::state_tensors) {
        const std::string key = ddp::detail::str("state.", st.name, ".", fp[i]->name());
        auto* t = full->state(st.name, i);
        if ((t != nullptr) != theirs.contains(key)) {
          out.state_names_equal = false;
          continue;
        }
        if (t) note(out, test::torch_ddp::rel_diff(t->data(), ours_from_torch(theirs.at(key), *fp[i])), key);
      }
      if constexpr (optim::HasParamSteps<Inner>) {
        const std::string key = "state.step." + fp[i]->name();
        out.state_names_equal = out.state_names_equal && theirs.contains(key) &&
                                static_cast<std::int64_t>(theirs.at(key).as<double>().at(0)) == full->param_step(i);
      }
    }
  });
  Outcome all;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank ", r, ": ", test::message(errors[r]));
    REQUIRE(!errors[r]);
    note(all, per_rank[r].worst, per_rank[r].where);
    all.partition_equal = all.partition_equal && per_rank[r].partition_equal;
    all.state_names_equal = all.state_names_equal && per_rank[r].state_names_equal;
  }
  return all;
}

}  // namespace

TEST_CASE("DDP + ZeroRedundancyOptimizer match torch's (SGD, AdamW with groups; world 2 and 4)") {
  const std::string dir = DDP_TORCH_ZERO_OUT;
  const std::string cmd = std::string(DDP_TEST_PYTHON) + " " + DDP_TORCH_ZERO_DIR + "/zero_torch_reference.py " + dir;
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (rc == 77) {
    MESSAGE("SKIP: zero_torch_reference.py could not import torch");
    std::exit(77);
  }
  REQUIRE(rc == 0);
  const auto init = train::read_safetensors(dir + "/init.safetensors");
  for (int world : {2, 4}) {
    for (const auto& scenario : split(init.metadata.at("scenarios"), ',')) {
      CAPTURE(world);
      CAPTURE(scenario);
      const Outcome o = scenario == "sgd" ? run<optim::SGD<float, Cpu>>(dir, scenario, world, init)
                                          : run<optim::AdamW<float, Cpu>>(dir, scenario, world, init);
      MESSAGE("world ", world, ", ", scenario, ": max relative difference to torch ", o.worst, " (", o.where, ")");
      CHECK(o.worst <= 1e-6);
      CHECK(o.partition_equal);
      CHECK(o.state_names_equal);
    }
  }
}
