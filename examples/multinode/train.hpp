// The multinode example's training loop, written once for both devices (main.cpp runs it on the
// CPU, train_cuda.cu on the GPU) and once for every optimizer (train/optim_flags.hpp's
// with_optimizer calls it with the SGD or AdamW that --optimizer chose).
// SPDX-License-Identifier: MIT
//
// Data: 2048 samples (x in [-1,1)^20, y in [-1,1)) drawn from the seed on the host, the same on
// every rank. One step gathers the sampler's batch on the host (x (n, 20), y (n, 1), zero labels
// (n) for cross_entropy), uses it in place on the CPU or uploads it for Cuda (alive until backward
// returns: Linear keeps a view of its input), then DDP forward, the loss (its value read on the
// host), DDP backward, the optional gradient clipping (--clip-grad-norm), this step's learning rate
// (--lr-schedule, --warmup-epochs) and the optimizer step. Snapshots are read and written on the
// host (train/checkpoint.hpp works on host tensors; train/snapshot_io.hpp) through
// train::state_on<Cpu>: the model itself on the CPU, a host copy on the GPU. Resume: rank 0 reads
// the file and broadcasts its bytes (through the GPU for nccl), so only rank 0's node needs it
// (docs/decisions/0010, 0021).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ddp/comm/communicator.hpp>
#include <ddp/core/error.hpp>
#include <ddp/core/str.hpp>
#include <ddp/data/distributed_sampler.hpp>
#include <ddp/nn/linear.hpp>
#include <ddp/nn/loss.hpp>
#include <ddp/optim/optimizer.hpp>
#include <ddp/parallel/ddp.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/train/bookkeeper.hpp>
#include <ddp/train/checkpoint.hpp>
#include <ddp/train/device_state.hpp>
#include <ddp/train/optim_flags.hpp>
#include <ddp/train/snapshot_io.hpp>

namespace multinode_example {

using namespace ddp;
inline constexpr std::int64_t kSamples = 2048, kIn = 20;

// Everything main() decided before choosing the device.
struct Setup {
  long total_epochs = 0;
  long save_every = 1;
  std::size_t batch_size = 32;
  std::string snapshot_path;
  std::string loss = "mse";  // mse | cross_entropy
  std::uint64_t seed = 0;
  double lr = 0.001;        // the schedule's base
  train::OptimFlags optim;  // --optimizer, --weight-decay, --clip-grad-norm, --lr-schedule, ...
  // testing: a lone rank waits here for an elastic launcher to add a node
  long await_join_after_epoch = -1;
  std::string metrics_file;     // rank 0's JSON lines (empty: none)
  std::string tensorboard_dir;  // rank 0's TensorBoard event file, the same records (empty: none)
  train::TraceOptions trace;    // --trace FILE, --trace-steps (train/trace.hpp; path empty: none)
  // the GPU's tensor memory (train_cuda.cu); nullptr on the CPU
  MemoryStats (*device_memory)() = nullptr;
  parallel::DdpOptions ddp;
  comm::Communicator* comm = nullptr;
};

// --await-join-after-epoch (testing elastic membership): the job's only rank stops after this
// epoch's snapshot until its launcher restarts it with more ranks (torchrun stops the worker with
// SIGTERM when a node joins), so a test knows training cannot end before the join; bounded, never a
// hang.
[[noreturn]] inline void await_join(long epoch) {
  using namespace std::chrono_literals;
  std::cout << "Epoch " << epoch << " | waiting for a node to join" << std::endl;
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  throw Error(ddp::detail::str(
      "ddp: --await-join-after-epoch ", epoch,
      ": no node joined within 60 s (the launcher "
      "did not restart this rank with more ranks; it needs torchrun --nnodes=MIN:MAX)"));
}

// The training loop for one optimizer type: optim::SGD or optim::AdamW over net's parameters, or
// (--zero) a parallel::ZeroRedundancyOptimizer over one of them.
template <Device D, class Opt>
int run(const Setup& s, Exec<D>& exec, nn::Linear<float, D>& net, Opt& opt,
        const nn::LinearOptions& mo) {
  comm::Communicator& comm = *s.comm;
  const int rank = comm.rank();

  // Data: the same 2048 samples on every rank.
  Tensor<float, Cpu> xs(Shape{kSamples, kIn}), ys(Shape{kSamples, 1});  // host
  Generator data_gen(s.seed, 0, kStreamData);
  data_gen.fill_uniform(xs.view(), -1.0, 1.0);
  data_gen.fill_uniform(ys.view(), -1.0, 1.0);
  data::DistributedSampler sampler(
      kSamples, {.num_replicas = comm.size(), .rank = rank, .shuffle = true, .seed = s.seed});

  // Resume: rank 0 reads the snapshot (if any) and broadcasts its bytes.
  // fails now, not later
  train::prepare_snapshot_path(s.snapshot_path, "--snapshot_path", comm.rank(), comm.size());
  const long start_epoch = train::resume_snapshot(comm, s.snapshot_path, exec, net, opt, mo).epoch;
  if (start_epoch > 0 && rank == 0)
    std::cout << "Resuming training from snapshot at Epoch " << start_epoch << std::endl;
  parallel::DistributedDataParallel<float, D> model(net, comm, s.ddp);

  nn::MSELoss<float, D> mse;
  nn::CrossEntropyLoss<float, D> ce;
  const std::size_t steps = (sampler.size() + s.batch_size - 1) / s.batch_size;  // per epoch
  const optim::LrSchedule schedule =
      train::lr_schedule(s.optim, s.lr, static_cast<std::int64_t>(steps), s.total_epochs);
  // Timing, --metrics-file, --tensorboard-dir, --trace and the snapshot cadence
  // (train/bookkeeper.hpp). On a terminal rank 0 also redraws one progress line with an ETA; in a
  // log the output stays the tutorial's lines. No data_ms: the batch is copied out of host arrays
  // (tools/plot_metrics.py skips its step-time chart).
  train::Bookkeeper<D> book(comm, exec,
                            {.steps_per_epoch = static_cast<long long>(steps),
                             .first_epoch = start_epoch,
                             .last_epoch = s.total_epochs - 1,
                             .save_every = s.save_every,
                             .progress_lines = false,
                             .data_ms = false,
                             .metrics_file = s.metrics_file,
                             .tensorboard_dir = s.tensorboard_dir,
                             .trace = s.trace,
                             .device_memory = s.device_memory});
  for (long epoch = start_epoch; epoch < s.total_epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    const auto idx = sampler.indices();
    std::cout << "[Rank " << rank << "] Epoch " << epoch << " | Batchsize: " << s.batch_size
              << " | Steps: " << steps << std::endl;
    book.start_epoch(epoch);
    for (std::size_t step = 0; step < steps; ++step) {
      const std::size_t b0 = step * s.batch_size, n = std::min(s.batch_size, idx.size() - b0);
      Tensor<float, Cpu> x(Shape{static_cast<std::int64_t>(n), kIn}),
          y(Shape{static_cast<std::int64_t>(n), 1});
      for (std::size_t k = 0; k < n; ++k) {
        const auto i = idx[b0 + k];
        std::copy_n(xs.data() + i * kIn, kIn, x.data() + k * kIn);
        y.data()[k] = ys.data()[i];
      }
      book.got_batch();
      const auto xd = train::on_device<D>(x.cview(), exec);  // alive until backward returns
      opt.zero_grad();
      auto out = model.forward(exec, xd.cview());
      double loss = 0;
      Tensor<float, D> dout;
      if (s.loss == "mse") {
        const auto yd = train::on_device<D>(y.cview(), exec);
        trace::Span span("loss", "mse");
        loss = mse.forward(exec, out.cview(), yd.cview());
        dout = mse.backward(exec);
      } else {
        const auto labels = Tensor<std::int64_t, Cpu>::zeros(Shape{static_cast<std::int64_t>(n)});
        const auto ld = train::on_device<D>(labels.cview(), exec);
        trace::Span span("loss", "cross-entropy");
        loss = ce.forward(exec, out.cview(), ld.cview());
        dout = ce.backward(exec);
      }
      model.backward(exec, dout.cview());
      double grad_norm = -1.0;  // --clip-grad-norm off
      {
        trace::Span span("optimizer", "optimizer");
        grad_norm = train::clip_gradients(s.optim, exec, net);
        schedule.apply(opt);  // this step's lr, from the optimizer's step count
        opt.step(exec);
      }
      // n: the last batch may be short on every rank alike.
      book.end_step({.loss = loss, .lr = opt.lr(), .samples = n, .grad_norm = grad_norm},
                    model.last_trace());
    }
    book.end_epoch(epoch, [&] {  // collective with --zero (the shards are consolidated on rank 0)
      train::save_snapshot_on_rank0(comm, s.snapshot_path, exec, net, opt,
                                    {.epoch = epoch + 1, .rng = data_gen.state()}, mo);
      if (rank == 0)
        std::cout << "Epoch " << epoch << " | Training snapshot saved at " << s.snapshot_path
                  << std::endl;
      if (epoch == s.await_join_after_epoch && comm.size() == 1) await_join(epoch);
    });
  }
  // a --trace-steps range past the last step is cut here (collective)
  const train::RunTotals t = book.finish();
  if (rank == 0) std::cout << "Training took " << t.seconds << " s" << std::endl;
  return 0;
}

template <Device D>
int train(const Setup& s, Exec<D>& exec) {
  const nn::LinearOptions mo{.in_features = kIn, .out_features = 1};
  nn::Linear<float, D> net(mo);
  Generator init(s.seed, 0, kStreamInit);
  // drawn on the host: the same values on every device
  net.reset_parameters(init);
  // --sync-bn: Linear has no BatchNorm (a warning says so)
  train::sync_batchnorm_if(s.optim, net, *s.comm);
  return train::with_optimizer(s.optim, s.lr, net, *s.comm,
                               [&](auto& opt) { return run(s, exec, net, opt, mo); });
}

}  // namespace multinode_example
