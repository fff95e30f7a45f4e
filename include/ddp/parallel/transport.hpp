// DDP's data movement on the CPU: Broadcaster<Cpu> (rank 0's values on every rank) and Transport<T, Cpu> (the
// gradient buckets' pack / all-reduce / unpack that BucketSchedule drives).
// SPDX-License-Identifier: MIT
//
// Transport<T, Cpu>, per bucket b (see BucketTransport in parallel/bucket_schedule.hpp for the contract):
//   launch(b)   memcpy each gradient into b's flat host buffer (bucket order, zeros for unused parameters),
//               optionally convert it to bf16/fp16 (half the bytes; the backend reduces in float), and start
//               an asynchronous all-reduce (Avg) -- the backend's progress thread runs it while backward goes on
//   finish(b)   wait for it, convert back, memcpy each slot into its parameter's grad()
// Example: bucket {fc.bias (10), fc.weight (10 x 64)} -> flat of 650 floats, fc.bias at 0, fc.weight at 10.
// The CUDA versions (device buffers, a communication stream ordered by events) are in
// parallel/cuda/transport.cuh, compiled only by nvcc; <ddp/ddp.hpp> includes them there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/config.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/nn/parameter.hpp"
#include "ddp/parallel/bucket.hpp"
#include "ddp/parallel/bucket_schedule.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::parallel {

// Broadcaster<D>: rank 0's values on every rank, for data in D's memory. Collective: every rank calls the same
// broadcasts in the same order. The primary template turns a missing device into a message.
template <Device D>
class Broadcaster {
  static_assert(ddp::detail::dependent_false<D>,
                "ddp: DistributedDataParallel and broadcasts on CUDA need the CUDA transport, which only nvcc "
                "compiles: include <ddp/ddp.hpp> (or <ddp/parallel/cuda/transport.cuh>) in a .cu file and link "
                "ddp::cuda and ddp::nccl");
};

// Transport<T, D>: BucketSchedule's transport for device D (parallel/bucket_schedule.hpp).
template <class T, Device D>
class Transport {
  static_assert(ddp::detail::dependent_false<D>,
                "ddp: DistributedDataParallel on CUDA needs the CUDA transport, which only nvcc compiles: include "
                "<ddp/ddp.hpp> (or <ddp/parallel/cuda/transport.cuh>) in a .cu file and link ddp::cuda and ddp::nccl");
};

template <>
class Broadcaster<Cpu> {
 public:
  // `comm` must outlive this object.
  explicit Broadcaster(comm::Communicator& comm) : comm_(&comm) {}

  // Rank 0's values of every part on every rank, as one flat broadcast (one part: in place). The host
  // always waits (host_wait is for the CUDA version, which can leave the broadcast on the exec's stream).
  template <comm::CommElement V>
  void broadcast(const std::vector<std::span<V>>& parts, const Exec<Cpu>& /*exec*/ = {}, bool /*host_wait*/ = true) {
    if (comm_->size() == 1 || parts.empty()) return;
    if (parts.size() == 1) {
      comm_->broadcast(parts.front(), {.root = 0}).wait();
      return;
    }
    std::vector<V> flat;
    for (const auto& p : parts) flat.insert(flat.end(), p.begin(), p.end());
    comm_->broadcast(std::span<V>(flat), {.root = 0}).wait();
    std::size_t off = 0;
    for (const auto& p : parts) {
      std::copy_n(flat.data() + off, p.size(), p.data());
      off += p.size();
    }
  }
  // The same for host memory (on the CPU the same thing); the host waits.
  template <comm::CommElement V>
  void broadcast_host(std::span<V> values, const Exec<Cpu>& exec = {}) {
    broadcast<V>({values}, exec, /*host_wait=*/true);
  }

 private:
  comm::Communicator* comm_;
};

template <class T>
class Transport<T, Cpu> {
 public:
  // `comm` and the parameters must outlive this object.
  Transport(const std::vector<nn::Parameter<T, Cpu>*>& params, const ReducerOptions& o, comm::Communicator& comm)
      : params_(params), comm_(&comm), compression_(o.compression), bcast_(comm) {}
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  // An all-reduce still in flight (backward threw half-way) writes into our buffers: wait for it first.
  ~Transport() { drain(); }

  void build(const std::vector<BucketLayout>& layouts) {
    drain();
    layouts_ = layouts;
    buckets_.clear();
    buckets_.resize(layouts_.size());
    for (std::size_t b = 0; b < layouts_.size(); ++b)
      buckets_[b].flat.assign(static_cast<std::size_t>(layouts_[b].numel), T(0));
  }

  void begin_step(const Exec<Cpu>& /*exec*/) {}  // finish() waited for every collective of the last step

  void launch(std::size_t b, const std::vector<bool>& unused) {
    Bucket& bk = buckets_[b];
    const BucketLayout& l = layouts_[b];
    for (std::size_t k = 0; k < l.params.size(); ++k) {
      const std::size_t i = l.params[k];
      T* slot = bk.flat.data() + l.offsets[k];
      if (unused[i])
        std::fill_n(slot, params_[i]->numel(), T(0));
      else
        std::memcpy(slot, params_[i]->grad().data(), params_[i]->grad().bytes());
    }
    const comm::AllreduceOptions ar{.op = comm::ReduceOp::Avg};
    if (compression_ == GradCompression::Bf16) {
      bk.flat_bf16.resize(bk.flat.size());
      for (std::size_t i = 0; i < bk.flat.size(); ++i) bk.flat_bf16[i] = bfloat16(static_cast<float>(bk.flat[i]));
      bk.work = comm_->all_reduce(std::span<bfloat16>(bk.flat_bf16), ar);
    } else if (compression_ == GradCompression::Fp16) {
      bk.flat_fp16.resize(bk.flat.size());
      for (std::size_t i = 0; i < bk.flat.size(); ++i) bk.flat_fp16[i] = half(static_cast<float>(bk.flat[i]));
      bk.work = comm_->all_reduce(std::span<half>(bk.flat_fp16), ar);
    } else {
      bk.work = comm_->all_reduce(std::span<T>(bk.flat), ar);
    }
  }

  void finish(std::size_t b) {
    Bucket& bk = buckets_[b];
    bk.work.wait();
    bk.work = comm::Work();
    if (compression_ == GradCompression::Bf16)
      for (std::size_t i = 0; i < bk.flat.size(); ++i) bk.flat[i] = static_cast<T>(static_cast<float>(bk.flat_bf16[i]));
    else if (compression_ == GradCompression::Fp16)
      for (std::size_t i = 0; i < bk.flat.size(); ++i) bk.flat[i] = static_cast<T>(static_cast<float>(bk.flat_fp16[i]));
    const BucketLayout& l = layouts_[b];
    for (std::size_t k = 0; k < l.params.size(); ++k) {
      auto& g = params_[l.params[k]]->grad();
      std::memcpy(g.data(), bk.flat.data() + l.offsets[k], g.bytes());
    }
  }

  void drain() noexcept {
    for (Bucket& bk : buckets_) {
      try {
        bk.work.wait();
      } catch (...) {  // dropped: the caller is already handling another error, or abandons the step
      }
      bk.work = comm::Work();
    }
  }

  void broadcast_order(std::span<std::int64_t> order) { bcast_.broadcast_host(order); }

  // Parameter and buffer broadcasts of DistributedDataParallel.
  Broadcaster<Cpu>& broadcaster() noexcept { return bcast_; }

 private:
  struct Bucket {
    std::vector<T> flat;              // gradients back to back, bucket order
    std::vector<bfloat16> flat_bf16;  // compression buffers (allocated on first use)
    std::vector<half> flat_fp16;
    comm::Work work;  // the all-reduce in flight (empty when none)
  };

  std::vector<nn::Parameter<T, Cpu>*> params_;
  comm::Communicator* comm_;
  GradCompression compression_;
  Broadcaster<Cpu> bcast_;
  std::vector<BucketLayout> layouts_;
  std::vector<Bucket> buckets_;
};

}  // namespace ddp::parallel
