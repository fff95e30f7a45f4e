// DDP's data movement on the CPU: Broadcaster<Cpu> (rank 0's values on every rank) and Transport<T,
// Cpu> (the gradient buckets' pack / hook / unpack that the Reducer drives).
// SPDX-License-Identifier: MIT
//
// Transport<T, Cpu>, per bucket b (see BucketTransport in parallel/reducer.hpp for the contract):
//   launch(b)   memcpy each gradient into b's flat host buffer (bucket order, zeros for parameters
//               without a gradient) and call the communication hook on it (grad_bucket.hpp; by
//               default an asynchronous all-reduce (Avg) that the backend's progress thread runs
//               while backward goes on)
//   finish(b)   wait for the hook's Work, run its `then` (e.g. fp16 back to float), wait for what
//               it deferred, memcpy each slot into its parameter's grad() (not for parameters no
//               rank used: find_unused_parameters keeps those)
// With gradient_as_bucket_view the gradients ARE the slots (parallel/grad_views.hpp): launch only
// zeroes the slots of parameters without a gradient, finish copies nothing.
// Example: bucket {fc.bias (10), fc.weight (10 x 64)} -> flat of 650 floats, fc.bias at 0,
// fc.weight at 10.
// The CUDA versions (device buffers, a communication stream ordered by events) are in
// parallel/cuda/transport.cuh, compiled only by nvcc; <ddp/ddp.hpp> includes them there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/config.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/host_memory.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/comm_hooks.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/parallel/grad_bucket.hpp"
#include "ddp/parallel/grad_views.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::parallel {

// Broadcaster<D>: rank 0's values on every rank, for data in D's memory. Collective: every rank
// calls the same broadcasts in the same order. The primary template turns a missing device into a
// message.
template <Device D>
class Broadcaster {
  static_assert(ddp::detail::dependent_false<D>,
                "ddp: DistributedDataParallel and broadcasts on CUDA need the CUDA transport, "
                "which only nvcc "
                "compiles: include <ddp/ddp.hpp> (or <ddp/parallel/cuda/transport.cuh>) in a .cu "
                "file and link "
                "ddp::cuda and ddp::nccl");
};

// Transport<T, D>: the Reducer's transport for device D (parallel/reducer.hpp).
template <class T, Device D>
class Transport {
  static_assert(ddp::detail::dependent_false<D>,
                "ddp: DistributedDataParallel on CUDA needs the CUDA transport, which only nvcc "
                "compiles: include "
                "<ddp/ddp.hpp> (or <ddp/parallel/cuda/transport.cuh>) in a .cu file and link "
                "ddp::cuda and ddp::nccl");
};

template <>
class Broadcaster<Cpu> {
 public:
  // `comm` must outlive this object.
  explicit Broadcaster(comm::Communicator& comm) : comm_(&comm) {}

  // Rank `root`'s values (0 but for DDP's join, docs/decisions/0030) of every part on every rank,
  // as one flat broadcast (one part: in place). The host always waits (host_wait is for the CUDA
  // version, which can leave the broadcast on the exec's stream).
  template <comm::CommElement V>
  void broadcast(const std::vector<std::span<V>>& parts, const Exec<Cpu>& /*exec*/ = {},
                 bool /*host_wait*/ = true, int root = 0) {
    if (comm_->size() == 1 || parts.empty()) return;
    if (parts.size() == 1) {
      comm_->broadcast(parts.front(), {.root = root}).wait();
      return;
    }
    std::vector<V> flat;
    for (const auto& p : parts) flat.insert(flat.end(), p.begin(), p.end());
    comm_->broadcast(std::span<V>(flat), {.root = root}).wait();
    std::size_t off = 0;
    for (const auto& p : parts) {
      std::copy_n(flat.data() + off, p.size(), p.data());
      off += p.size();
    }
  }
  // The same for host memory (on the CPU the same thing); the host waits.
  template <comm::CommElement V>
  void broadcast_host(std::span<V> values, const Exec<Cpu>& exec = {}, int root = 0) {
    broadcast<V>({values}, exec, /*host_wait=*/true, root);
  }

 private:
  comm::Communicator* comm_;
};

template <class T>
class Transport<T, Cpu> {
 public:
  // `comm` and the parameters must outlive this object.
  Transport(const std::vector<nn::Parameter<T, Cpu>*>& params, const DdpOptions& o,
            comm::Communicator& comm)
      : params_(params),
        comm_(&comm),
        hook_(make_comm_hook<T, Cpu>(o.comm_hook, o.powersgd)),
        bcast_(comm),
        view_(o.grads_in_buckets<Cpu>()) {}
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  // A reduction still in flight (backward threw half-way) writes into our buffers: wait for it
  // first. The parameters outlive us: their gradients move back into memory of their own.
  ~Transport() {
    drain();
    if (view_) own_grads(params_, Exec<Cpu>{});
  }

  // Replaces the communication hook (parallel/grad_bucket.hpp); nothing may be in flight.
  void set_comm_hook(CommHook<T, Cpu> hook) {
    detail::require_hook(hook);
    drain();
    hook_ = std::move(hook);
  }

  void build(const std::vector<BucketLayout>& layouts) {
    drain();
    std::vector<Bucket> fresh(layouts.size());
    std::vector<T*> flats;
    for (std::size_t b = 0; b < layouts.size(); ++b) {
      fresh[b].flat.assign(static_cast<std::size_t>(layouts[b].numel), T(0));
      for (std::size_t i : layouts[b].params) fresh[b].shapes.push_back(params_[i]->torch_shape());
      flats.push_back(fresh[b].flat.data());
    }
    // before the old buffers go
    if (view_) view_grads_in_buckets(params_, layouts, flats, Exec<Cpu>{});
    layouts_ = layouts;
    // moving the vectors keeps every flat buffer where the views point
    buckets_ = std::move(fresh);
  }

  void begin_step(const Exec<Cpu>& /*exec*/) {
  }  // finish() waited for every collective of the last step

  void launch(std::size_t b, const std::vector<bool>& zero) {
    Bucket& bk = buckets_[b];
    const BucketLayout& l = layouts_[b];
    for (std::size_t k = 0; k < l.params.size(); ++k) {
      const std::size_t i = l.params[k];
      T* slot = bk.flat.data() + l.offsets[k];
      if (zero[i])
        std::fill_n(slot, params_[i]->numel(), T(0));
      else if (!view_)
        std::memcpy(slot, params_[i]->grad().data(), params_[i]->grad().bytes());
    }
    GradBucket<T, Cpu> gb{.index = b,
                          .buffer = std::span<T>(bk.flat),
                          .layout = &l,
                          .comm = comm_,
                          .is_last = b + 1 == layouts_.size(),
                          .shapes = bk.shapes,
                          .exec = {},
                          .defer = defer_};
    bk.pending = hook_(gb);
  }

  void finish(std::size_t b, const std::vector<bool>& keep) {
    Bucket& bk = buckets_[b];
    HookResult r = std::exchange(bk.pending, HookResult{});
    r.work.wait();
    bk.completed = r.work.completed_at();
    if (r.then) r.then();
    for (comm::Work& w : std::exchange(deferred_, {})) w.wait();
    // the slots are the gradients (a parameter no rank used: see docs/decisions/0033)
    if (view_) return;
    const BucketLayout& l = layouts_[b];
    for (std::size_t k = 0; k < l.params.size(); ++k) {
      if (keep[l.params[k]]) continue;
      auto& g = params_[l.params[k]]->grad();
      std::memcpy(g.data(), bk.flat.data() + l.offsets[k], g.bytes());
    }
  }

  void drain() noexcept {
    for (Bucket& bk : buckets_) {
      try {
        bk.pending.work.wait();
        // dropped: the caller is already handling another error, or abandons the step
      } catch (...) {
      }
      bk.pending = HookResult{};
    }
    comm::wait_all_noexcept(deferred_);
  }

  // When bucket b's reduction completed (after its finish; nullopt: nothing ran, e.g. world size
  // 1).
  std::optional<Clock::time_point> completed_at(std::size_t b) const {
    return buckets_[b].completed;
  }

  void broadcast_order(std::span<std::int64_t> order) { bcast_.broadcast_host(order); }
  void any_rank(std::span<std::int64_t> flags) {
    if (comm_->size() > 1) comm_->all_reduce(flags, {.op = comm::ReduceOp::Max}).wait();
  }

  // Parameter and buffer broadcasts of DistributedDataParallel.
  Broadcaster<Cpu>& broadcaster() noexcept { return bcast_; }

 private:
  struct Bucket {
    // gradients back to back, bucket order (tensor memory's page policy: core/host_memory.hpp)
    HostVector<T> flat;
    HookResult pending;         // the hook's reduction in flight (an empty Work when none)
    std::vector<Shape> shapes;  // each parameter's torch shape, bucket order (GradBucket::shapes)
    // the last finished reduction's completion (traces)
    std::optional<Clock::time_point> completed;
  };

  std::vector<nn::Parameter<T, Cpu>*> params_;
  comm::Communicator* comm_;
  CommHook<T, Cpu> hook_;
  std::vector<comm::Work> deferred_;  // what hooks gave GradBucket::defer (waited at finish)
  std::function<void(comm::Work)> defer_ = [this](comm::Work w) {
    deferred_.push_back(std::move(w));
  };
  Broadcaster<Cpu> bcast_;
  bool view_;  // gradient_as_bucket_view
  std::vector<BucketLayout> layouts_;
  std::vector<Bucket> buckets_;
};

}  // namespace ddp::parallel
