// The resnet example's training loop, written once for both devices (main.cpp runs it on the CPU,
// train_cuda.cu on the GPU).
// SPDX-License-Identifier: MIT
//
// One step: images and labels come from the DataLoader on the host (used in place on the CPU, uploaded for
// Cuda; the device batch lives until backward returns, since conv1 keeps a view of its input), then DDP
// forward, cross-entropy (its value is read on the host, so the host waits for the forward once per step,
// like PyTorch's loss.item()), DDP backward (buckets all-reduced while backward runs; no host wait) and the
// SGD step (one multi-tensor launch on the GPU). Snapshots are written and read on the host
// (train/checkpoint.hpp works on host tensors) through train::state_on<Cpu>: the model itself on the CPU, a
// host copy on the GPU. --resume: rank 0 reads the file and broadcasts its bytes (through the GPU for nccl),
// so only rank 0's node needs it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
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
#include <ddp/train/device_state.hpp>
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

template <Device D>
int train(Setup& s, Exec<D>& exec) {
  comm::Communicator& comm = *s.comm;
  const int rank = comm.rank(), world = comm.size();
  const nn::ResNetOptions mo{
      .arch = s.arch, .num_classes = s.train_set->num_classes(), .seed = s.seed, .width = s.width};
  const optim::SgdOptions so{.lr = s.learning_rate, .momentum = 0.9, .weight_decay = 1e-5};
  nn::ResNet<float, D> net(mo);
  optim::SGD<float, D> opt(net.parameters(), so);
  // Snapshots are read and written here: net and opt themselves on the CPU, a host copy of them on the GPU.
  auto host = train::state_on<Cpu>(exec, net, opt, mo);
  long start_epoch = 0;
  if (s.resume) {
    const auto bytes = train::read_and_broadcast(comm, s.path, exec);
    if (!bytes.empty()) {
      start_epoch =
          static_cast<long>(train::load_snapshot_bytes<float>(bytes, host.model(), host.optimizer(), s.path).epoch);
      host.push(exec);
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
      const auto images = train::on_device<D>(batch->images.cview(), exec);  // alive until backward returns
      const auto labels = train::on_device<D>(batch->labels.cview(), exec);
      auto logits = model.forward(exec, images.cview());
      const double loss = ce.forward(exec, logits.cview(), labels.cview());
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
      host.pull(exec);
      train::save_snapshot(s.path, host.model(), host.optimizer(), {.epoch = epoch + 1});
    }
    if (s.test_set && rank == 0) {  // evaluation on the unwrapped model: no collective involved
      net.eval();
      data::EvalSampler es(s.test_set->size(), 1, 0);
      data::DataLoader tl(*s.test_set, es, {.batch_size = 256});
      tl.start_epoch(0);
      std::size_t correct = 0;
      while (auto b = tl.next()) {
        const auto images = train::on_device<D>(b->images.cview(), exec);
        const Tensor<float, D> logits = net.forward(exec, images.cview());
        const auto y = train::on_device<Cpu>(logits.cview(), exec);  // (N, classes) on the host
        const float* p = y.cview().data();
        const auto c = y.cview().shape()[1];
        for (std::int64_t i = 0; i < y.cview().shape()[0]; ++i)
          correct += std::max_element(p + i * c, p + (i + 1) * c) - (p + i * c) == b->labels.data()[i];
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
