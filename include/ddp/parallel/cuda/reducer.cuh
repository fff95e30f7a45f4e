// Reducer<T, Cuda>: DistributedDataParallel's gradient all-reduce on the GPU: device buckets, a communication
// stream ordered by events, no host synchronisation inside backward.
// SPDX-License-Identifier: MIT
//
// How it works, per synchronised step (the CPU reducer's protocol, parallel/reducer.hpp, with streams):
//   prepare_step(step, exec)  remembers exec (the compute stream backward runs on); waits for the previous
//                             step's Works (by then long complete) so that a failed collective is raised
//   mark_ready(p)             (grad-ready hook) counts p in its bucket; when the bucket is complete and every
//                             earlier bucket has launched, launch(b) enqueues, without blocking the host:
//       ready[b].record(compute)             the bucket's gradients are written when compute gets here
//       ready[b].wait(comm)                  the comm stream waits for that point
//       copies grad -> flat (comm stream)    cudaMemcpyAsync device to device, bucket order
//       device_all_reduce(flat, Avg)         NCCL's stream waits for the comm stream, runs the all-reduce
//       nccl_done[b] on NCCL's stream, waited by the comm stream
//       copies flat -> grad (comm stream), done[b].record(comm)
//   finish()                  unused parameters (find_unused_parameters) get zeros in their slots; then
//                             compute waits for every done[b]: the optimizer step, enqueued next on the
//                             compute stream, sees averaged gradients. The host never waits here.
// Backward keeps running on the compute stream while buckets are reduced (the grads of a launched bucket
// are not written again in the same backward), which is the overlap DDP exists for.
// Requirements: a StreamOrdered communicator (comm/stream_ordered.hpp: --backend nccl), all gradients in
// device memory, no gradient compression (ValueError otherwise). Buckets are rebuilt in arrival order after
// the first step as on the CPU (rank 0's order broadcast through a small device buffer; one host wait).
// Memory: flat buffers are freed on the legacy default stream (tensor/cuda/allocator.hpp), which orders
// after the blocking comm stream, which itself waited for NCCL: no buffer is reused while NCCL reads it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/stream_ordered.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/reducer.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/copy.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::parallel {

template <class T>
class Reducer<T, Cuda> {
 public:
  Reducer(std::vector<nn::Parameter<T, Cuda>*> params, comm::Communicator& comm, const ReducerOptions& o)
      : params_(std::move(params)), comm_(&comm), so_(dynamic_cast<comm::StreamOrdered*>(&comm)), o_(o) {
    if (!so_)
      throw ConfigError(
          ddp::detail::str("ddp: DistributedDataParallel on CUDA needs a backend whose collectives run on "
                           "CUDA streams (--backend nccl); the '",
                           comm.backend(), "' backend works on host memory"));
    if (o.compression != GradCompression::None)
      throw ValueError(
          "ddp: --grad-compression bf16/fp16 is not supported for CUDA models in this version; use "
          "--grad-compression none (NCCL reduces float32 buckets)");
    for (std::size_t i = 0; i < params_.size(); ++i) index_[params_[i]] = i;
    build(reverse_order(params_.size()));
  }
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;
  ~Reducer() { drain(); }

  void build(const std::vector<std::size_t>& order) {
    std::vector<std::int64_t> numel(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) numel[i] = params_[i]->numel();
    layouts_ = assign_buckets(order, numel, sizeof(T), o_.bucket_cap_bytes, o_.first_bucket_cap_bytes);
    buckets_.clear();
    buckets_.reserve(layouts_.size());
    where_.assign(params_.size(), {0, 0});
    for (std::size_t b = 0; b < layouts_.size(); ++b) {
      buckets_.emplace_back();
      buckets_.back().flat = Tensor<T, Cuda>(Shape{layouts_[b].numel});
      for (std::size_t k = 0; k < layouts_[b].params.size(); ++k) where_[layouts_[b].params[k]] = {b, k};
    }
  }

  const std::vector<BucketLayout>& layouts() const noexcept { return layouts_; }
  const StepTrace& last_trace() const noexcept { return trace_; }
  bool active() const noexcept { return active_; }
  // The stream the buckets are copied and reduced on (tests and benchmarks time it).
  const Stream& comm_stream() const noexcept { return comm_stream_; }

  void prepare_step(std::int64_t step, const Exec<Cuda>& exec) {
    retire();  // raises the previous step's collective errors, if any
    compute_ = exec;
    ready_.assign(params_.size(), false);
    zeroed_.assign(params_.size(), false);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].pending = layouts_[b].params.size();
      buckets_[b].launched = false;
    }
    next_launch_ = 0;
    arrival_.clear();
    trace_ =
        StepTrace{.step = step, .backward_start = Clock::now(), .last_gradient = {}, .backward_end = {}, .buckets = {}};
    step_ = step;
    active_ = true;
  }

  void mark_ready(nn::Parameter<T, Cuda>& p) {
    if (!active_) return;
    auto it = index_.find(&p);
    if (it == index_.end()) return;
    const std::size_t i = it->second;
    if (ready_[i])
      throw Error(ddp::detail::str("ddp: parameter '", p.name(), "' reported its gradient twice in step ", step_,
                                   "; DDP supports one backward per synchronised forward (use no_sync() for "
                                   "accumulation)"));
    ready_[i] = true;
    arrival_.push_back(i);
    trace_.last_gradient = Clock::now();
    if (--buckets_[where_[i].first].pending == 0) launch_ready();
  }

  void finish() {
    if (!active_) return;
    active_ = false;
    trace_.backward_end = Clock::now();
    std::vector<std::size_t> missing;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) missing.push_back(i);
    if (!missing.empty() && !o_.find_unused_parameters) {
      std::vector<std::string> names;
      for (std::size_t i : missing) names.push_back(ddp::detail::quoted(params_[i]->name()));
      throw Error(ddp::detail::str(
          "ddp: parameter '", params_[missing.front()]->name(), "' received no gradient in step ", step_, " (",
          missing.size(), " parameter(s) without a gradient: ", ddp::detail::join(names, ", "),
          "); DistributedDataParallel all-reduces every parameter in every synchronised step, so each one must "
          "take part in the loss. Use it in forward, remove it from the model, or set "
          ".find_unused_parameters = true (--find-unused-parameters)"));
    }
    for (std::size_t i : missing) {  // find_unused_parameters: contribute zeros
      ready_[i] = true;
      zeroed_[i] = true;
      if (--buckets_[where_[i].first].pending == 0) launch_ready();
    }
    for (Bucket& bk : buckets_) bk.done.wait(compute_);  // the optimizer, next on compute, sees the averages
    ++synced_steps_;
    if (synced_steps_ == 1 && o_.rebuild_buckets && !rebuilt_) rebuild_from_arrival(missing);
  }

  std::int64_t synced_steps() const noexcept { return synced_steps_; }

  // Rank 0's values of `parts` (device pointers and element counts, all of type V) on every rank: one
  // flat broadcast ordered after e's stream, with e's stream waiting for it; host_wait also blocks the
  // host until it is done (construction). The other ranks' values are overwritten.
  template <class V>
  void broadcast(const std::vector<std::pair<V*, std::int64_t>>& parts, const Exec<Cuda>& e, bool host_wait) {
    if (comm_->size() == 1 || parts.empty()) return;
    std::int64_t total = 0;
    for (const auto& [ptr, n] : parts) total += n;
    Tensor<V, Cuda> flat(Shape{total});
    const cudaStream_t s = cuda_stream(e);
    std::int64_t off = 0;
    for (const auto& [ptr, n] : parts) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(flat.data() + off, ptr, static_cast<std::size_t>(n) * sizeof(V),
                                     cudaMemcpyDeviceToDevice, s));
      off += n;
    }
    so_->set_caller_stream_handle(s);
    comm::Work w = so_->device_broadcast(
        comm::Buffer::of(std::span<V>(flat.data(), static_cast<std::size_t>(total)), comm::MemoryKind::Cuda),
        {.root = 0});
    Event finished;
    DDP_CUDA_CHECK(cudaEventRecord(finished.get(), static_cast<cudaStream_t>(so_->op_stream_handle())));
    finished.wait(e);
    off = 0;
    for (const auto& [ptr, n] : parts) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(ptr, flat.data() + off, static_cast<std::size_t>(n) * sizeof(V),
                                     cudaMemcpyDeviceToDevice, s));
      off += n;
    }
    if (host_wait) {
      w.wait();
      synchronize(e);
    } else {
      side_works_.push_back(std::move(w));
    }
  }

 private:
  struct Bucket {
    Tensor<T, Cuda> flat;  // gradients back to back, bucket order (device)
    Event ready, nccl_done, done;
    std::size_t pending = 0;
    bool launched = false;
    comm::Work work;
  };

  void launch_ready() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
  }

  void launch(std::size_t b) {
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
      if (zeroed_[i])
        DDP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cs));
      else
        DDP_CUDA_CHECK(cudaMemcpyAsync(dst, params_[i]->grad().data(), bytes, cudaMemcpyDeviceToDevice, cs));
    }
    so_->set_caller_stream_handle(cs);
    bk.work = so_->device_all_reduce(
        comm::Buffer::of(std::span<T>(bk.flat.data(), static_cast<std::size_t>(l.numel)), comm::MemoryKind::Cuda),
        {.op = comm::ReduceOp::Avg});
    DDP_CUDA_CHECK(cudaEventRecord(bk.nccl_done.get(), static_cast<cudaStream_t>(so_->op_stream_handle())));
    bk.nccl_done.wait(comm_exec);
    for (std::size_t k = 0; k < l.params.size(); ++k) {
      auto& g = params_[l.params[k]]->grad();
      DDP_CUDA_CHECK(cudaMemcpyAsync(g.data(), bk.flat.data() + l.offsets[k], g.bytes(), cudaMemcpyDeviceToDevice, cs));
    }
    bk.done.record(comm_exec);
    bk.launched = true;
    trace_.buckets.push_back(
        BucketTrace{.index = b, .numel = l.numel, .num_params = l.params.size(), .launched = Clock::now()});
  }

  // Waits for the previous step's collectives (complete by now in a healthy job) and raises the first error.
  void retire() {
    std::vector<comm::Work> works;
    for (Bucket& bk : buckets_) works.push_back(std::exchange(bk.work, comm::Work()));
    for (comm::Work& w : side_works_) works.push_back(std::move(w));
    side_works_.clear();
    for (comm::Work& w : works) w.wait();
  }

  void drain() noexcept {
    for (Bucket& bk : buckets_) {
      try {
        bk.work.wait();
      } catch (...) {
      }
      bk.work = comm::Work();
    }
    for (comm::Work& w : side_works_) {
      try {
        w.wait();
      } catch (...) {
      }
    }
    side_works_.clear();
    active_ = false;
  }

  void rebuild_from_arrival(const std::vector<std::size_t>& missing) {
    rebuilt_ = true;
    std::vector<std::int64_t> order;
    for (std::size_t i : arrival_) order.push_back(static_cast<std::int64_t>(i));
    for (std::size_t i : missing)
      if (std::find(arrival_.begin(), arrival_.end(), i) == arrival_.end())
        order.push_back(static_cast<std::int64_t>(i));
    if (order.size() != params_.size()) return;
    if (comm_->size() > 1) {
      Tensor<std::int64_t, Cpu> host(Shape{static_cast<std::int64_t>(order.size())});
      std::copy(order.begin(), order.end(), host.data());
      Tensor<std::int64_t, Cuda> dev = to<Cuda>(host.cview(), compute_);
      broadcast<std::int64_t>({{dev.data(), dev.numel()}}, compute_, /*host_wait=*/true);
      Tensor<std::int64_t, Cpu> back = to<Cpu>(dev.cview(), compute_);
      order.assign(back.data(), back.data() + back.numel());
    }
    std::vector<std::size_t> o(order.begin(), order.end());
    build(o);  // the old buffers are freed in stream order (see the file comment)
  }

  std::vector<nn::Parameter<T, Cuda>*> params_;
  comm::Communicator* comm_;
  comm::StreamOrdered* so_;
  ReducerOptions o_;
  Stream comm_stream_;  // blocking (cudaStreamDefault): orders with the allocator's frees
  Exec<Cuda> compute_{};
  std::unordered_map<const nn::Parameter<T, Cuda>*, std::size_t> index_;
  std::vector<BucketLayout> layouts_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::size_t, std::size_t>> where_;
  std::vector<bool> ready_, zeroed_;
  std::vector<std::size_t> arrival_;
  std::vector<comm::Work> side_works_;  // broadcasts issued without a host wait
  std::size_t next_launch_ = 0;
  bool active_ = false;
  bool rebuilt_ = false;
  std::int64_t step_ = 0;
  std::int64_t synced_steps_ = 0;
  StepTrace trace_;
};

}  // namespace ddp::parallel
