// DistributedDataParallel: wraps a Module so that every rank trains the same model on its own data (PyTorch DDP).
// SPDX-License-Identifier: MIT
//
//   ddp::parallel::DistributedDataParallel<float, Cpu> model(net, *comm, {.bucket_cap_bytes = 25 << 20});
//   Tensor<float, Cpu> y = model.forward(exec, x.cview());   // broadcasts rank 0's buffers first
//   double loss = ce.forward(exec, y.cview(), labels.cview());
//   model.backward(exec, ce.backward(exec).cview());         // all-reduces buckets while backward runs;
//   opt.step(exec);                                           // grads are the average over ranks here
//   { auto guard = model.no_sync(); ... forward + backward ... }  // accumulate locally, no communication
//
// Semantics (docs/ARCHITECTURE.md D8, PyTorch's):
// - Construction broadcasts every parameter and buffer from rank 0 (one flat broadcast per dtype), so
//   ranks may initialise differently; every rank must construct it (it is collective).
// - forward(): broadcasts the buffers (BatchNorm running statistics, num_batches_tracked) from rank 0
//   when broadcast_buffers is set, then starts a synchronised step unless a no_sync() guard is alive.
// - backward(): the module's backward; each parameter's grad-ready hook fills its bucket and launches
//   the bucket's all-reduce (Avg) as soon as the bucket is complete (bucket_schedule.hpp); when backward
//   returns, finish() waits for every bucket and writes the averaged gradients into grad(), exactly as
//   torch's loss.backward() returns with averaged .grad. Call finish() yourself if you run the module's
//   backward directly.
// - no_sync(): while the guard lives, forward/backward only accumulate gradients locally; the next
//   synchronised backward all-reduces the accumulated sum (divided by world size, as in PyTorch).
// - A parameter without a gradient in a synchronised step is an Error naming it (bucket_schedule.hpp).
// Not thread-safe: one thread drives forward/backward (the backend runs the all-reduces on its own thread).
// Devices: the bucket schedule is the same on both (parallel/bucket_schedule.hpp); the data moves through
// the device's transport (parallel/transport.hpp, parallel/cuda/transport.cuh). CUDA models
// (DistributedDataParallel<float, Cuda>, --backend nccl) need a .cu file that includes <ddp/ddp.hpp>: buckets
// are reduced on a communication stream ordered by events and the compute stream waits for them (no host
// synchronisation in backward); broadcasts are enqueued on the exec's stream (the host waits only for the
// one at construction).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/bucket_schedule.hpp"
#include "ddp/parallel/reducer.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {

struct DdpOptions {
  std::size_t bucket_cap_bytes = kDefaultBucketCapBytes;             // --bucket-cap-mb (25)
  std::size_t first_bucket_cap_bytes = kDefaultFirstBucketCapBytes;  // 1 MiB
  bool broadcast_buffers = true;                                     // rank 0's buffers before every forward
  bool find_unused_parameters = false;  // true: parameters without a gradient contribute zeros
  bool rebuild_buckets = true;          // rebuild buckets in gradient arrival order after the first step
  GradCompression compression = GradCompression::None;  // --grad-compression none|bf16|fp16
};

// Bytes from a --bucket-cap-mb value (fractions allowed: 0.25 = 256 KiB).
inline std::size_t bucket_cap_bytes_from_mb(double mb) {
  if (!(mb > 0.0)) throw ValueError(ddp::detail::str("ddp: --bucket-cap-mb must be > 0, got ", mb));
  return static_cast<std::size_t>(mb * static_cast<double>(kMiB));
}

template <class T, Device D>
class DistributedDataParallel {
 public:
  // RAII guard returned by no_sync(); restores the previous mode when destroyed.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& d) : d_(&d), prev_(d.sync_) { d.sync_ = false; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    ~NoSyncGuard() { d_->sync_ = prev_; }

   private:
    DistributedDataParallel* d_;
    bool prev_;
  };

  // Collective: every rank constructs it with the same model structure. The module and communicator
  // must outlive this object.
  DistributedDataParallel(nn::Module<T, D>& module, comm::Communicator& comm, const DdpOptions& o = {})
      : module_(&module),
        comm_(&comm),
        o_(o),
        reducer_(module.parameters(),
                 ReducerOptions{.bucket_cap_bytes = o.bucket_cap_bytes,
                                .first_bucket_cap_bytes = o.first_bucket_cap_bytes,
                                .compression = o.compression,
                                .find_unused_parameters = o.find_unused_parameters,
                                .rebuild_buckets = o.rebuild_buckets},
                 comm) {
    broadcast_parameters();
    broadcast_buffers();
    module_->set_grad_ready_hook([this](nn::Parameter<T, D>& p) { reducer_.mark_ready(p); });
  }
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;
  ~DistributedDataParallel() { module_->set_grad_ready_hook({}); }

  Tensor<T, D> forward(Exec<D>& exec, TensorView<const T, D> x) {
    if (o_.broadcast_buffers) broadcast_buffers(exec);
    if (sync_) reducer_.prepare_step(step_++, exec);
    return module_->forward(exec, x);
  }

  // The module's backward, then finish(): gradients are averaged over ranks when it returns.
  Tensor<T, D> backward(Exec<D>& exec, TensorView<const T, D> dy) {
    Tensor<T, D> dx = module_->backward(exec, dy);
    finish();
    return dx;
  }

  // Waits for every bucket of the current synchronised step and writes the averages into grad().
  // No-op outside a synchronised step (idempotent).
  void finish() { reducer_.finish(); }

  // [[nodiscard]]: the guard must be kept in a variable for the scope of the accumulation.
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool sync_enabled() const noexcept { return sync_; }

  // Every parameter value from rank 0 (one flat broadcast; the host waits for it).
  void broadcast_parameters() {
    std::vector<std::span<T>> parts;
    for (auto* p : module_->parameters()) parts.push_back(span_of(p->value()));
    reducer_.transport().broadcaster().broadcast(parts, Exec<D>{}, /*host_wait=*/true);
  }

  // Every buffer from rank 0: one broadcast for the real-valued ones, one for the int64 counters. On
  // CUDA they are enqueued on exec's stream (which waits for them) and the host does not wait.
  void broadcast_buffers(const Exec<D>& exec = {}) {
    std::vector<std::span<T>> reals;
    std::vector<std::span<std::int64_t>> counts;
    for (auto* b : module_->buffers()) {
      if (b->is_integer())
        counts.push_back(span_of(b->count()));
      else
        reals.push_back(span_of(b->real()));
    }
    auto& bc = reducer_.transport().broadcaster();
    bc.broadcast(reals, exec, /*host_wait=*/false);
    bc.broadcast(counts, exec, /*host_wait=*/false);
  }

  nn::Module<T, D>& module() noexcept { return *module_; }
  comm::Communicator& communicator() noexcept { return *comm_; }
  const DdpOptions& options() const noexcept { return o_; }
  // The current buckets (parameter indices into module().parameters()).
  const std::vector<BucketLayout>& buckets() const noexcept { return reducer_.layouts(); }
  // Launch times of the last synchronised step's buckets and the end of its backward.
  const StepTrace& last_trace() const noexcept { return reducer_.last_trace(); }
  // Synchronised forwards so far (the step number that errors quote is 0-based).
  std::int64_t steps() const noexcept { return step_; }

 private:
  // A tensor's elements as a span (in D's memory: the broadcaster's parts).
  template <class V>
  static std::span<V> span_of(Tensor<V, D>& t) {
    return std::span<V>(t.data(), static_cast<std::size_t>(t.numel()));
  }

  nn::Module<T, D>* module_;
  comm::Communicator* comm_;
  DdpOptions o_;
  Reducer<T, D> reducer_;
  bool sync_ = true;
  std::int64_t step_ = 0;
};

}  // namespace ddp::parallel
