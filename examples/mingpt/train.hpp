// The mingpt example's training loop: the DDP tutorial's minGPT-ddp Trainer (pytorch/examples,
// distributed/minGPT-ddp/mingpt/trainer.py) written once for every device (main.cpp runs it on the
// CPU, train_cuda.cu on the GPU, docs/decisions/0048).
// SPDX-License-Identifier: MIT
//
// Per epoch (1-based in its lines, as the tutorial's): the DistributedSampler over the training
// split (set_epoch(epoch)), batches of batch_size samples per rank (on the GPU uploaded from pinned
// memory a step ahead, tensor/prefetch.hpp); per step DDP forward on the int64 ids, the mean
// cross-entropy over the B*T positions, DDP backward, clip_grad_norm(grad_norm_clip) over every
// parameter, AdamW (linear_weight_decay_groups: the tutorial's create_optimizer groups, betas
// 0.9/0.95); every log_every-th step each rank prints "[GPU<rank>] Epoch <e> | Iter <i> | Train
// Loss <x>" (the tutorial's line, on the CPU too). After the epoch: a snapshot (every save_every-th
// epoch, and after the last one, which the tutorial skips), then the evaluation of the test split:
// every rank its share (data::EvalSampler, no padding), the model in eval mode (no dropout), the
// loss summed over every rank; rank 0 prints "[GPU0] Epoch <e> | Eval Loss <x>" (the tutorial
// prints per-rank batch losses instead). Snapshots (docs/decisions/0010, 0046): model, AdamW state
// and the finished epoch, written atomically by global rank 0 only (the tutorial writes from local
// rank 0 on every node); the file's metadata also holds the model configuration and the vocabulary,
// so `mingpt generate` needs nothing else. Resume: rank 0 reads the file and broadcasts it;
// training continues with the first unfinished epoch, and the dropout masks continue from the
// optimizer's step count, so a resumed run ends bit-identical to an uninterrupted one.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ddp/comm/communicator.hpp>
#include <ddp/core/error.hpp>
#include <ddp/core/str.hpp>
#include <ddp/data/char_dataset.hpp>
#include <ddp/data/distributed_sampler.hpp>
#include <ddp/nn/gpt.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/optim/adamw.hpp>
#include <ddp/optim/clip.hpp>
#include <ddp/optim/grad_scaler.hpp>
#include <ddp/optim/param_groups.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/tensor/precision.hpp>
#include <ddp/tensor/prefetch.hpp>
#include <ddp/train/bookkeeper.hpp>
#include <ddp/train/device_state.hpp>
#include <ddp/train/rank_sum.hpp>
#include <ddp/train/safetensors.hpp>
#include <ddp/train/snapshot_io.hpp>

namespace mingpt_example {

using namespace ddp;

// The tutorial's gpt2_train_cfg.yaml, section by section (flags and --config set them; main.cpp).
struct Config {
  // data_config
  std::string data_path;
  std::int64_t block_size = 128;
  double train_split = 0.9;
  double truncate = 0.05;
  // gpt_config (and GPTConfig's dropout defaults)
  std::int64_t n_layer = 8, n_head = 8, n_embd = 512;
  double embd_pdrop = 0.1, resid_pdrop = 0.1, attn_pdrop = 0.1;
  // trainer_config
  std::int64_t max_epochs = 10;
  std::uint64_t batch_size = 216;  // per rank, as the tutorial's DataLoader
  double grad_norm_clip = 1.0;
  std::string snapshot_path = "gpt_snapshot.safetensors";
  std::int64_t save_every = 3;
  bool use_amp = false;  // the GPU only (main.cpp refuses it on the CPU)
  // ours: the GEMMs' operand type under use_amp (the tutorial's autocast: fp16)
  std::string amp_dtype = "bf16";
  // ours: the loss scaler's initial scale; 0: 65536 for fp16 AMP, else none
  double loss_scale = 0;
  // optimizer_config
  double weight_decay = 0.1;
  double learning_rate = 3e-4;
  // ours
  std::uint64_t seed = 0;        // initialisation, split and dropout
  std::int64_t log_every = 100;  // the tutorial prints every 100 iterations
  std::int64_t max_iters = 0;    // > 0: at most this many steps per epoch (quick runs, tests)
};

// The arithmetic of the GEMMs on the GPU (tensor/precision.hpp): fp32 (as PyTorch's matmuls by
// default), or under use_amp the amp_dtype operands with fp32 accumulation (autocast's matmuls;
// docs/decisions/0049). The CPU always computes in fp32.
inline Precision gemm_precision(const Config& c) {
  return !c.use_amp ? Precision::Fp32 : c.amp_dtype == "fp16" ? Precision::Fp16 : Precision::Bf16;
}

// The dynamic loss scaler: on for fp16 AMP (torch's GradScaler defaults) or when --loss_scale is
// given.
inline optim::GradScalerOptions scaler_options(const Config& c) {
  const bool fp16 = c.use_amp && c.amp_dtype == "fp16";
  return {.init_scale = c.loss_scale > 0 ? c.loss_scale : 65536.0,
          .enabled = fp16 || c.loss_scale > 0};
}

// Everything the loop needs besides the configuration.
struct Setup {
  Config cfg;
  std::string metrics_file, tensorboard_dir;  // rank 0's (empty: none)
  train::TraceOptions trace;
  // the GPU's tensor memory (train_cuda.cu); nullptr on the CPU
  MemoryStats (*device_memory)() = nullptr;
  parallel::DdpOptions ddp;
  comm::Communicator* comm = nullptr;
};

// The snapshot's metadata entries that describe the model and its vocabulary (docs/decisions/0046);
// generate reads them back.
inline std::map<std::string, std::string> model_metadata(const nn::GPTOptions& o,
                                                         const data::CharDataset& text) {
  return {{"gpt.vocab_size", std::to_string(o.vocab_size)},
          {"gpt.block_size", std::to_string(o.block_size)},
          {"gpt.n_layer", std::to_string(o.n_layer)},
          {"gpt.n_head", std::to_string(o.n_head)},
          {"gpt.n_embd", std::to_string(o.n_embd)},
          {"gpt.vocab", text.vocab().utf8()}};
}

// The model options a configuration gives (dropout on the rank's own streams).
inline nn::GPTOptions gpt_options(const Config& c, std::int64_t vocab_size, int rank) {
  return {.vocab_size = vocab_size,
          .block_size = c.block_size,
          .n_layer = c.n_layer,
          .n_head = c.n_head,
          .n_embd = c.n_embd,
          .embd_pdrop = c.embd_pdrop,
          .resid_pdrop = c.resid_pdrop,
          .attn_pdrop = c.attn_pdrop,
          .seed = c.seed,
          .rank = static_cast<std::uint32_t>(rank)};
}

// Mean cross-entropy of logits (B, T, V) against targets (B, T) over the B*T positions, as the
// tutorial's F.cross_entropy(logits.view(-1, V), targets.view(-1)); with `grad` it keeps
// d(loss)/d(logits) in ce for backward, without (evaluation) it computes none.
template <Device D>
double lm_loss(nn::CrossEntropyLoss<float, D>& ce, Exec<D>& exec, const Tensor<float, D>& logits,
               TensorView<const std::int64_t, D> targets, bool grad = true) {
  const std::int64_t rows = logits.dim(0) * logits.dim(1), v = logits.dim(2);
  const auto l = logits.cview().reshape(Shape{rows, v});
  const auto y = targets.reshape(Shape{rows});
  return grad ? ce.forward(exec, l, y) : ce.value(exec, l, y);
}

// Batch `it` of `batch_size` samples: `text`'s samples split[order[k]] for k in [it batch_size, (it
// + 1) batch_size) (the last batch shorter), where order is a sampler's indices into the split.
inline data::TokenBatch batch_at(const data::CharDataset& text,
                                 const std::vector<std::int64_t>& split,
                                 const std::vector<std::int64_t>& order, std::size_t it,
                                 std::size_t batch_size) {
  std::vector<std::int64_t> idx;
  for (std::size_t k = it * batch_size; k < std::min(order.size(), (it + 1) * batch_size); ++k)
    idx.push_back(split[static_cast<std::size_t>(order[k])]);
  return text.batch(idx);
}

// This rank's share of the test split through the unwrapped model in eval mode: [loss summed over
// batches x positions, positions]. Batches of batch_size samples.
template <Device D>
std::array<double, 2> eval_share(nn::GPT<float, D>& net, Exec<D>& exec,
                                 const data::CharDataset& text,
                                 const std::vector<std::int64_t>& test, std::size_t batch_size,
                                 int world, int rank) {
  net.eval();
  data::EvalSampler es(test.size(), world, rank);
  const auto mine = es.indices();
  nn::CrossEntropyLoss<float, D> ce;
  double sum = 0, positions = 0;
  for (std::size_t it = 0; it * batch_size < mine.size(); ++it) {
    const data::TokenBatch b = batch_at(text, test, mine, it, batch_size);
    const auto x = train::on_device<D>(b.x.cview(), exec);
    const auto y = train::on_device<D>(b.y.cview(), exec);
    const Tensor<float, D> logits = net.forward(exec, x.cview());
    const double n = static_cast<double>(b.y.numel());
    sum += lm_loss(ce, exec, logits, y.cview(), /*grad=*/false) * n;
    positions += n;
  }
  net.train();
  return {sum, positions};
}

template <Device D>
int train(const Setup& s, Exec<D>& exec) {
  const Config& c = s.cfg;
  comm::Communicator& comm = *s.comm;
  const int rank = comm.rank(), world = comm.size();

  const data::CharDataset text(c.data_path, {.block_size = c.block_size, .truncate = c.truncate});
  const auto [train_idx, test_idx] = data::split_indices(text.size(), c.train_split, c.seed);
  if (train_idx.empty())
    throw ConfigError(ddp::detail::str(
        "ddp: the training split is empty (", text.size(), " samples x --train_split ",
        c.train_split, "); use a longer text, a larger --truncate or --train_split"));
  const nn::GPTOptions mo = gpt_options(c, text.vocab_size(), rank);
  nn::GPT<float, D> net(mo);
  optim::AdamW<float, D> opt(
      optim::linear_weight_decay_groups(net, c.weight_decay),
      {.lr = c.learning_rate, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = c.weight_decay});

  // A snapshot of a model trained on another text has the same tensor shapes when the vocabularies
  // are equally large, but its token ids mean other characters: rank 0, which reads the file,
  // compares the vocabularies first (the other ranks then fail with "rank 0 closed its connection",
  // rank 0's message says why).
  if (rank == 0 && std::filesystem::exists(c.snapshot_path)) {
    const auto meta = train::SafetensorsReader(c.snapshot_path).metadata();
    const auto it = meta.find("gpt.vocab");
    if (it != meta.end() && it->second != text.vocab().utf8())
      throw ConfigError(
          ddp::detail::str("ddp: snapshot ", ddp::detail::quoted(c.snapshot_path),
                           " was trained on a text with another vocabulary than --data_path ",
                           ddp::detail::quoted(c.data_path),
                           "; resume with the same text and "
                           "--truncate, or give a new --snapshot_path"));
  }
  optim::GradScaler<float, D> scaler(scaler_options(c));
  // fails now, not later
  train::prepare_snapshot_path(c.snapshot_path, "--snapshot_path", comm.rank(), comm.size());
  const train::SnapshotInfo resumed =
      train::resume_snapshot(comm, c.snapshot_path, exec, net, opt, mo);
  const long epochs_run = static_cast<long>(resumed.epoch);
  scaler.load_state(resumed.metadata, c.snapshot_path);
  // Iterations so far: optimizer steps plus the steps the loss scaler skipped (one training forward
  // each).
  const auto iterations = [&] { return opt.steps() + scaler.skipped_steps(); };
  net.set_dropout_step(static_cast<std::uint64_t>(iterations()));
  if (epochs_run > 0 && rank == 0)
    std::cout << "Resuming training from snapshot at Epoch " << epochs_run << std::endl;
  parallel::DistributedDataParallel<float, D> model(net, comm, s.ddp);

  data::DistributedSampler sampler(
      train_idx.size(), {.num_replicas = world, .rank = rank, .shuffle = true, .seed = c.seed});
  const std::size_t steps_all = (sampler.size() + c.batch_size - 1) / c.batch_size;
  const std::size_t steps =
      c.max_iters > 0 ? std::min<std::size_t>(steps_all, static_cast<std::size_t>(c.max_iters))
                      : steps_all;
  if (rank == 0 && (c.use_amp || scaler.enabled()))
    std::cout << "mingpt: GEMMs in " << precision_name(gemm_precision(c))
              << " with fp32 accumulation"
              << (scaler.enabled()
                      ? ddp::detail::str("; dynamic loss scaling, scale ", scaler.scale())
                      : "")
              << std::endl;
  if (rank == 0)
    std::cout << "mingpt: " << text.num_characters() << " characters, vocabulary "
              << text.vocab_size() << ", " << train_idx.size() << " training and "
              << test_idx.size() << " test samples; " << net.describe() << ", " << world
              << " ranks x batch " << c.batch_size << ", " << steps << " steps per epoch"
              << std::endl;

  nn::CrossEntropyLoss<float, D> ce;
  // Timing, tokens/s, --metrics-file, --tensorboard-dir, --trace and the snapshot cadence
  // (train/bookkeeper.hpp); on a terminal rank 0 also redraws one progress line with an ETA. Epochs
  // count from 1, as the tutorial's.
  train::Bookkeeper<D> book(comm, exec,
                            {.steps_per_epoch = static_cast<long long>(steps),
                             .first_epoch = epochs_run + 1,
                             .last_epoch = static_cast<long>(c.max_epochs),
                             .epoch_base = 1,
                             .save_every = static_cast<long>(c.save_every),
                             .progress_lines = false,
                             .metrics_file = s.metrics_file,
                             .tensorboard_dir = s.tensorboard_dir,
                             .trace = s.trace,
                             .device_memory = s.device_memory});
  const auto loss_text = [](double loss) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(5) << loss;  // the tutorial's {batch_loss:.5f}
    return o.str();
  };

  // The batches on D (tensor/prefetch.hpp): the host tensors themselves on the CPU; on the GPU
  // pinned slots uploaded on a copy stream, the next batch's upload overlapping this step
  // (docs/decisions/0050).
  Prefetcher<D, std::int64_t, std::int64_t> uploads(exec);
  for (long epoch = epochs_run + 1; epoch <= c.max_epochs; ++epoch) {  // 1-based, as the tutorial's
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    const auto mine = sampler.indices();
    // batches of this epoch made so far (the feed makes one ahead on the GPU)
    std::size_t assembled = 0;
    auto feed = prefetch_feed(
        uploads,
        [&]() -> std::optional<data::TokenBatch> {
          if (assembled == steps) return std::nullopt;
          return batch_at(text, train_idx, mine, assembled++, c.batch_size);
        },
        [](const data::TokenBatch& b) { return std::tuple(b.x.cview(), b.y.cview()); });
    book.start_epoch(epoch);
    for (std::size_t it = 0; it < steps; ++it) {
      // never nullptr (the source makes `steps`); valid until the next next()
      const auto* batch = feed.next();
      book.got_batch();
      const auto& [x, y] = batch->input;  // (B, block_size) token ids and targets on D
      opt.zero_grad();
      const Tensor<float, D> logits = model.forward(exec, x);
      double loss = 0;
      {
        trace::Span span("loss", "cross-entropy");
        loss = lm_loss(ce, exec, logits, y);
      }
      Tensor<float, D> dlogits = ce.backward(exec);  // (B*T, V)
      scaler.scale_grad(exec, dlogits.view());       // d(scale * loss); nothing without a scaler
      dlogits.reshape(logits.shape());
      model.backward(exec, dlogits.cview());
      double grad_norm = 0;
      const double scale = scaler.scale();
      bool skipped = false;
      {
        trace::Span span("optimizer", "optimizer");
        // Unscale, then clip the true gradients (the tutorial clips the scaled ones: not copied),
        // then step unless they overflowed (optim/grad_scaler.hpp).
        const optim::UnscaleResult u = scaler.unscale(exec, net.parameters());
        grad_norm = u.norm;
        if (!u.found_inf) optim::clip_to_norm(exec, net.parameters(), c.grad_norm_clip, u.norm);
        skipped = !scaler.step(exec, opt);
        scaler.update();
      }
      if (skipped && rank == 0 && c.log_every > 0)
        std::cout << "[GPU0] Epoch " << epoch << " | Iter " << it
                  << " | gradients overflowed at loss scale " << scale
                  << ": step skipped, scale now " << scaler.scale() << std::endl;
      if (c.log_every > 0 && it % static_cast<std::size_t>(c.log_every) == 0)
        std::cout << "[GPU" << rank << "] Epoch " << epoch << " | Iter " << it << " | Train Loss "
                  << loss_text(loss) << std::endl;
      const data::TokenBatch& b = batch->host;
      book.end_step(
          {.loss = loss,
           .lr = opt.lr(),
           .samples = static_cast<std::size_t>(b.x.dim(0)),
           .tokens = static_cast<std::size_t>(b.x.numel()),
           .grad_norm = grad_norm,
           .extra = scaler.enabled() ? nlohmann::json{{"loss_scale", scale}, {"skipped", skipped}}
                                     : nlohmann::json::object()},
          model.last_trace());
    }
    book.end_epoch(epoch, [&] {
      train::SnapshotInfo info{.epoch = epoch, .metadata = model_metadata(mo, text)};
      if (scaler.enabled() || scaler.skipped_steps() > 0) info.metadata.merge(scaler.state());
      train::save_snapshot_on_rank0(comm, c.snapshot_path, exec, net, opt, info, mo);
      if (rank == 0) std::cout << "Snapshot saved at epoch " << epoch << std::endl;
    });
    if (!test_idx.empty()) {
      const auto [sum, positions] = train::sum_over_ranks(
          comm, exec, eval_share(net, exec, text, test_idx, c.batch_size, world, rank));
      if (rank == 0)
        std::cout << "[GPU0] Epoch " << epoch << " | Eval Loss " << loss_text(sum / positions)
                  << std::endl;
    }
  }
  const train::RunTotals t = book.finish();  // collective with --trace
  if (rank == 0)
    std::cout << "Training took " << t.seconds << " s (" << t.tokens_per_sec() << " tokens/s)"
              << std::endl;
  return 0;
}

}  // namespace mingpt_example
