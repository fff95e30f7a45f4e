// SyncBatchNorm: convert_sync_batchnorm(model, comm) makes every BatchNorm2d of a model take its
// training statistics over all ranks of `comm` (torch.nn.SyncBatchNorm.convert_sync_batchnorm).
// SPDX-License-Identifier: MIT
//
//   nn::ResNet<float, Cpu> model({.arch = "resnet18"});
//   nn::convert_sync_batchnorm(model, comm);        // before DistributedDataParallel wraps it
//   parallel::DistributedDataParallel ddp(model, comm, ...);
//
// The layers stay BatchNorm2d objects, sharing one CommChannelSums (docs/decisions/0027). In
// training, forward all-reduces [sum x, sum x^2, count] per channel (2C + 1 doubles) and normalises
// with the global mean and biased variance; running_var takes the unbiased variance of the global
// count. Backward all-reduces [sum dy, sum dy xhat, count] for dx; dgamma and dbeta stay this
// rank's sums, as torch's, so DDP's averaging gives the gradient of the mean loss over the
// concatenated batch when the ranks' batches are equal. Batches may differ in size or be empty
// (torch >= 1.12); fewer than 2 values per channel over all ranks is a ValueError naming the layer
// on every rank. Eval, and a communicator of one rank, communicate nothing (torch's need_sync).
// The statistics live where the model does, so `comm` must reach that memory (host: tcp/mpi; CUDA:
// nccl, or tcp/mpi made with CommOptions::cuda_device), as DDP's must. On CUDA the all-reduces are
// ordered on the exec's stream (the host waits only when a rank's batch has fewer than 2 rows, to
// check the total); on the host they are waited for at once. Contract: every rank calls the
// synchronised layers in the same order (each forward and backward is a collective on `comm`,
// interleaved with DDP's); `comm` outlives the model's layers.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <utility>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/nn/batchnorm2d.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::nn {

// The kernels' ChannelSumReducer over a communicator: one all-reduce (Sum) per call.
template <Device D>
class CommChannelSums final : public kernels::ChannelSumReducer<D> {
 public:
  // `comm` must outlive this object; ConfigError unless it reaches D's memory.
  explicit CommChannelSums(comm::Communicator& comm) : comm_(&comm) {
    const comm::MemoryKind want = D::host_memory ? comm::MemoryKind::Cpu : comm::MemoryKind::Cuda;
    if (comm.memory() != want)
      throw ConfigError(ddp::detail::str(
          "ddp: SyncBatchNorm on ", D::name, " needs a communicator on ", comm::memory_name(want),
          "; the '", comm.backend(), "' communicator works on ", comm::memory_name(comm.memory()),
          D::host_memory
              ? " (use --backend gloo or mpi for a CPU model)"
              : " (use --backend nccl, or tcp/gloo/mpi made with CommOptions::cuda_device)"));
  }
  CommChannelSums(const CommChannelSums&) = delete;
  CommChannelSums& operator=(const CommChannelSums&) = delete;
  ~CommChannelSums() override {
    for (comm::Work& w : pending_) {
      try {
        w.wait();  // bounded by the communicator's timeout
      } catch (...) {
      }
    }
  }

  int ranks() const noexcept override { return comm_->size(); }

  void all_reduce_sum(const Exec<D>& exec, TensorView<double, D> sums) override {
    retire_completed();
    comm::Work w = comm_->all_reduce(sums, {.op = comm::ReduceOp::Sum, .stream = stream_of(exec)});
    if (comm_->memory() == comm::MemoryKind::Cpu)
      w.wait();  // the kernel reads the sums next, on the host
    else
      // stream-ordered; its errors surface at a later call or here
      pending_.push_back(std::move(w));
  }

 private:
  // Raises the errors of the stream-ordered all-reduces that have finished; never blocks.
  void retire_completed() {
    while (!pending_.empty() && pending_.front().is_completed()) {
      comm::Work w = std::move(pending_.front());
      pending_.pop_front();
      w.wait();
    }
  }

  comm::Communicator* comm_;
  std::deque<comm::Work> pending_;
};

// Makes every BatchNorm2d in `model` (itself included) synchronised over `comm`; returns how many.
// Call it on every rank; ConfigError when `comm` cannot reach the model's memory.
template <class T, Device D>
std::size_t convert_sync_batchnorm(Module<T, D>& model, comm::Communicator& comm) {
  auto sync = std::make_shared<CommChannelSums<D>>(comm);
  std::size_t n = 0;
  model.visit([&](Module<T, D>& m) {
    if (auto* bn = dynamic_cast<BatchNorm2d<T, D>*>(&m)) {
      bn->set_sync(sync);
      ++n;
    }
  });
  return n;
}

}  // namespace ddp::nn
