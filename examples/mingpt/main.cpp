// mingpt: the DDP tutorial series' minGPT chapter (pytorch/examples distributed/minGPT-ddp): a
// character-level GPT trained with DDP, snapshots and resume; and `mingpt generate`, which samples
// text from a snapshot.
// SPDX-License-Identifier: MIT
//
// Usage:
//   mingpt [train] --data_path input.txt [--config gpt2_train_cfg.json] [--n_layer 8 --n_head 8
//     --n_embd 512]
//          [--block_size 128 --batch_size 216 --max_epochs 10 --save_every 3 ...] [distributed
//            flags]
//   mingpt generate --snapshot_path gpt_snapshot.safetensors --prompt "O God" [--max_new_tokens
//     500]
//          [--temperature 1.0] [--top_k 10] [--seed 0]
//   torchrun --standalone --nproc_per_node=2 --max_restarts=3 ./mingpt --data_path
//     /usr/share/common-licenses/GPL-3
//   ddprun --nproc-per-node 2 --standalone ./mingpt --data_path input.txt
//   mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 ./mingpt --data_path input.txt
// The defaults are the tutorial's gpt2_train_cfg.yaml (n_layer 8, n_head 8, n_embd 512, block_size
// 128, batch 216, AdamW lr 3e-4, weight decay 0.1 on Linear weights, grad_norm_clip 1.0, save_every
// 3, truncate 0.05, train_split 0.9). --config reads the same settings from a JSON file with that
// file's sections and keys:
//   {"data_config": {"path": "input.txt", "block_size": 128, "train_split": 0.9, "truncate": 0.05},
//    "gpt_config": {"n_layer": 8, "n_head": 8, "n_embd": 512, "embd_pdrop": 0.1, "resid_pdrop":
//      0.1, "attn_pdrop": 0.1},
//    "trainer_config": {"max_epochs": 10, "batch_size": 216, "grad_norm_clip": 1.0,
//                       "snapshot_path": "gpt_snapshot.safetensors", "save_every": 3, "use_amp":
//                         false,
//                       "amp_dtype": "bf16", "loss_scale": 0},
//    "optimizer_config": {"weight_decay": 0.1, "learning_rate": 0.0003}}
// A flag given on the command line wins over the file. Unknown sections or keys are errors naming
// them (the tutorial's data_loader_workers and compile are accepted and ignored: batches are slices
// of the text). Device (train/device_choice.hpp, the other examples' rules): --device cuda trains
// on GPU LOCAL_RANK with nccl (or shares the visible GPUs with gloo/tcp); without --device a build
// with CUDA and a visible GPU trains on the GPU (not with --backend mpi), anything else on the CPU.
// The GPU path is train_cuda.cu (docs/decisions/0048). Mixed precision (--use_amp, GPU only;
// docs/decisions/0049): the GEMMs (Linear, attention) compute with --amp_dtype operands (bf16, the
// default, or fp16: the tutorial's autocast dtype) and fp32 accumulation; everything else stays
// fp32. fp16 adds the dynamic loss scaler (optim/grad_scaler.hpp, torch's GradScaler rule);
// --loss_scale turns that on anywhere. Output (what the tutorial prints; train.hpp): "[GPU<rank>]
// Epoch <e> | Iter <i> | Train Loss <x>" every --log_every steps, "Snapshot saved at epoch <e>",
// and per epoch "[GPU0] Epoch <e> | Eval Loss <x>".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cxxopts.hpp>
#include <ddp/config.hpp>
#include <ddp/core/log.hpp>
#include <ddp/train/init.hpp>
#include <ddp/train/parse_args.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <variant>

#include "cuda_entry.hpp"
#include "generate.hpp"
#include "train.hpp"

using namespace ddp;

namespace {

using mingpt_example::Config;

// Every training setting once: its --config section and key (section "": flag only), its flag and
// help. The flags, the JSON reader and the flag overrides below all walk this table.
struct Setting {
  const char* section;
  const char* key;
  const char* flag;
  const char* help;
  std::variant<std::string Config::*, std::int64_t Config::*, std::uint64_t Config::*,
               double Config::*, bool Config::*>
      member;
};

const Setting kSettings[] = {
    {"data_config", "path", "data_path", "the text to train on (UTF-8)", &Config::data_path},
    {"data_config", "block_size", "block_size", "characters per sample: the context length",
     &Config::block_size},
    {"data_config", "train_split", "train_split",
     "fraction of the samples for training, the rest for evaluation", &Config::train_split},
    {"data_config", "truncate", "truncate", "fraction of the text used, from its start",
     &Config::truncate},
    {"gpt_config", "n_layer", "n_layer", "transformer blocks", &Config::n_layer},
    {"gpt_config", "n_head", "n_head", "attention heads", &Config::n_head},
    {"gpt_config", "n_embd", "n_embd", "embedding width", &Config::n_embd},
    {"gpt_config", "embd_pdrop", "embd_pdrop", "embedding dropout", &Config::embd_pdrop},
    {"gpt_config", "resid_pdrop", "resid_pdrop", "residual dropout", &Config::resid_pdrop},
    {"gpt_config", "attn_pdrop", "attn_pdrop", "dropout on the attention probabilities",
     &Config::attn_pdrop},
    {"trainer_config", "max_epochs", "max_epochs", "epochs to train", &Config::max_epochs},
    {"trainer_config", "batch_size", "batch_size", "samples per rank and step",
     &Config::batch_size},
    {"trainer_config", "grad_norm_clip", "grad_norm_clip", "clip the global gradient norm to this",
     &Config::grad_norm_clip},
    {"trainer_config", "snapshot_path", "snapshot_path",
     "snapshot file (global rank 0 writes it; generate reads it)", &Config::snapshot_path},
    {"trainer_config", "save_every", "save_every",
     "write a snapshot every this many epochs (and after the last)", &Config::save_every},
    {"trainer_config", "use_amp", "use_amp",
     "mixed precision on the GPU: GEMMs in --amp_dtype with fp32 accumulation", &Config::use_amp},
    {"trainer_config", "amp_dtype", "amp_dtype",
     "bf16 or fp16 (the tutorial's autocast default; adds the dynamic loss scaler)",
     &Config::amp_dtype},
    {"trainer_config", "loss_scale", "loss_scale",
     "initial scale of the dynamic loss scaler (0: 65536 with --use_amp --amp_dtype fp16, else no "
     "scaler); > 0 "
     "turns it on for any device and precision",
     &Config::loss_scale},
    {"optimizer_config", "weight_decay", "weight_decay", "AdamW weight decay on Linear weights",
     &Config::weight_decay},
    {"optimizer_config", "learning_rate", "learning_rate", "AdamW learning rate",
     &Config::learning_rate},
    {"", "", "seed", "initialisation, data split, dropout and sampling seed", &Config::seed},
    {"", "", "log_every", "print the train loss every this many steps (0: never)",
     &Config::log_every},
    {"", "", "max_iters", "at most this many steps per epoch (0: the whole epoch)",
     &Config::max_iters},
};

// How a setting is read from a flag or JSON: unsigned settings as signed, so that a negative value
// gets our error naming the setting (cxxopts' own says only "Argument '-1' failed to parse").
template <class V>
using ReadAs = std::conditional_t<std::is_same_v<V, std::uint64_t>, std::int64_t, V>;

// c.*m = v, checking an unsigned setting's sign; `name` says where v came from.
template <class V>
void assign(Config& c, V Config::*m, const ReadAs<V>& v, const std::string& name) {
  if constexpr (std::is_same_v<V, std::uint64_t>) {
    if (v < 0) throw ConfigError(ddp::detail::str("ddp: ", name, " must be >= 0, got ", v));
    c.*m = static_cast<V>(v);
  } else {
    c.*m = v;
  }
}

// One cxxopts option per setting, its default from Config's (bool settings are flags without a
// value).
void add_setting_options(cxxopts::Options& options) {
  const Config d;  // the tutorial's defaults
  auto add = options.add_options();
  for (const Setting& s : kSettings)
    std::visit(
        [&](auto m) {
          using V = std::remove_cvref_t<decltype(d.*m)>;
          if constexpr (std::is_same_v<V, bool>)
            add(s.flag, s.help);
          else if constexpr (std::is_same_v<V, std::string>)
            add(s.flag, s.help, cxxopts::value<V>()->default_value(d.*m));
          else
            add(s.flag, s.help, cxxopts::value<ReadAs<V>>()->default_value(ddp::detail::str(d.*m)));
        },
        s.member);
}

// The --config file's settings into c (flags given on the command line are applied afterwards, so
// they win).
void apply_config_file(const std::string& path, Config& c) {
  std::ifstream in(path);
  if (!in)
    throw IoError(ddp::detail::str("ddp: cannot open --config file ", ddp::detail::quoted(path)));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(ddp::detail::str("ddp: --config file ", ddp::detail::quoted(path),
                                       " is not valid JSON: ", e.what()));
  }
  const auto where = [&](const std::string& section, const std::string& key) {
    return ddp::detail::str("--config file ", ddp::detail::quoted(path), ": ", section, ".", key);
  };
  if (!j.is_object())
    throw ConfigError(ddp::detail::str("ddp: --config file ", ddp::detail::quoted(path),
                                       " must hold a JSON object"));
  for (const auto& [section, body] : j.items()) {
    // the tutorial's torch.compile switch: nothing to compile here
    if (section == "compile") continue;
    if (!body.is_object())
      throw ConfigError(ddp::detail::str("ddp: --config file ", ddp::detail::quoted(path),
                                         ": section '", section, "' must be an object"));
    for (const auto& [key, v] : body.items()) {
      // no loader threads
      if (section == "trainer_config" && key == "data_loader_workers") continue;
      const auto s = std::find_if(
          std::begin(kSettings), std::end(kSettings),
          [&](const Setting& x) { return *x.section && section == x.section && key == x.key; });
      if (s == std::end(kSettings))
        throw ConfigError(ddp::detail::str("ddp: unknown setting ", where(section, key),
                                           "; see `mingpt --help`"));
      try {
        std::visit(
            [&](auto m) {
              using V = std::remove_cvref_t<decltype(c.*m)>;
              assign(c, m, v.get<ReadAs<V>>(), where(section, key));
            },
            s->member);
      } catch (const nlohmann::json::exception& e) {
        throw ConfigError(ddp::detail::str("ddp: ", where(section, key), " has the wrong type (",
                                           v.dump(), "): ", e.what()));
      }
    }
  }
}

// Settings given on the command line into c (after --config, so they win).
void apply_flags(const cxxopts::ParseResult& args, Config& c) {
  for (const Setting& s : kSettings) {
    if (!args.count(s.flag)) continue;
    std::visit(
        [&](auto m) {
          using V = std::remove_cvref_t<decltype(c.*m)>;
          if constexpr (std::is_same_v<V, bool>)
            c.*m = true;
          else
            assign(c, m, args[s.flag].as<ReadAs<V>>(), ddp::detail::str("--", s.flag));
        },
        s.member);
  }
}

int run_generate(const cxxopts::ParseResult& args) {
  Config flags;  // generate reads only --seed of the settings (checked as train's)
  apply_flags(args, flags);
  const std::uint64_t seed = flags.seed;
  const mingpt_example::GenerateOptions o{.snapshot_path = args["snapshot_path"].as<std::string>(),
                                          .prompt = args["prompt"].as<std::string>(),
                                          .max_new_tokens = args["max_new_tokens"].as<long>(),
                                          .temperature = args["temperature"].as<double>(),
                                          .top_k = args["top_k"].as<long>(),
                                          .seed = seed};
  std::cout << mingpt_example::generate(o) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    train::InitFlags init(argc, argv);  // takes --local_rank=N, --rank, ... out of argv
    cxxopts::Options options(
        "mingpt", "The DDP tutorial's minGPT job: a character-level GPT trained with DDP");
    options.positional_help("[train|generate]");
    options.add_options()("mode", "train (default) or generate",
                          cxxopts::value<std::string>()->default_value("train"))(
        "config", "JSON file with the tutorial's config sections (see the file comment)",
        cxxopts::value<std::string>()->default_value(""));
    add_setting_options(options);
    options.add_options()("prompt", "generate: the text to continue",
                          cxxopts::value<std::string>()->default_value(""))(
        "max_new_tokens", "generate: characters to sample",
        cxxopts::value<long>()->default_value("500"))(
        "temperature", "generate: logits are divided by this (0: always the most likely)",
        cxxopts::value<double>()->default_value("1.0"))(
        "top_k", "generate: sample among this many most likely characters (0: all)",
        cxxopts::value<long>()->default_value("10"))("h,help", "this help");
    init.add_options(options);  // --backend, --device, --timeout-ms, ... (train/init.hpp)
    options.parse_positional({"mode"});
    const auto args = ddp::train::parse_args(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << '\n';
      return 0;
    }
    log::init();
    const std::string mode = args["mode"].as<std::string>();
    if (mode == "generate") return run_generate(args);
    if (mode != "train")
      throw ConfigError("ddp: the mode must be train or generate, got '" + mode + "'");

    Config c;
    if (const std::string cfg = args["config"].as<std::string>(); !cfg.empty())
      apply_config_file(cfg, c);
    apply_flags(args, c);
    // Bad settings fail here, before any rendezvous.
    if (c.data_path.empty())
      throw ConfigError("ddp: --data_path is required: the text file to train on");
    if (c.max_epochs < 1 || c.save_every < 1 || c.batch_size < 1)
      throw ConfigError("ddp: --max_epochs, --save_every and --batch_size must be >= 1");
    if (!(c.grad_norm_clip > 0.0)) throw ConfigError("ddp: --grad_norm_clip must be > 0");
    if (c.n_embd % c.n_head != 0)
      throw ConfigError(ddp::detail::str("ddp: --n_embd (", c.n_embd,
                                         ") must be a multiple of --n_head (", c.n_head, ")"));
    if (c.amp_dtype != "bf16" && c.amp_dtype != "fp16")
      throw ConfigError(ddp::detail::str("ddp: --amp_dtype must be bf16 or fp16, got ",
                                         ddp::detail::quoted(c.amp_dtype)));
    if (!(c.loss_scale >= 0.0) || !std::isfinite(c.loss_scale))
      throw ConfigError(ddp::detail::str(
          "ddp: --loss_scale must be finite and >= 0 (0: automatic), got ", c.loss_scale));
    const train::DistFlags& dist = init.read(args);  // and the device
    if (c.use_amp && !init.device().is_cuda())
      throw ConfigError(
          "ddp: use_amp (trainer_config.use_amp or --use_amp) needs the GPU (--device cuda): on "
          "the CPU "
          "every GEMM runs in fp32; drop it there");

    train::Job job = train::init_process_group(init);
    const mingpt_example::Setup setup{.cfg = c,
                                      .metrics_file = dist.metrics_file,
                                      .tensorboard_dir = dist.tensorboard_dir,
                                      .trace = dist.trace,
                                      .ddp = dist.ddp,
                                      .comm = &job.communicator()};
    if constexpr (BuildConfig::with_cuda)
      if (job.cuda_device() >= 0) return mingpt_example::train_cuda(setup, job.cuda_device());
    Exec<Cpu> exec;
    // the communicator's destructor runs a bounded barrier
    return mingpt_example::train<Cpu>(setup, exec);
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
