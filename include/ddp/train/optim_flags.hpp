// Training program flags for the optimizer, its learning-rate schedule, gradient clipping and
// SyncBatchNorm (cxxopts), shared by the examples, and the one place that builds the optimizer they
// choose.
// SPDX-License-Identifier: MIT
//
//   ddp::train::add_optim_options(options, {.momentum = 0.9, .weight_decay = 1e-5});
//   auto args = options.parse(argc, argv);
//   const ddp::train::OptimFlags of = ddp::train::read_optim_flags(args);  // ConfigError
//   ...
//   ddp::train::sync_batchnorm_if(of, net, comm);  // --sync-bn, before DDP wraps net
//   return ddp::train::with_optimizer(of, lr, net, [&](auto& opt) {  // SGD<T, D> or AdamW<T, D>
//     const auto schedule = ddp::train::lr_schedule(of, lr, steps_per_epoch, epochs);
//     ... backward; ddp::train::clip_gradients(of, exec, net); schedule.apply(opt); opt.step(exec);
//   });
// with_optimizer builds the optimizer chosen at run time and calls the loop (a generic lambda)
// with it, so the loop is instantiated once per kind and its step has no virtual call
// (docs/decisions/0032). A wrapper around the optimizer (e.g. ZeRO) belongs there too.
//
// The flags in torch's terms:
//   --optimizer sgd|adamw  torch.optim.SGD(momentum=--momentum) | torch.optim.AdamW (betas
//                          0.9/0.999, eps 1e-8)
//   --weight-decay W       two parameter groups (optim::weight_decay_groups): W on conv and linear
//                          weights, 0 on biases and BatchNorm parameters (torchvision's
//                          --norm-weight-decay 0 --bias-weight-decay 0 recipe)
//   --clip-grad-norm M     torch.nn.utils.clip_grad_norm_(model.parameters(), M) after backward,
//                          before step; under DDP, of the all-reduced gradients (0: off)
//   --lr-schedule P        constant | StepLR(--lr-step-epochs, --lr-gamma) |
//                          MultiStepLR(--lr-milestones, --lr-gamma) | CosineAnnealingLR(T_max =
//                          the steps after warmup, eta_min 0), stepped once per optimizer step
//   --warmup-epochs E      SequentialLR(LinearLR(1/3, 1, E epochs of steps), P): step epochs and
//                          milestones count from the warmup's end
//   --sync-bn              torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP
// The schedule's only state is the optimizer's step count, which snapshots keep, with the
// optimizer kind: resuming with another --optimizer is an IoError naming the flag.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cxxopts.hpp>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/sync_batchnorm.hpp"
#include "ddp/optim/adamw.hpp"
#include "ddp/optim/clip.hpp"
#include "ddp/optim/lr_schedule.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/parallel/zero.hpp"

namespace ddp::train {

enum class OptimizerKind { Sgd, AdamW };

// What the flags say (read_optim_flags); epochs are converted to steps by lr_schedule().
struct OptimFlags {
  OptimizerKind optimizer = OptimizerKind::Sgd;
  double momentum = 0.0;        // SGD only
  double weight_decay = 0.0;    // on weights of rank >= 2; biases and BatchNorm parameters get 0
  double clip_grad_norm = 0.0;  // max global L2 norm of the gradients; 0: no clipping
  optim::LrPolicy lr_policy = optim::LrPolicy::Constant;
  std::int64_t lr_step_epochs = 30;         // Step: epochs between decays
  std::vector<std::int64_t> lr_milestones;  // MultiStep: epochs after warmup, strictly increasing
  double lr_gamma = 0.1;                    // Step, MultiStep
  double warmup_epochs = 0.0;
  bool sync_bn = false;
  // shard the optimizer state over the ranks (parallel::ZeroRedundancyOptimizer)
  bool zero = false;
};

// The defaults an example keeps when the flags are not given.
struct OptimDefaults {
  double momentum = 0.0;
  double weight_decay = 0.0;
};

// Adds the flags above to `options` (group "optimizer"). The learning rate stays each program's own
// flag (--learning_rate, --lr: the tutorials' spellings).
inline void add_optim_options(cxxopts::Options& options, const OptimDefaults& d = {}) {
  options.add_options("optimizer")(
      "optimizer", "sgd or adamw (torch.optim.SGD / AdamW, betas 0.9, 0.999, eps 1e-8)",
      cxxopts::value<std::string>()->default_value("sgd"))(
      "momentum", "SGD momentum (sgd only)",
      cxxopts::value<double>()->default_value(ddp::detail::str(d.momentum)))(
      "weight-decay",
      "weight decay of conv and linear weights; biases and BatchNorm weights and biases get none "
      "(two parameter groups)",
      cxxopts::value<double>()->default_value(ddp::detail::str(d.weight_decay)))(
      "clip-grad-norm",
      "clip the gradients to this global L2 norm after backward, before the step (the norm of "
      "the all-reduced gradients, torch's clip_grad_norm_); 0: off",
      cxxopts::value<double>()->default_value("0"))(
      "lr-schedule",
      "learning rate per step: constant, step (x gamma every --lr-step-epochs), multistep (x gamma "
      "at each of --lr-milestones) or cosine (to 0 at the last step)",
      cxxopts::value<std::string>()->default_value("constant"))(
      "lr-step-epochs", "step: epochs between decays (counted after warmup)",
      cxxopts::value<long>()->default_value("30"))(
      "lr-milestones",
      "multistep: comma-separated epochs after warmup at which the lr is multiplied by gamma, "
      "e.g. 30,60,80",
      cxxopts::value<std::string>()->default_value(""))(
      "lr-gamma", "step, multistep: decay factor", cxxopts::value<double>()->default_value("0.1"))(
      "warmup-epochs",
      "linear warmup over this many epochs' steps, from lr/3 to lr (0: none; fractions allowed)",
      cxxopts::value<double>()->default_value("0"))(
      "sync-bn",
      "synchronise BatchNorm statistics across ranks (SyncBatchNorm; converted before DDP wraps "
      "the "
      "model)")("zero",
                "shard the optimizer state over the ranks (ZeRO-1, torch's "
                "ZeroRedundancyOptimizer): each rank "
                "keeps and steps the state of its share of the parameters, then broadcasts them; "
                "snapshots are the same");
}

namespace detail {
inline std::vector<std::int64_t> parse_milestones(const std::string& text) {
  std::vector<std::int64_t> out;
  if (text.empty()) return out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 1 || (!out.empty() && v <= out.back()))
      throw ConfigError(
          ddp::detail::str("ddp: --lr-milestones ", ddp::detail::quoted(text),
                           ": expected strictly increasing whole epochs >= 1 separated by commas, "
                           "e.g. 30,60,80"));
    out.push_back(v);
  }
  if (text.back() == ',')
    throw ConfigError(
        ddp::detail::str("ddp: --lr-milestones ", ddp::detail::quoted(text), " ends with a comma"));
  return out;
}

// ConfigError unless `flag`'s value v satisfies ok(v); `want` says what is allowed.
template <class V, class Ok>
V checked(const cxxopts::ParseResult& args, const char* flag, Ok ok, const char* want) {
  const V v = args[flag].as<V>();
  if (!ok(v)) throw ConfigError(ddp::detail::str("ddp: --", flag, " must be ", want, ", got ", v));
  return v;
}
}  // namespace detail

// Reads the flags added by add_optim_options; a bad value, or a flag that the chosen optimizer or
// schedule does not use, is a ConfigError naming the flag (before any rendezvous).
inline OptimFlags read_optim_flags(const cxxopts::ParseResult& args) {
  OptimFlags f;
  const std::string opt = args["optimizer"].as<std::string>();
  if (opt == "sgd")
    f.optimizer = OptimizerKind::Sgd;
  else if (opt == "adamw")
    f.optimizer = OptimizerKind::AdamW;
  else
    throw ConfigError(ddp::detail::str("ddp: --optimizer ", ddp::detail::quoted(opt),
                                       " is unknown; valid: sgd, adamw"));
  const auto non_negative = [](double v) { return v >= 0.0 && std::isfinite(v); };
  f.momentum = detail::checked<double>(args, "momentum", non_negative, "a number >= 0");
  f.weight_decay = detail::checked<double>(args, "weight-decay", non_negative, "a number >= 0");
  f.clip_grad_norm =
      detail::checked<double>(args, "clip-grad-norm", non_negative, "a number >= 0 (0: off)");
  f.warmup_epochs =
      detail::checked<double>(args, "warmup-epochs", non_negative, "a number of epochs >= 0");
  f.lr_gamma = detail::checked<double>(
      args, "lr-gamma", [](double v) { return v > 0.0 && std::isfinite(v); }, "a number > 0");
  f.lr_step_epochs = detail::checked<long>(
      args, "lr-step-epochs", [](long v) { return v >= 1; }, "a whole number >= 1");
  // its message names --lr-schedule
  f.lr_policy = optim::parse_lr_policy(args["lr-schedule"].as<std::string>());
  f.lr_milestones = detail::parse_milestones(args["lr-milestones"].as<std::string>());
  f.sync_bn = args.count("sync-bn") > 0;
  f.zero = args.count("zero") > 0;
  // Flags the chosen optimizer or schedule would ignore: refuse rather than silently ignore them.
  const std::string schedule = args["lr-schedule"].as<std::string>();
  const auto refuse = [&](const char* flag, bool used, const char* needs, const std::string& have) {
    if (args.count(flag) && !used)
      throw ConfigError(ddp::detail::str("ddp: --", flag, " applies to ", needs, " only, not to ",
                                         have, "; drop it"));
  };
  refuse("momentum", f.optimizer == OptimizerKind::Sgd, "--optimizer sgd", "--optimizer " + opt);
  refuse("lr-step-epochs", f.lr_policy == optim::LrPolicy::Step, "--lr-schedule step",
         "--lr-schedule " + schedule);
  refuse("lr-milestones", f.lr_policy == optim::LrPolicy::MultiStep, "--lr-schedule multistep",
         "--lr-schedule " + schedule);
  refuse("lr-gamma",
         f.lr_policy == optim::LrPolicy::Step || f.lr_policy == optim::LrPolicy::MultiStep,
         "--lr-schedule step or multistep", "--lr-schedule " + schedule);
  if (f.lr_policy == optim::LrPolicy::MultiStep && f.lr_milestones.empty())
    throw ConfigError(
        "ddp: --lr-schedule multistep needs --lr-milestones, e.g. --lr-milestones 30,60,80");
  return f;
}

inline const char* optimizer_name(OptimizerKind k) {
  return k == OptimizerKind::AdamW ? "adamw" : "sgd";
}

// The schedule of the flags for a run of `epochs` epochs of `steps_per_epoch` optimizer steps from
// `base_lr`. Cosine's half-period is every step after warmup, so the last step runs at (almost) 0.
inline optim::LrSchedule lr_schedule(const OptimFlags& f, double base_lr,
                                     std::int64_t steps_per_epoch, std::int64_t epochs) {
  if (steps_per_epoch < 1) steps_per_epoch = 1;  // an empty epoch: any clock will do
  optim::LrScheduleOptions o{.policy = f.lr_policy, .base_lr = base_lr, .gamma = f.lr_gamma};
  o.warmup_steps = std::llround(f.warmup_epochs * static_cast<double>(steps_per_epoch));
  o.step_size = f.lr_step_epochs * steps_per_epoch;
  for (std::int64_t m : f.lr_milestones) o.milestones.push_back(m * steps_per_epoch);
  o.t_max = std::max<std::int64_t>(1, epochs * steps_per_epoch - o.warmup_steps);
  return optim::LrSchedule(o);
}

// --sync-bn: makes every BatchNorm2d of model synchronised over comm (call before DDP wraps it);
// returns how many. A model without BatchNorm is left alone, with a warning from rank 0.
template <class T, Device D>
std::size_t sync_batchnorm_if(const OptimFlags& f, nn::Module<T, D>& model,
                              comm::Communicator& comm) {
  if (!f.sync_bn) return 0;
  const std::size_t n = nn::convert_sync_batchnorm(model, comm);
  if (n == 0 && comm.rank() == 0)
    DDP_LOG_WARN("--sync-bn: ", model.describe(),
                 " has no BatchNorm2d layer; nothing to synchronise");
  return n;
}

// --clip-grad-norm: clips all of model's gradients (under DDP the all-reduced ones, so every rank
// clips by the same factor) and returns their norm before clipping; -1 when off.
template <class T, Device D>
double clip_gradients(const OptimFlags& f, Exec<D>& exec, nn::Module<T, D>& model) {
  if (f.clip_grad_norm <= 0.0) return -1.0;
  return optim::clip_grad_norm(exec, model.parameters(), f.clip_grad_norm);
}

// Builds the optimizer the flags choose over model's parameters (weight_decay_groups) at learning
// rate lr and returns fn(optimizer), the optimizer living for the call. fn (the training loop, a
// generic lambda) gets an optim::SGD<T, D>& or optim::AdamW<T, D>&, or with --zero a
// parallel::ZeroRedundancyOptimizer over one of them sharded over comm (train/snapshot_io.hpp
// saves and resumes any of them).
template <class T, Device D, class Fn>
std::invoke_result_t<Fn&, optim::SGD<T, D>&> with_optimizer(const OptimFlags& f, double lr,
                                                            nn::Module<T, D>& model,
                                                            comm::Communicator& comm, Fn&& fn) {
  auto groups = optim::weight_decay_groups(model, f.weight_decay);
  auto build = [&]<class O>(const auto& o) {
    if (f.zero) {
      parallel::ZeroRedundancyOptimizer<O> opt(std::move(groups), o, comm);
      return fn(opt);
    }
    O opt(std::move(groups), o);
    return fn(opt);
  };
  if (f.optimizer == OptimizerKind::AdamW)
    return build.template operator()<optim::AdamW<T, D>>(
        optim::AdamwOptions{.lr = lr, .weight_decay = f.weight_decay});
  return build.template operator()<optim::SGD<T, D>>(
      optim::SgdOptions{.lr = lr, .momentum = f.momentum, .weight_decay = f.weight_decay});
}

}  // namespace ddp::train
