// mingpt: the DDP tutorial series' minGPT chapter (pytorch/examples distributed/minGPT-ddp): a character-level
// GPT trained with DDP, snapshots and resume; and `mingpt generate`, which samples text from a snapshot.
// SPDX-License-Identifier: MIT
//
// Usage:
//   mingpt [train] --data_path input.txt [--config gpt2_train_cfg.json] [--n_layer 8 --n_head 8 --n_embd 512]
//          [--block_size 128 --batch_size 216 --max_epochs 10 --save_every 3 ...] [distributed flags]
//   mingpt generate --snapshot_path gpt_snapshot.safetensors --prompt "O God" [--max_new_tokens 500]
//          [--temperature 1.0] [--top_k 10] [--seed 0]
//   torchrun --standalone --nproc_per_node=2 --max_restarts=3 ./mingpt --data_path /usr/share/common-licenses/GPL-3
//   ddprun --nproc-per-node 2 --standalone ./mingpt --data_path input.txt
//   mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 ./mingpt --data_path input.txt
// The defaults are the tutorial's gpt2_train_cfg.yaml (n_layer 8, n_head 8, n_embd 512, block_size 128, batch 216,
// AdamW lr 3e-4, weight decay 0.1 on Linear weights, grad_norm_clip 1.0, save_every 3, truncate 0.05,
// train_split 0.9). --config reads the same settings from a JSON file with that file's sections and keys:
//   {"data_config": {"path": "input.txt", "block_size": 128, "train_split": 0.9, "truncate": 0.05},
//    "gpt_config": {"n_layer": 8, "n_head": 8, "n_embd": 512},
//    "trainer_config": {"max_epochs": 10, "batch_size": 216, "grad_norm_clip": 1.0,
//                       "snapshot_path": "gpt_snapshot.safetensors", "save_every": 3, "use_amp": false},
//    "optimizer_config": {"weight_decay": 0.1, "learning_rate": 0.0003}}
// A flag given on the command line wins over the file. Unknown sections or keys are errors naming them
// (the tutorial's data_loader_workers and compile are accepted and ignored: batches are slices of the text).
// Device (train/device_choice.hpp, the other examples' rules): --device cuda trains on GPU LOCAL_RANK with nccl (or
// shares the visible GPUs with gloo/tcp); without --device a build with CUDA and a visible GPU trains on the GPU
// (not with --backend mpi), anything else on the CPU. The GPU path (train_cuda.cu, fp32) is UNVERIFIED: GPT's CUDA
// kernels have never run on a GPU (docs/ARCHITECTURE.md D48). --use_amp (mixed precision) is not written yet and
// is refused.
// Output (what the tutorial prints; train.hpp): "[GPU<rank>] Epoch <e> | Iter <i> | Train Loss <x>" every
// --log_every steps, "Snapshot saved at epoch <e>", and per epoch "[GPU0] Epoch <e> | Eval Loss <x>".
#include <cxxopts.hpp>
#include <ddp/config.hpp>
#include <ddp/core/log.hpp>
#include <ddp/env/flags.hpp>
#include <ddp/train/options.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/placement.hpp"
#include "cuda_entry.hpp"
#include "generate.hpp"
#include "train.hpp"

using namespace ddp;

namespace {

// The --config file's settings into c (flags given on the command line are applied afterwards, so they win).
void apply_config_file(const std::string& path, mingpt_example::Config& c) {
  std::ifstream in(path);
  if (!in) throw IoError(ddp::detail::str("ddp: cannot open --config file ", ddp::detail::quoted(path)));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(ddp::detail::str("ddp: --config file ", ddp::detail::quoted(path), " is not valid JSON: ", e.what()));
  }
  const auto where = [&](const std::string& section, const std::string& key) {
    return ddp::detail::str("--config file ", ddp::detail::quoted(path), ": ", section, ".", key);
  };
  if (!j.is_object()) throw ConfigError(ddp::detail::str("ddp: --config file ", ddp::detail::quoted(path), " must hold a JSON object"));
  for (const auto& [section, body] : j.items()) {
    if (section == "compile") continue;  // the tutorial's torch.compile switch: nothing to compile here
    if (!body.is_object())
      throw ConfigError(ddp::detail::str("ddp: --config file ", ddp::detail::quoted(path), ": section '", section,
                                         "' must be an object"));
    for (const auto& [key, v] : body.items()) {
      try {
        if (section == "data_config" && key == "path") c.data_path = v.get<std::string>();
        else if (section == "data_config" && key == "block_size") c.block_size = v.get<std::int64_t>();
        else if (section == "data_config" && key == "train_split") c.train_split = v.get<double>();
        else if (section == "data_config" && key == "truncate") c.truncate = v.get<double>();
        else if (section == "gpt_config" && key == "n_layer") c.n_layer = v.get<std::int64_t>();
        else if (section == "gpt_config" && key == "n_head") c.n_head = v.get<std::int64_t>();
        else if (section == "gpt_config" && key == "n_embd") c.n_embd = v.get<std::int64_t>();
        else if (section == "gpt_config" && key == "embd_pdrop") c.embd_pdrop = v.get<double>();
        else if (section == "gpt_config" && key == "resid_pdrop") c.resid_pdrop = v.get<double>();
        else if (section == "gpt_config" && key == "attn_pdrop") c.attn_pdrop = v.get<double>();
        else if (section == "trainer_config" && key == "max_epochs") c.max_epochs = v.get<long>();
        else if (section == "trainer_config" && key == "batch_size") c.batch_size = v.get<std::size_t>();
        else if (section == "trainer_config" && key == "grad_norm_clip") c.grad_norm_clip = v.get<double>();
        else if (section == "trainer_config" && key == "snapshot_path") c.snapshot_path = v.get<std::string>();
        else if (section == "trainer_config" && key == "save_every") c.save_every = v.get<long>();
        else if (section == "trainer_config" && key == "use_amp") c.use_amp = v.get<bool>();
        else if (section == "trainer_config" && key == "data_loader_workers") continue;  // no loader threads
        else if (section == "optimizer_config" && key == "weight_decay") c.weight_decay = v.get<double>();
        else if (section == "optimizer_config" && key == "learning_rate") c.learning_rate = v.get<double>();
        else
          throw ConfigError(ddp::detail::str("ddp: unknown setting ", where(section, key), "; see `mingpt --help`"));
      } catch (const nlohmann::json::exception& e) {
        throw ConfigError(ddp::detail::str("ddp: ", where(section, key), " has the wrong type (", v.dump(), "): ", e.what()));
      }
    }
  }
}

int run_generate(const cxxopts::ParseResult& args) {
  const mingpt_example::GenerateOptions o{.snapshot_path = args["snapshot_path"].as<std::string>(),
                                          .prompt = args["prompt"].as<std::string>(),
                                          .max_new_tokens = args["max_new_tokens"].as<long>(),
                                          .temperature = args["temperature"].as<double>(),
                                          .top_k = args["top_k"].as<long>(),
                                          .seed = static_cast<std::uint64_t>(args["seed"].as<long>())};
  std::cout << mingpt_example::generate(o) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const env::Env env = env::Env::process();
    const env::LaunchFlags launch = env::extract_launch_flags(argc, argv);
    const mingpt_example::Config d;  // the tutorial's defaults
    cxxopts::Options options("mingpt", "The DDP tutorial's minGPT job: a character-level GPT trained with DDP");
    options.positional_help("[train|generate]");
    const auto num = [](auto v) { return cxxopts::value<decltype(v)>()->default_value(std::to_string(v)); };
    const auto real = [](double v) { return cxxopts::value<double>()->default_value(ddp::detail::str(v)); };
    options.add_options()("mode", "train (default) or generate", cxxopts::value<std::string>()->default_value("train"))(
        "config", "JSON file with the tutorial's config sections (see the file comment)",
        cxxopts::value<std::string>()->default_value(""))(
        "data_path", "the text to train on (UTF-8)", cxxopts::value<std::string>()->default_value(""))(
        "block_size", "characters per sample: the context length", num(d.block_size))(
        "train_split", "fraction of the samples for training, the rest for evaluation", real(d.train_split))(
        "truncate", "fraction of the text used, from its start", real(d.truncate))(
        "n_layer", "transformer blocks", num(d.n_layer))("n_head", "attention heads", num(d.n_head))(
        "n_embd", "embedding width", num(d.n_embd))("embd_pdrop", "embedding dropout", real(d.embd_pdrop))(
        "resid_pdrop", "residual dropout", real(d.resid_pdrop))(
        "attn_pdrop", "dropout on the attention probabilities", real(d.attn_pdrop))(
        "max_epochs", "epochs to train", num(d.max_epochs))(
        "batch_size", "samples per rank and step", num(static_cast<long>(d.batch_size)))(
        "grad_norm_clip", "clip the global gradient norm to this", real(d.grad_norm_clip))(
        "snapshot_path", "snapshot file (global rank 0 writes it; generate reads it)",
        cxxopts::value<std::string>()->default_value(d.snapshot_path))(
        "save_every", "write a snapshot every this many epochs (and after the last)", num(d.save_every))(
        "use_amp", "mixed precision (not written for GPT yet: refused)")(
        "weight_decay", "AdamW weight decay on Linear weights", real(d.weight_decay))(
        "learning_rate", "AdamW learning rate", real(d.learning_rate))(
        "seed", "initialisation, data split, dropout and sampling seed", num(static_cast<long>(d.seed)))(
        "log_every", "print the train loss every this many steps (0: never)", num(d.log_every))(
        "max_iters", "at most this many steps per epoch (0: the whole epoch)", num(d.max_iters))(
        "device", "cpu or cuda (default: cuda when built with CUDA and a GPU is visible, except for --backend mpi; "
        "else cpu). The GPU path is unverified: GPT's CUDA kernels have never run on a GPU",
        cxxopts::value<std::string>()->default_value(""))(
        "prompt", "generate: the text to continue", cxxopts::value<std::string>()->default_value(""))(
        "max_new_tokens", "generate: characters to sample", cxxopts::value<long>()->default_value("500"))(
        "temperature", "generate: logits are divided by this (0: always the most likely)",
        cxxopts::value<double>()->default_value("1.0"))(
        "top_k", "generate: sample among this many most likely characters (0: all)",
        cxxopts::value<long>()->default_value("10"))(
        "die-after-epoch", "testing: global rank 1 kills itself (SIGKILL) after this epoch's snapshot on the first "
        "attempt (TORCHELASTIC_RESTART_COUNT=0)", cxxopts::value<long>()->default_value("-1"))("h,help", "this help");
    train::add_dist_options(options, env);
    options.parse_positional({"mode"});
    const auto args = options.parse(argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << '\n';
      return 0;
    }
    log::init();
    const std::string mode = args["mode"].as<std::string>();
    if (mode == "generate") return run_generate(args);
    if (mode != "train") throw ConfigError("ddp: the mode must be train or generate, got '" + mode + "'");

    mingpt_example::Config c;
    if (const std::string cfg = args["config"].as<std::string>(); !cfg.empty()) apply_config_file(cfg, c);
    const auto given = [&](const char* flag) { return args.count(flag) > 0; };
    if (given("data_path")) c.data_path = args["data_path"].as<std::string>();
    if (given("block_size")) c.block_size = args["block_size"].as<std::int64_t>();
    if (given("train_split")) c.train_split = args["train_split"].as<double>();
    if (given("truncate")) c.truncate = args["truncate"].as<double>();
    if (given("n_layer")) c.n_layer = args["n_layer"].as<std::int64_t>();
    if (given("n_head")) c.n_head = args["n_head"].as<std::int64_t>();
    if (given("n_embd")) c.n_embd = args["n_embd"].as<std::int64_t>();
    if (given("embd_pdrop")) c.embd_pdrop = args["embd_pdrop"].as<double>();
    if (given("resid_pdrop")) c.resid_pdrop = args["resid_pdrop"].as<double>();
    if (given("attn_pdrop")) c.attn_pdrop = args["attn_pdrop"].as<double>();
    if (given("max_epochs")) c.max_epochs = args["max_epochs"].as<long>();
    if (given("batch_size")) c.batch_size = static_cast<std::size_t>(std::max(0L, args["batch_size"].as<long>()));
    if (given("grad_norm_clip")) c.grad_norm_clip = args["grad_norm_clip"].as<double>();
    if (given("snapshot_path")) c.snapshot_path = args["snapshot_path"].as<std::string>();
    if (given("save_every")) c.save_every = args["save_every"].as<long>();
    if (given("use_amp")) c.use_amp = true;
    if (given("weight_decay")) c.weight_decay = args["weight_decay"].as<double>();
    if (given("learning_rate")) c.learning_rate = args["learning_rate"].as<double>();
    c.seed = static_cast<std::uint64_t>(args["seed"].as<long>());
    c.log_every = args["log_every"].as<long>();
    c.max_iters = args["max_iters"].as<long>();
    // Bad settings fail here, before any rendezvous.
    if (c.data_path.empty()) throw ConfigError("ddp: --data_path is required: the text file to train on");
    if (c.max_epochs < 1 || c.save_every < 1 || c.batch_size < 1)
      throw ConfigError("ddp: --max_epochs, --save_every and --batch_size must be >= 1");
    if (!(c.grad_norm_clip > 0.0)) throw ConfigError("ddp: --grad_norm_clip must be > 0");
    if (c.n_embd % c.n_head != 0)
      throw ConfigError(ddp::detail::str("ddp: --n_embd (", c.n_embd, ") must be a multiple of --n_head (", c.n_head, ")"));
    if (c.use_amp)
      throw ConfigError("ddp: use_amp (mixed precision) is not written for GPT yet; set "
                        "trainer_config.use_amp to false or drop --use_amp");
    const train::DistFlags dist = train::read_dist_flags(args);
    const ddp_example::Placement where = ddp_example::place(args["device"].as<std::string>(), dist.backend);

    ddp_example::Job job = ddp_example::join(dist, where, env, launch);
    const mingpt_example::Setup setup{.cfg = c, .die_after_epoch = args["die-after-epoch"].as<long>(),
                                      .restart_count = job.info.restart_count, .metrics_file = dist.metrics_file,
                                      .tensorboard_dir = dist.tensorboard_dir, .trace = dist.trace, .ddp = dist.ddp,
                                      .comm = job.comm.get()};
    if constexpr (BuildConfig::with_cuda)
      if (job.gpu >= 0) return mingpt_example::train_cuda(setup, job.gpu);
    Exec<Cpu> exec;
    return mingpt_example::train<Cpu>(setup, exec);  // the communicator's destructor runs a bounded barrier
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
