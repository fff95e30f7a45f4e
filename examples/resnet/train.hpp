// The resnet example's training loop, written once for both devices (main.cpp runs it on the CPU,
// train_cuda.cu on the GPU).
// SPDX-License-Identifier: MIT
//
// One step: images and labels come from the DataLoader on the host (uploaded to the GPU for Cuda), then
// DDP forward, cross-entropy (its value is read on the host, so the host waits for the forward once per
// step, like PyTorch's loss.item()), DDP backward (buckets all-reduced while backward runs; no host wait)
// and the SGD step (one multi-tensor launch on the GPU). Snapshots are written and read through a
// CPU copy of the model (train/checkpoint.hpp works on host tensors); on the GPU every rank reads the
// snapshot file itself (NCCL moves device memory only), so --resume there needs the file on every node.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <ddp/comm/communicator.hpp>
#include <ddp/data/dataset.hpp>
#include <ddp/data/loader.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/nn/resnet.hpp>
#include <ddp/optim/sgd.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/metrics.hpp>
#include <ddp/train/snapshot_sync.hpp>

namespace resnet_example {

using namespace ddp;

// Everything main() decided before choosing the device.
struct Setup {
  std::string arch = "resnet50";
  long width = 64;
  std::uint64_t seed = 0;
  double learning_rate = 0.1;
  long num_epochs = 1;
  long log_every = 1;
  std::size_t batch_size = 256;
  bool resume = false;
  std::string path;          // snapshot file
  std::string metrics_file;  // rank 0's JSON lines (empty: none)
  parallel::DdpOptions ddp;
  comm::Communicator* comm = nullptr;
  data::Dataset* train_set = nullptr;
  data::Dataset* test_set = nullptr;  // CIFAR-10 evaluation on rank 0, or nullptr
  data::DataLoader* loader = nullptr;
};

// Copies a GPU model's parameters, buffers and momentum buffers into a CPU model and optimizer (snapshots).
template <Device D>
void copy_state(Exec<D>& exec, nn::ResNet<float, D>& src, optim::SGD<float, D>& sopt, nn::ResNet<float, Cpu>& dst,
                optim::SGD<float, Cpu>& dopt) {
  auto sp = src.parameters();
  auto dp = dst.parameters();
  for (std::size_t i = 0; i < sp.size(); ++i) {
    copy(sp[i]->value().cview(), dp[i]->value().view(), exec);
    if (auto* m = sopt.momentum_buffer(i)) copy(m->cview(), dopt.set_momentum_buffer(i).view(), exec);
  }
  auto sb = src.buffers();
  auto db = dst.buffers();
  for (std::size_t i = 0; i < sb.size(); ++i) {
    if (sb[i]->is_integer())
      copy(sb[i]->count().cview(), db[i]->count().view(), exec);
    else
      copy(sb[i]->real().cview(), db[i]->real().view(), exec);
  }
  dopt.set_lr(sopt.lr());
  dopt.set_steps(sopt.steps());
}

// The other direction: a snapshot loaded on the CPU, uploaded into the GPU model and optimizer.
template <Device D>
void load_state(Exec<D>& exec, nn::ResNet<float, Cpu>& src, optim::SGD<float, Cpu>& sopt, nn::ResNet<float, D>& dst,
                optim::SGD<float, D>& dopt) {
  auto sp = src.parameters();
  auto dp = dst.parameters();
  for (std::size_t i = 0; i < sp.size(); ++i) {
    copy(sp[i]->value().cview(), dp[i]->value().view(), exec);
    if (auto* m = sopt.momentum_buffer(i)) copy(m->cview(), dopt.set_momentum_buffer(i).view(), exec);
  }
  auto sb = src.buffers();
  auto db = dst.buffers();
  for (std::size_t i = 0; i < sb.size(); ++i) {
    if (sb[i]->is_integer())
      copy(sb[i]->count().cview(), db[i]->count().view(), exec);
    else
      copy(sb[i]->real().cview(), db[i]->real().view(), exec);
  }
  dopt.set_lr(sopt.lr());
  dopt.set_steps(sopt.steps());
}

template <Device D>
int train(Setup& s, Exec<D>& exec) {
  comm::Communicator& comm = *s.comm;
  const int rank = comm.rank(), world = comm.size();
  const nn::ResNetOptions mo{
      .arch = s.arch, .num_classes = s.train_set->num_classes(), .seed = s.seed, .width = s.width};
  const optim::SgdOptions so{.lr = s.learning_rate, .momentum = 0.9, .weight_decay = 1e-5};
  nn::ResNet<float, D> net(mo);
  optim::SGD<float, D> opt(net.parameters(), so);
  long start_epoch = 0;
  if (s.resume) {
    if constexpr (std::is_same_v<D, Cpu>) {
      const auto bytes = train::read_and_broadcast(comm, s.path);
      if (!bytes.empty())
        start_epoch = static_cast<long>(train::load_snapshot_bytes<float>(bytes, net, opt, s.path).epoch);
    } else if (std::filesystem::exists(s.path)) {  // every rank reads the file (see the file comment)
      nn::ResNet<float, Cpu> host(mo);
      optim::SGD<float, Cpu> hopt(host.parameters(), so);
      start_epoch = static_cast<long>(train::load_snapshot<float>(s.path, host, hopt).epoch);
      load_state(exec, host, hopt, net, opt);
    }
    if (rank == 0) std::cout << "resumed from " << s.path << " at epoch " << start_epoch << std::endl;
  }
  parallel::DistributedDataParallel<float, D> model(net, comm, s.ddp);
  train::MetricsWriter metrics(rank == 0 ? s.metrics_file : std::string());
  nn::CrossEntropyLoss<float, D> ce;

  std::size_t total_steps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (long epoch = start_epoch; epoch < s.num_epochs; ++epoch) {
    net.train();
    s.loader->start_epoch(static_cast<std::uint64_t>(epoch));
    const auto steps = static_cast<long>(s.loader->num_batches());
    while (auto batch = s.loader->next()) {
      opt.zero_grad();
      double loss = 0.0;
      if constexpr (std::is_same_v<D, Cpu>) {
        auto logits = model.forward(exec, batch->images.cview());
        loss = ce.forward(exec, logits.cview(), batch->labels.cview());
      } else {
        const Tensor<float, D> images = to<D>(batch->images.cview(), exec);
        const Tensor<std::int64_t, D> labels = to<D>(batch->labels.cview(), exec);
        auto logits = model.forward(exec, images.cview());
        loss = ce.forward(exec, logits.cview(), labels.cview());
      }
      model.backward(exec, ce.backward(exec).cview());
      opt.step(exec);
      ++total_steps;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double sps = static_cast<double>(total_steps * s.batch_size * static_cast<std::size_t>(world)) / secs;
      const long step = static_cast<long>(batch->step) + 1;
      if (rank == 0 && (step % s.log_every == 0 || step == steps))
        std::cout << train::progress_line(epoch, step, steps, loss, sps) << std::endl;
      metrics.write({{"epoch", epoch}, {"step", step}, {"loss", loss}, {"samples_per_sec", sps}});
    }
    if (rank == 0) {
      std::filesystem::create_directories(std::filesystem::path(s.path).parent_path());
      if constexpr (std::is_same_v<D, Cpu>) {
        train::save_snapshot(s.path, net, opt, {.epoch = epoch + 1});
      } else {
        nn::ResNet<float, Cpu> host(mo);
        optim::SGD<float, Cpu> hopt(host.parameters(), so);
        copy_state(exec, net, opt, host, hopt);
        train::save_snapshot(s.path, host, hopt, {.epoch = epoch + 1});
      }
    }
    if (s.test_set && rank == 0) {  // evaluation on the unwrapped model: no collective involved
      net.eval();
      data::EvalSampler es(s.test_set->size(), 1, 0);
      data::DataLoader tl(*s.test_set, es, {.batch_size = 256});
      tl.start_epoch(0);
      std::size_t correct = 0;
      while (auto b = tl.next()) {
        Tensor<float, Cpu> y;
        if constexpr (std::is_same_v<D, Cpu>) {
          y = net.forward(exec, b->images.cview());
        } else {
          const Tensor<float, D> images = to<D>(b->images.cview(), exec);
          y = to<Cpu>(net.forward(exec, images.cview()).cview(), exec);
        }
        const auto c = y.shape()[1];
        for (std::int64_t i = 0; i < y.shape()[0]; ++i)
          correct +=
              std::max_element(y.data() + i * c, y.data() + (i + 1) * c) - (y.data() + i * c) == b->labels.data()[i];
      }
      std::cout << "epoch " << epoch << " test accuracy " << static_cast<double>(correct) / s.test_set->size()
                << std::endl;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank == 0)
    std::cout << "samples_per_sec: " << static_cast<double>(total_steps * s.batch_size * world) / secs << " (" << world
              << " ranks x " << s.batch_size << " samples x " << total_steps << " steps in " << secs << " s)"
              << std::endl;
  return 0;
}

}  // namespace resnet_example
