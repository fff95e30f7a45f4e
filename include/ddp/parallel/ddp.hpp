// DistributedDataParallel: wraps a Module so that every rank trains the same model on its own data (PyTorch DDP).
// SPDX-License-Identifier: MIT
//
//   ddp::parallel::DistributedDataParallel<float, Cpu> model(net, *comm, {.bucket_cap_bytes = 25 << 20});
//   Tensor<float, Cpu> y = model.forward(exec, x.cview());   // broadcasts rank 0's buffers first
//   double loss = ce.forward(exec, y.cview(), labels.cview());
//   model.backward(exec, ce.backward(exec).cview());         // all-reduces buckets while backward runs;
//   opt.step(exec);                                           // grads are the average over ranks here
//   { auto guard = model.no_sync(); ... forward + backward ... }  // accumulate locally, no communication
//   { auto guard = model.no_grad(); ... forward only ... }         // evaluation: no step, no buffer sync after
//
// Semantics (docs/ARCHITECTURE.md D8, PyTorch's):
// - Construction broadcasts every parameter and buffer from rank 0 (one flat broadcast per dtype), so
//   ranks may initialise differently; every rank must construct it (it is collective).
// - Construction also checks that every rank has the same parameter shapes in the same order; a mismatch is
//   a ValueError on every rank naming the first differing rank and parameter (torch's
//   _verify_params_across_processes).
// - forward(): broadcasts the buffers (BatchNorm running statistics, num_batches_tracked) from rank 0 when
//   broadcast_buffers is set AND the previous forward was a synchronised one with gradients (the first forward
//   counts as such) -- torch's require_forward_param_sync rule: buffers follow rank 0 at each synchronised step,
//   not inside no_sync() accumulation or after inference; then it starts a synchronised step unless a
//   no_sync() or no_grad() guard is alive.
// - no_grad(): torch.no_grad() for this wrapper: forwards under it do not start a synchronised step (no
//   backward follows, e.g. evaluation) and count as gradient-free for the buffer rule.
// - backward(): the module's backward; each parameter's grad-ready hook fills its bucket and launches
//   the bucket's all-reduce (Avg) as soon as the bucket is complete (bucket_schedule.hpp); when backward
//   returns, finish() waits for every bucket and writes the averaged gradients into grad(), exactly as
//   torch's loss.backward() returns with averaged .grad. Call finish() yourself if you run the module's
//   backward directly.
// - no_sync(): while the guard lives, forward/backward only accumulate gradients locally; the next
//   synchronised backward all-reduces the accumulated sum (divided by world size, as in PyTorch).
// - A parameter without a gradient in a synchronised step is an Error naming it, unless find_unused_parameters
//   (then torch >= 2.0's rules, bucket_schedule.hpp, docs/ARCHITECTURE.md D25).
// - register_comm_hook(hook): what a full bucket's gradients go through (parallel/comm_hooks.hpp; CPU models).
// Not thread-safe: one thread drives forward/backward (the backend runs the all-reduces on its own thread).
// Devices: the bucket schedule is the same on both (parallel/bucket_schedule.hpp); the data moves through
// the device's transport (parallel/transport.hpp, parallel/cuda/transport.cuh). CUDA models
// (DistributedDataParallel<float, Cuda>, --backend nccl) need a .cu file that includes <ddp/ddp.hpp>: buckets
// are reduced on a communication stream ordered by events and the compute stream waits for them (no host
// synchronisation in backward); broadcasts are enqueued on the exec's stream (the host waits only for the
// one at construction).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
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
#include "ddp/parallel/comm_hooks.hpp"
#include "ddp/parallel/reducer.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {

struct DdpOptions {
  std::size_t bucket_cap_bytes = kDefaultBucketCapBytes;             // --bucket-cap-mb (25)
  std::size_t first_bucket_cap_bytes = kDefaultFirstBucketCapBytes;  // 1 MiB
  bool broadcast_buffers = true;        // rank 0's buffers before a forward that follows a synchronised one
  bool find_unused_parameters = false;  // true: parameters without a gradient are allowed (bucket_schedule.hpp)
  bool rebuild_buckets = true;          // rebuild buckets in gradient arrival order after the first step
  CommHookKind comm_hook = CommHookKind::Allreduce;  // --comm-hook allreduce|fp16|bf16|powersgd (register_comm_hook: any)
  PowerSgdOptions powersgd;  // comm_hook == PowerSgd: --powersgd-rank, --powersgd-start-iter (parallel/powersgd.hpp)
};

// Bytes from a --bucket-cap-mb value (fractions allowed: 0.25 = 256 KiB).
inline std::size_t bucket_cap_bytes_from_mb(double mb) {
  if (!(mb > 0.0)) throw ValueError(ddp::detail::str("ddp: --bucket-cap-mb must be > 0, got ", mb));
  return static_cast<std::size_t>(mb * static_cast<double>(kMiB));
}

template <class T, Device D>
class DistributedDataParallel {
 public:
  // RAII guard returned by no_sync() and no_grad(): clears one of the two mode flags and restores its previous
  // value when destroyed.
  class ModeGuard {
   public:
    explicit ModeGuard(bool& flag) : flag_(&flag), prev_(flag) { flag = false; }
    ModeGuard(const ModeGuard&) = delete;
    ModeGuard& operator=(const ModeGuard&) = delete;
    ~ModeGuard() { *flag_ = prev_; }

   private:
    bool* flag_;  // a mode flag of the DistributedDataParallel that made the guard
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
                                .comm_hook = o.comm_hook,
                                .powersgd = o.powersgd,
                                .find_unused_parameters = o.find_unused_parameters,
                                .rebuild_buckets = o.rebuild_buckets},
                 comm) {
    verify_shapes_across_ranks();
    broadcast_parameters();
    broadcast_buffers();
    module_->set_grad_ready_hook([this](nn::Parameter<T, D>& p) { reducer_.mark_ready(p); });
  }
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;
  ~DistributedDataParallel() { module_->set_grad_ready_hook({}); }

  Tensor<T, D> forward(Exec<D>& exec, TensorView<const T, D> x) {
    if (o_.broadcast_buffers && buffers_follow_) broadcast_buffers(exec);
    const bool synchronised = sync_ && grad_;
    buffers_follow_ = synchronised;  // torch: require_forward_param_sync
    if (synchronised) reducer_.prepare_step(step_++, exec);
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
  [[nodiscard]] ModeGuard no_sync() { return ModeGuard(sync_); }
  bool sync_enabled() const noexcept { return sync_; }
  // Inference forwards (evaluation): no synchronised step starts, and buffers are not broadcast before the
  // next forward (torch.no_grad()). Keep the guard in a variable.
  [[nodiscard]] ModeGuard no_grad() { return ModeGuard(grad_); }

  // Replaces what a full bucket goes through (parallel/comm_hooks.hpp), e.g. parallel::fp16_compress_hook<float>()
  // or your own; call it between steps, on every rank. CUDA models take only the default (ValueError).
  void register_comm_hook(CommHook<T> hook) { reducer_.transport().set_comm_hook(std::move(hook)); }

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
  // Every rank has rank 0's number of parameters and shapes, in the same order; else a ValueError on every rank
  // naming the first rank that differs and, where known, the parameter. Collective (small host messages).
  void verify_shapes_across_ranks() {
    const int world = comm_->size();
    if (world == 1) return;
    auto& tr = reducer_.transport();
    const auto params = module_->parameters();
    std::vector<std::int64_t> dims;  // per parameter: its rank, then its torch shape
    for (auto* p : params) {
      const Shape s = p->torch_shape();
      dims.push_back(s.rank());
      dims.insert(dims.end(), s.begin(), s.end());
    }
    // 1. The counts, so that the shape lists have one length everywhere before they are compared.
    std::vector<std::int64_t> head{static_cast<std::int64_t>(params.size()), static_cast<std::int64_t>(dims.size())};
    std::vector<std::int64_t> mine = head;
    tr.broadcaster().broadcast_host(std::span<std::int64_t>(head), Exec<D>{});
    std::vector<std::int64_t> bad(static_cast<std::size_t>(world), 0);  // per rank: 0 fine, 1 + parameter index,
    const int me = comm_->rank();                                         // or kCountMismatch
    if (mine != head) bad[static_cast<std::size_t>(me)] = kCountMismatch;
    tr.any_rank(std::span<std::int64_t>(bad));
    raise_shape_mismatch(bad, params, head[0]);
    // 2. The shapes.
    std::vector<std::int64_t> ref = dims;
    tr.broadcaster().broadcast_host(std::span<std::int64_t>(ref), Exec<D>{});
    std::size_t at = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(dims[at]) + 1;
      if (!std::equal(dims.begin() + static_cast<std::ptrdiff_t>(at), dims.begin() + static_cast<std::ptrdiff_t>(at + n),
                      ref.begin() + static_cast<std::ptrdiff_t>(at))) {
        bad[static_cast<std::size_t>(me)] = static_cast<std::int64_t>(i) + 1;
        break;
      }
      at += n;
    }
    tr.any_rank(std::span<std::int64_t>(bad));
    raise_shape_mismatch(bad, params, head[0]);
  }

  void raise_shape_mismatch(const std::vector<std::int64_t>& bad, const std::vector<nn::Parameter<T, D>*>& params,
                            std::int64_t rank0_count) {
    for (std::size_t r = 0; r < bad.size(); ++r) {
      if (bad[r] == 0) continue;
      std::string what;
      if (bad[r] == kCountMismatch) {
        what = ddp::detail::str("rank ", r, " has a different number of parameters or dimensions than rank 0 (rank 0: ",
                                rank0_count, " parameters; this rank, ", comm_->rank(), ": ", params.size(), ")");
      } else {
        const auto* p = params[static_cast<std::size_t>(bad[r] - 1)];
        what = ddp::detail::str("rank ", r, " differs from rank 0 at parameter #", bad[r] - 1, " (here on rank ",
                                comm_->rank(), ": '", p->name(), "' ", p->torch_shape().to_string(), ")");
      }
      throw ValueError(ddp::detail::str(
          "ddp: DistributedDataParallel needs the same model on every rank: ", what,
          ". Build the same architecture (same options) on every rank before wrapping it"));
    }
  }

  static constexpr std::int64_t kCountMismatch = std::numeric_limits<std::int64_t>::max();

  Reducer<T, D> reducer_;
  bool sync_ = true;            // false inside no_sync()
  bool grad_ = true;            // false inside no_grad()
  bool buffers_follow_ = true;  // the next forward broadcasts the buffers (the last one was synchronised)
  std::int64_t step_ = 0;
};

}  // namespace ddp::parallel
