// The resnet example's training loop, written once for both devices (main.cpp runs it on the CPU,
// train_cuda.cu on the GPU) and once for every optimizer (train/optim_flags.hpp's with_optimizer
// calls it with the SGD or AdamW that --optimizer chose).
// SPDX-License-Identifier: MIT
//
// One step: images and labels come from the DataLoader on the host (used in place on the CPU; on
// the GPU copied into pinned memory and uploaded on a copy stream a step ahead,
// tensor/prefetch.hpp; the device batch lives until the next batch is taken, after backward
// returned, since conv1 keeps a view of its input), then DDP forward, cross-entropy (its value is
// read on the host, so the host waits for the forward once per step, like PyTorch's loss.item()),
// DDP backward (buckets all-reduced while backward runs; no host wait), the optional gradient
// clipping (--clip-grad-norm: the norm of the all-reduced gradients, one host wait), the learning
// rate of this step (--lr-schedule, --warmup-epochs: a function of the optimizer's step count) and
// the optimizer step (one multi-tensor launch on the GPU). Snapshots are written and read on the
// host (train/checkpoint.hpp works on host tensors) through train/snapshot_io.hpp
// (train::state_on<Cpu>): the model itself on the CPU, a host copy on the GPU. --resume: rank 0
// reads the file and broadcasts its bytes (through the GPU for nccl), so only rank 0's node needs
// it; the optimizer kind, its state and step count (the schedule's clock) come back. Evaluation
// (CIFAR-format data or an ImageFolder --val_dir): every rank evaluates its share of the test set
// (data::EvalSampler: each sample on exactly one rank, no padding) on the unwrapped model, then one
// all-reduce (Sum) of [top-1 correct, top-5 correct, samples] gives rank 0 the accuracy of the
// whole test set; no rank waits on another's evaluation.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include <ddp/comm/communicator.hpp>
#include <ddp/data/dataset.hpp>
#include <ddp/data/distributed_sampler.hpp>
#include <ddp/data/loader.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/optimizer.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/tensor/copy.hpp>
#include <ddp/tensor/prefetch.hpp>
#include <ddp/train/bookkeeper.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/device_state.hpp>
#include <ddp/train/optim_flags.hpp>
#include <ddp/train/rank_sum.hpp>
#include <ddp/train/snapshot_io.hpp>

namespace resnet_example {

using namespace ddp;

// Everything main() decided before choosing the device.
struct Setup {
  std::string arch = "resnet50";
  long width = 64;
  std::uint64_t seed = 0;
  double learning_rate = 0.1;  // the schedule's base
  long num_epochs = 1;
  long log_every = 1;
  std::size_t batch_size = 256;
  bool resume = false;
  std::string path;             // snapshot file
  std::string metrics_file;     // rank 0's JSON lines (empty: none)
  std::string tensorboard_dir;  // rank 0's TensorBoard event file, the same records (empty: none)
  train::TraceOptions trace;    // --trace FILE, --trace-steps (train/trace.hpp; path empty: none)
  // the GPU's tensor memory (train_cuda.cu); nullptr on the CPU
  MemoryStats (*device_memory)() = nullptr;
  parallel::DdpOptions ddp;
  // --optimizer, --weight-decay, --clip-grad-norm, --lr-schedule, --sync-bn, ...
  train::OptimFlags optim;
  comm::Communicator* comm = nullptr;
  data::Dataset* train_set = nullptr;
  // evaluation after every epoch (CIFAR test set, --val_dir), or nullptr
  data::Dataset* test_set = nullptr;
  data::DataLoader* loader = nullptr;
  std::size_t workers = 1;  // --workers: loader threads decoding batches (ImageFolder JPEGs)
};

// This rank's share of `test_set` (data::EvalSampler over world ranks) through the unwrapped model
// in eval mode (running statistics: no collective, also with --sync-bn); returns [top-1 correct,
// top-5 correct, samples]. Top-5: the label's logit is among the 5 largest (fewer classes: always,
// as torch's topk(min(5, C))).
template <Device D>
std::array<double, 3> evaluate_share(nn::ResNet<float, D>& net, Exec<D>& exec,
                                     const data::Dataset& test_set, int world, int rank,
                                     std::size_t eval_workers = 1) {
  net.eval();
  data::EvalSampler es(test_set.size(), world, rank);
  data::DataLoader tl(test_set, es, {.batch_size = 256, .num_workers = eval_workers});
  tl.start_epoch(0);
  std::size_t correct = 0, correct5 = 0, samples = 0;
  while (auto b = tl.next()) {
    const auto images = train::on_device<D>(b->images.cview(), exec);
    const Tensor<float, D> logits = net.forward(exec, images.cview());
    const auto y = train::on_device<Cpu>(logits.cview(), exec);  // (N, classes) on the host
    const float* p = y.cview().data();
    const auto c = y.cview().shape()[1];
    for (std::int64_t i = 0; i < y.cview().shape()[0]; ++i) {
      const float* row = p + i * c;
      const std::int64_t label = b->labels.data()[i];
      correct += std::max_element(row, row + c) - row == label;
      // Rank of the label's logit: classes strictly above it, ties broken by index as torch's topk
      // on CPU.
      std::int64_t above = 0;
      for (std::int64_t k = 0; k < c; ++k)
        above += row[k] > row[label] || (row[k] == row[label] && k < label);
      correct5 += above < 5;
    }
    samples += static_cast<std::size_t>(y.cview().shape()[0]);
  }
  return {static_cast<double>(correct), static_cast<double>(correct5),
          static_cast<double>(samples)};
}

// The training loop for one optimizer type: optim::SGD or optim::AdamW over net's parameters, or
// (--zero) a parallel::ZeroRedundancyOptimizer over one of them.
template <Device D, class Opt>
int run(Setup& s, Exec<D>& exec, nn::ResNet<float, D>& net, Opt& opt, const nn::ResNetOptions& mo) {
  comm::Communicator& comm = *s.comm;
  const int rank = comm.rank(), world = comm.size();
  // Snapshots (train/snapshot_io.hpp): net and opt themselves on the CPU, a host copy of them on
  // the GPU; a ZeRO optimizer's shards consolidated on rank 0. fails now, not after an epoch
  train::prepare_snapshot_path(s.path, "--model_dir/--model_filename", rank, world);
  long start_epoch = 0;
  if (s.resume) {
    start_epoch = train::resume_snapshot(comm, s.path, exec, net, opt, mo).epoch;
    if (rank == 0)
      std::cout << "resumed from " << s.path << " at epoch " << start_epoch << std::endl;
  }
  parallel::DistributedDataParallel<float, D> model(net, comm, s.ddp);
  nn::CrossEntropyLoss<float, D> ce;
  const auto steps = static_cast<long>(s.loader->num_batches());
  const optim::LrSchedule schedule =
      train::lr_schedule(s.optim, s.learning_rate, steps, s.num_epochs);
  // Timing, rank 0's progress line (every --log_every steps in a log, redrawn on a terminal),
  // --metrics-file, --tensorboard-dir, --trace (on the GPU every traced span waits for the stream)
  // and a snapshot every epoch.
  train::Bookkeeper<D> book(comm, exec,
                            {.steps_per_epoch = steps,
                             .first_epoch = start_epoch,
                             .last_epoch = s.num_epochs - 1,
                             .log_every = s.log_every,
                             .metrics_file = s.metrics_file,
                             .tensorboard_dir = s.tensorboard_dir,
                             .trace = s.trace,
                             .device_memory = s.device_memory});
  // The batches on D (tensor/prefetch.hpp): the loader's host tensors themselves on the CPU; on the
  // GPU pinned slots uploaded on a copy stream, the next batch's upload overlapping this step
  // (docs/decisions/0050).
  Prefetcher<D, float, std::int64_t> uploads(exec);
  for (long epoch = start_epoch; epoch < s.num_epochs; ++epoch) {
    net.train();
    s.loader->start_epoch(static_cast<std::uint64_t>(epoch));
    auto feed = prefetch_feed(
        uploads, [&] { return s.loader->next(); },
        [](const data::Batch& b) { return std::tuple(b.images.cview(), b.labels.cview()); });
    book.start_epoch(epoch);
    while (const auto* batch = feed.next()) {  // its tensors stay valid until the next feed.next()
      book.got_batch();
      const auto& [images, labels] = batch->input;  // (B, H, W, C) float and (B) int64 on D
      opt.zero_grad();
      auto logits = model.forward(exec, images);
      double loss = 0.0;
      Tensor<float, D> dlogits;
      {
        trace::Span span("loss", "cross-entropy");
        loss = ce.forward(exec, logits.cview(), labels);
        dlogits = ce.backward(exec);
      }
      model.backward(exec, dlogits.cview());
      double grad_norm = -1.0;  // --clip-grad-norm off
      {
        trace::Span span("optimizer", "optimizer");
        grad_norm = train::clip_gradients(s.optim, exec, net);
        schedule.apply(opt);  // this step's lr, from the optimizer's step count
        opt.step(exec);
      }
      book.end_step({.loss = loss, .lr = opt.lr(), .samples = s.batch_size, .grad_norm = grad_norm},
                    model.last_trace());
    }
    book.end_epoch(epoch, [&] {  // collective with --zero
      train::save_snapshot_on_rank0(comm, s.path, exec, net, opt, {.epoch = epoch + 1}, mo);
    });
    if (s.test_set) {
      const auto [correct, correct5, samples] = train::sum_over_ranks(
          comm, exec, evaluate_share(net, exec, *s.test_set, world, rank, s.workers));
      if (rank == 0)
        std::cout << "epoch " << epoch << " test accuracy " << correct / samples << " ("
                  << static_cast<long>(correct) << "/" << static_cast<long>(samples) << ") top-5 "
                  << correct5 / samples << " (" << static_cast<long>(correct5) << "/"
                  << static_cast<long>(samples) << ")" << std::endl;
    }
  }
  // a --trace-steps range past the last step is cut here (collective)
  const train::RunTotals t = book.finish();
  if (rank == 0)
    std::cout << "samples_per_sec: " << t.samples_per_sec() << " (" << world << " ranks x "
              << s.batch_size << " samples x " << t.steps << " steps in " << t.seconds << " s)"
              << std::endl;
  return 0;
}

template <Device D>
int train(Setup& s, Exec<D>& exec) {
  const nn::ResNetOptions mo{
      .arch = s.arch, .num_classes = s.train_set->num_classes(), .seed = s.seed, .width = s.width};
  nn::ResNet<float, D> net(mo);
  train::sync_batchnorm_if(s.optim, net, *s.comm);  // --sync-bn: before DDP wraps net
  return train::with_optimizer(s.optim, s.learning_rate, net, *s.comm,
                               [&](auto& opt) { return run(s, exec, net, opt, mo); });
}

}  // namespace resnet_example
