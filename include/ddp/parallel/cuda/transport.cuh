// DDP's data movement on the GPU: Broadcaster<Cuda> and Transport<T, Cuda> (device buckets, a
// communication stream ordered by events, no host synchronisation inside backward). Compiled only
// by nvcc.
// SPDX-License-Identifier: MIT
//
// Transport<T, Cuda>, per bucket b (the Reducer drives it, parallel/reducer.hpp):
//   begin_step(exec)  remembers exec (the compute stream backward runs on); waits for the previous
//                     step's collectives (by then long complete) so that a failed one is raised
//   launch(b)         enqueues, without blocking the host:
//                       ready[b].record(compute); ready[b].wait(comm stream)
//                       copies grad -> flat on the comm stream (a memset without a gradient)
//                       the hook on flat, on the comm stream (parallel/grad_bucket.hpp): by default
//                       the all-reduce (Avg); fp16/bf16 compression and PowerSGD are hooks too
//   finish(b, keep)   after backward: the hook's `then` (enqueued on the comm stream), copies
//                     flat -> grad (not for keep[i], a parameter no rank used), done[b].record(comm
//                     stream), compute waits for done[b]: the optimizer step, enqueued next on the
//                     compute stream, sees averaged gradients. The host never waits here.
// gradient_as_bucket_view (parallel/grad_views.hpp): the gradients are the slots of flat, so
// neither copy runs (only the memset for parameters without a gradient). Backward keeps running on
// the compute stream while buckets are reduced (the grads of a launched bucket are not written
// again in the same backward): the overlap DDP exists for. Requirements: a communicator on device
// memory (memory() == MemoryKind::Cuda: --backend nccl, or tcp/gloo and mpi made with
// CommOptions::cuda_device, which stage through pinned host memory, docs/decisions/0023), all
// gradients in device memory. The hook's Works and those it defers are waited for at the next
// begin_step. The bucket order rebuilt after the first step is broadcast through a small device
// buffer (one host wait). The stream travels with each call, never kept in the communicator, so the
// communicator outlives this transport and its streams safely (docs/decisions/0016). Memory: nccl
// declares every buffer it hands to NCCL to the caching allocator (cuda_record_stream), so a flat
// buffer freed by a rebuild is reused only after NCCL has finished with it; a staged backend
// touches device memory only on the caller's stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cuda/kernels.cuh"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/comm_hooks.hpp"
#include "ddp/parallel/cuda/powersgd.cuh"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/parallel/powersgd.hpp"
#include "ddp/parallel/transport.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/copy.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {

namespace detail {
// `comm` itself, or a ConfigError saying which backend to use when it cannot reach device memory.
inline comm::Communicator& on_device_memory(comm::Communicator& comm) {
  if (comm.memory() != comm::MemoryKind::Cuda)
    throw ConfigError(ddp::detail::str(
        "ddp: DistributedDataParallel on CUDA needs a communicator whose collectives run on "
        "CUDA streams (--backend nccl, or tcp/gloo/mpi made with CommOptions::cuda_device); the '",
        comm.backend(), "' communicator works on host memory"));
  return comm;
}
}  // namespace detail

template <>
class Broadcaster<Cuda> {
 public:
  // `comm` must outlive this object; ConfigError unless its collectives run on CUDA streams.
  explicit Broadcaster(comm::Communicator& comm) : comm_(&detail::on_device_memory(comm)) {}
  Broadcaster(const Broadcaster&) = delete;
  Broadcaster& operator=(const Broadcaster&) = delete;
  ~Broadcaster() { drain(); }

  // Rank `root`'s values (0 but for DDP's join, docs/decisions/0030) of `parts` (device memory) on
  // every rank: one flat broadcast ordered after exec's stream, with exec's stream waiting for it.
  // host_wait also blocks the host until it is done; otherwise retire() (the next synchronised
  // step) raises its errors.
  template <comm::CommElement V>
  void broadcast(const std::vector<std::span<V>>& parts, const Exec<Cuda>& exec, bool host_wait,
                 int root = 0) {
    if (comm_->size() == 1 || parts.empty()) return;
    std::int64_t total = 0;
    for (const auto& p : parts) total += static_cast<std::int64_t>(p.size());
    Tensor<V, Cuda> flat(Shape{total});  // freed in stream order (see the file comment)
    const cudaStream_t s = cuda_stream(exec);
    std::size_t off = 0;
    for (const auto& p : parts) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(flat.data() + off, p.data(), p.size_bytes(),
                                     cudaMemcpyDeviceToDevice, s));
      off += p.size();
    }
    comm::Work w = broadcast_on(s, std::span<V>(flat.data(), off), root);
    off = 0;
    for (const auto& p : parts) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(p.data(), flat.data() + off, p.size_bytes(),
                                     cudaMemcpyDeviceToDevice, s));
      off += p.size();
    }
    if (host_wait) {
      w.wait();
      synchronize(exec);
    } else {
      pending_.push_back(std::move(w));
    }
  }
  // Rank `root`'s values of host memory on every rank, staged through a device buffer (NCCL moves
  // device memory only); the host waits.
  template <comm::CommElement V>
  void broadcast_host(std::span<V> values, const Exec<Cuda>& exec, int root = 0) {
    if (comm_->size() == 1 || values.empty()) return;
    Tensor<V, Cuda> dev = to<Cuda>(
        TensorView<const V, Cpu>(values.data(), Shape{static_cast<std::int64_t>(values.size())}),
        exec);
    broadcast<V>({std::span<V>(dev.data(), values.size())}, exec, /*host_wait=*/true, root);
    // waits for exec's stream
    copy(dev.cview(), TensorView<V, Cpu>(values.data(), dev.shape()), exec);
  }

  // Waits for the broadcasts issued without a host wait (complete by now in a healthy job); raises
  // the first error.
  void retire() {
    std::vector<comm::Work> works = std::exchange(pending_, {});
    for (comm::Work& w : works) w.wait();
  }
  void drain() noexcept { comm::wait_all_noexcept(pending_); }

 private:
  // Stream-ordered: the broadcast waits for s's earlier work, s's later work waits for the
  // broadcast.
  template <class V>
  comm::Work broadcast_on(cudaStream_t s, std::span<V> flat, int root) {
    return comm_->broadcast(
        TensorView<V, Cuda>(flat.data(), Shape{static_cast<std::int64_t>(flat.size())}),
        {.root = root, .stream = s});
  }

  comm::Communicator* comm_;
  std::vector<comm::Work> pending_;  // broadcasts issued without a host wait
};

template <class T>
class Transport<T, Cuda> {
 public:
  // `comm` and the parameters must outlive this object.
  Transport(const std::vector<nn::Parameter<T, Cuda>*>& params, const DdpOptions& o,
            comm::Communicator& comm)
      : params_(params),
        bcast_(comm),
        comm_(&comm),
        hook_(make_comm_hook<T, Cuda>(o.comm_hook, o.powersgd)),
        view_(o.grads_in_buckets<Cuda>()) {}
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  // The parameters outlive us: with gradient_as_bucket_view their gradients move back into memory
  // of their own (copied on the compute stream, before the buckets are freed in stream order).
  ~Transport() {
    drain();
    if (view_) own_grads(params_, compute_);
  }

  // Replaces the communication hook (parallel/grad_bucket.hpp); waits for what is in flight.
  void set_comm_hook(CommHook<T, Cuda> hook) {
    detail::require_hook(hook);
    drain();
    hook_ = std::move(hook);
  }

  void build(const std::vector<BucketLayout>& layouts) {
    // raised at begin_step
    for (Bucket& bk : buckets_) retired_.push_back(std::exchange(bk.work, comm::Work()));
    std::vector<Bucket> fresh(layouts.size());
    std::vector<T*> flats;
    for (std::size_t b = 0; b < layouts.size(); ++b) {
      fresh[b].flat = Tensor<T, Cuda>(Shape{layouts[b].numel});
      for (std::size_t i : layouts[b].params) fresh[b].shapes.push_back(params_[i]->torch_shape());
      flats.push_back(fresh[b].flat.data());
    }
    // on the compute stream, before the old buffers are freed
    if (view_) view_grads_in_buckets(params_, layouts, flats, compute_);
    layouts_ = layouts;
    // old flat buffers are freed in stream order (see the file comment)
    buckets_ = std::move(fresh);
  }

  void begin_step(const Exec<Cuda>& exec) {
    retire();  // raises the previous step's collective errors, if any
    compute_ = exec;
  }

  void launch(std::size_t b, const std::vector<bool>& zero) {
    Bucket& bk = buckets_[b];
    const BucketLayout& l = layouts_[b];
    const Exec<Cuda> comm_exec = comm_stream_.exec();
    const cudaStream_t cs = comm_stream_.get();
    bk.ready.record(compute_);
    bk.ready.wait(comm_exec);
    for (std::size_t k = 0; k < l.params.size(); ++k) {
      const std::size_t i = l.params[k];
      T* dst = bk.flat.data() + l.offsets[k];
      const std::size_t bytes = params_[i]->grad().bytes();
      if (zero[i])
        DDP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cs));
      else if (!view_)  // gradient_as_bucket_view: the gradient is the slot
        DDP_CUDA_CHECK(
            cudaMemcpyAsync(dst, params_[i]->grad().data(), bytes, cudaMemcpyDeviceToDevice, cs));
    }
    GradBucket<T, Cuda> gb{
        .index = b,
        .buffer = std::span<T>(bk.flat.data(), static_cast<std::size_t>(l.numel)),
        .layout = &l,
        .comm = comm_,
        .is_last = b + 1 == layouts_.size(),
        .shapes = bk.shapes,
        .exec = comm_exec,
        .defer = defer_};
    HookResult r = hook_(gb);
    bk.work = std::move(r.work);
    bk.then = std::move(r.then);
  }

  // The copies back into grad() are enqueued here, after backward, because only now is it known
  // which parameters no rank used (keep[i]: left untouched); the comm stream runs them after the
  // hook's work and the compute stream, where the optimizer runs next, waits for them. The host
  // does not wait.
  void finish(std::size_t b, const std::vector<bool>& keep) {
    Bucket& bk = buckets_[b];
    const BucketLayout& l = layouts_[b];
    const cudaStream_t cs = comm_stream_.get();
    if (std::function<void()> then = std::exchange(bk.then, {})) then();
    for (std::size_t k = 0; k < l.params.size() && !view_; ++k) {
      if (keep[l.params[k]]) continue;
      auto& g = params_[l.params[k]]->grad();
      DDP_CUDA_CHECK(cudaMemcpyAsync(g.data(), bk.flat.data() + l.offsets[k], g.bytes(),
                                     cudaMemcpyDeviceToDevice, cs));
    }
    bk.done.record(comm_stream_.exec());
    bk.done.wait(compute_);
  }

  void drain() noexcept {
    for (Bucket& bk : buckets_) {
      retired_.push_back(std::exchange(bk.work, comm::Work()));
      bk.then = {};
    }
    comm::wait_all_noexcept(retired_);
    bcast_.drain();
  }

  void broadcast_order(std::span<std::int64_t> order) { bcast_.broadcast_host(order, compute_); }
  // Element-wise max over ranks of host flags, staged through the device on the compute stream; the
  // host waits.
  void any_rank(std::span<std::int64_t> flags) {
    if (comm_->size() == 1 || flags.empty()) return;
    Tensor<std::int64_t, Cuda> dev =
        to<Cuda>(TensorView<const std::int64_t, Cpu>(
                     flags.data(), Shape{static_cast<std::int64_t>(flags.size())}),
                 compute_);
    comm_->all_reduce(dev.view(), {.op = comm::ReduceOp::Max, .stream = cuda_stream(compute_)})
        .wait();
    // waits for the stream
    copy(dev.cview(), TensorView<std::int64_t, Cpu>(flags.data(), dev.shape()), compute_);
  }

  // Parameter and buffer broadcasts of DistributedDataParallel.
  Broadcaster<Cuda>& broadcaster() noexcept { return bcast_; }
  // The stream the buckets are copied and reduced on (tests and benchmarks time it).
  const Stream& comm_stream() const noexcept { return comm_stream_; }

 private:
  struct Bucket {
    Tensor<T, Cuda> flat;       // gradients back to back, bucket order (device)
    std::vector<Shape> shapes;  // each parameter's torch shape, bucket order (GradBucket::shapes)
    Event ready, done;
    comm::Work work;             // the hook's, retired at the next begin_step
    std::function<void()> then;  // the hook's, run at finish
  };

  // Waits for the previous step's collectives (complete by now in a healthy job) and raises the
  // first error.
  void retire() {
    std::vector<comm::Work> works = std::exchange(retired_, {});
    for (Bucket& bk : buckets_) works.push_back(std::exchange(bk.work, comm::Work()));
    for (comm::Work& w : works) w.wait();
    bcast_.retire();
  }

  std::vector<nn::Parameter<T, Cuda>*> params_;
  Broadcaster<Cuda> bcast_;
  comm::Communicator* comm_;
  CommHook<T, Cuda> hook_;
  bool view_;           // gradient_as_bucket_view (parallel/grad_views.hpp)
  Stream comm_stream_;  // blocking (cudaStreamDefault): orders with the legacy default stream
  Exec<Cuda> compute_{};
  std::vector<BucketLayout> layouts_;
  std::vector<Bucket> buckets_;
  // Works of replaced buckets, of drained steps and those hooks deferred, not yet waited
  std::vector<comm::Work> retired_;
  std::function<void(comm::Work)> defer_ = [this](comm::Work w) {
    retired_.push_back(std::move(w));
  };
};

}  // namespace ddp::parallel
