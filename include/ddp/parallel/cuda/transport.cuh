// DDP's data movement on the GPU: Broadcaster<Cuda> and Transport<T, Cuda> (device buckets, a
// communication stream ordered by events, no host synchronisation inside backward). Compiled only
// by nvcc.
// SPDX-License-Identifier: MIT
//
// Transport<T, Cuda>, per bucket b (the Reducer drives it, parallel/reducer.hpp):
//   begin_step(exec)   remembers exec (the compute stream backward runs on); waits for the previous
//     step's
//                      collectives (by then long complete) so that a failed one is raised
//   launch(b)          enqueues, without blocking the host:
//       ready[b].record(compute)             the bucket's gradients are written when compute gets
//         here
//       ready[b].wait(comm)                  the comm stream waits for that point
//       copies grad -> flat (comm stream)    cudaMemcpyAsync device to device (cudaMemsetAsync
//         without a gradient)
//       all_reduce_on(comm, flat)            the all-reduce (Avg) after the copies; comm waits for
//         it
//     or, with --comm-hook fp16|bf16 (CommHookKind::Fp16/Bf16; torch's fp16/bf16_compress_hook):
//       kernel flat -> wire (comm stream)    wire[i] = H(flat[i] * (1/W)), H = half/bfloat16 (the
//         CPU hook's
//                                            element functor, parallel/comm_hooks.hpp: same
//                                              rounding)
//       all-reduce (Sum) of wire             16-bit values summed over ranks, stream-ordered like
//         the above
//       kernel wire -> flat (comm stream)    flat[i] = float(wire[i])
//     or, with --comm-hook powersgd: parallel/cuda/powersgd.cuh's launch (torch's powerSGD_hook on
//       the device)
//   finish(b, keep)    after backward: copies flat -> grad (comm stream; not for keep[i], a
//     parameter no rank
//                      used), done[b].record(comm), compute waits for done[b]: the optimizer step,
//                        enqueued
//                      next on the compute stream, sees averaged gradients. The host never waits
//                        here.
//                      powersgd: before those copies, powersgd.cuh's finish (the CPU hook's `then`,
//                        with the
//                      Q all-reduce), also on the comm stream.
// gradient_as_bucket_view (parallel/grad_views.hpp): the gradients are the slots of flat, so
// neither copy runs (only the memset for parameters without a gradient); the all-reduce works in
// place. Hooks: the built-ins allreduce, fp16, bf16 and powersgd (CommHookKind, comm_hooks.hpp);
// every backend that reaches device memory all-reduces F16/BF16 (nccl natively; a staged tcp/mpi
// sums them on the host as for a CPU model, so the results equal the CPU hook's on the same backend
// bit for bit). PowerSGD: PowerSgdDevice (parallel/cuda/powersgd.cuh), which follows the CPU hook
// to rounding; its state is powersgd_state(). register_comm_hook (host code) is refused with a
// ValueError saying what is supported. Backward keeps running on the compute stream while buckets
// are reduced (the grads of a launched bucket are not written again in the same backward), which is
// the overlap DDP exists for. Requirements: a communicator on device memory (memory() ==
// MemoryKind::Cuda: --backend nccl, or tcp/gloo and mpi made with CommOptions::cuda_device, which
// stage through pinned host memory: comm/staging/ staged_communicator.hpp, docs/decisions/0023),
// all gradients in device memory, a hook from the list above (ValueError otherwise). The bucket
// order rebuilt after the first step is broadcast through a small device buffer (one host wait).
// The collectives are stream-ordered on the comm stream (comm/communicator.hpp: `.stream`): each
// waits on the device for the copies before it, and the copies after it wait for it; the host is
// never involved (staged backends: the stream waits in a host function for the host collective, not
// the calling thread). Nothing here keeps a stream in the communicator: the stream travels with
// each call, so the communicator outlives this transport and its streams safely
// (docs/decisions/0016). Memory: nccl declares every buffer it hands to NCCL to the caching
// allocator (cuda_record_stream), so a flat buffer freed by a rebuild is reused only after NCCL has
// finished with it; a staged backend touches device memory only on the caller's stream, in stream
// order like our own copies.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cuda/launch.cuh"
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
// Waits for every Work, dropping errors (used while another error unwinds, or on destruction).
inline void wait_all_noexcept(std::vector<comm::Work>& works) noexcept {
  for (comm::Work& w : works) {
    try {
      w.wait();
    } catch (...) {
    }
  }
  works.clear();
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
  void drain() noexcept { detail::wait_all_noexcept(pending_); }

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
        hook_(o.comm_hook),
        view_(o.grads_in_buckets<Cuda>()) {
    if (hook_ == CommHookKind::PowerSgd)
      // validates the options
      psgd_ = std::make_unique<detail::PowerSgdDevice<T>>(o.powersgd, comm_stream_.get());
  }
  // A CommHook<T> is host code on host buffers (parallel/comm_hooks.hpp): CUDA buckets take
  // DdpOptions::comm_hook.
  void set_comm_hook(const CommHook<T>& /*hook*/) {
    throw cuda_hook_refused("a hook passed to register_comm_hook");
  }
  // --comm-hook powersgd: the state's counters (bytes on the wire, compression_stats, iter); null
  // otherwise. The per-bucket tensors live in device memory here, not in the state's host
  // `buckets`, which stay empty.
  const PowerSgdState<T>* powersgd_state() const noexcept {
    return psgd_ ? &psgd_->state() : nullptr;
  }
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  // The parameters outlive us: with gradient_as_bucket_view their gradients move back into memory
  // of their own (copied on the compute stream, before the buckets are freed in stream order).
  ~Transport() {
    drain();
    if (view_) own_grads(params_, compute_);
  }

  void build(const std::vector<BucketLayout>& layouts) {
    // raised at begin_step
    for (Bucket& bk : buckets_) retired_.push_back(std::exchange(bk.work, comm::Work()));
    std::vector<Bucket> fresh(layouts.size());
    std::vector<T*> flats;
    for (std::size_t b = 0; b < layouts.size(); ++b) {
      fresh[b].flat = Tensor<T, Cuda>(Shape{layouts[b].numel});
      if (hook_ == CommHookKind::Fp16)
        fresh[b].wire_f16 = Tensor<half, Cuda>(Shape{layouts[b].numel});
      if (hook_ == CommHookKind::Bf16)
        fresh[b].wire_bf16 = Tensor<bfloat16, Cuda>(Shape{layouts[b].numel});
      flats.push_back(fresh[b].flat.data());
    }
    if (psgd_) psgd_->build(layouts, params_, comm_stream_.exec());
    // on the compute stream, before the
    if (view_) view_grads_in_buckets(params_, layouts, flats, compute_);
    layouts_ = layouts;  // old buffers are freed
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
    const std::span<T> flat(bk.flat.data(), static_cast<std::size_t>(l.numel));
    switch (hook_) {
      case CommHookKind::Fp16: bk.work = compressed_all_reduce(comm_exec, flat, bk.wire_f16); break;
      case CommHookKind::Bf16:
        bk.work = compressed_all_reduce(comm_exec, flat, bk.wire_bf16);
        break;
      case CommHookKind::PowerSgd: {
        std::optional<comm::Work> w = psgd_->launch(b, comm_exec, flat, *comm_);
        // nullopt: before start_iter, the plain average
        bk.work = w ? std::move(*w) : all_reduce_on(cs, flat);
        break;
      }
      default: bk.work = all_reduce_on(cs, flat);  // Allreduce
    }
  }

  // The copies back into grad() are enqueued here, after backward, because only now is it known
  // which parameters no rank used (keep[i]: left untouched); the comm stream still runs them after
  // the all-reduce and the compute stream, where the optimizer runs next, waits for them. The host
  // does not wait.
  void finish(std::size_t b, const std::vector<bool>& keep) {
    Bucket& bk = buckets_[b];
    const BucketLayout& l = layouts_[b];
    const cudaStream_t cs = comm_stream_.get();
    if (psgd_)
      psgd_->finish(b, comm_stream_.exec(),
                    std::span<T>(bk.flat.data(), static_cast<std::size_t>(l.numel)), *comm_,
                    retired_);
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
    for (Bucket& bk : buckets_) retired_.push_back(std::exchange(bk.work, comm::Work()));
    detail::wait_all_noexcept(retired_);
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
    Tensor<T, Cuda> flat;  // gradients back to back, bucket order (device)
    // --comm-hook fp16 / bf16: flat / W in 16 bits, what is all-reduced (empty for the other
    // hooks). Freed like flat (nccl declares it to the allocator; the kernels and staged copies run
    // on the comm stream).
    Tensor<half, Cuda> wire_f16;
    Tensor<bfloat16, Cuda> wire_bf16;
    Event ready, done;
    comm::Work work;  // the all-reduce, retired at the next begin_step
  };

  // Waits for the previous step's collectives (complete by now in a healthy job) and raises the
  // first error.
  void retire() {
    std::vector<comm::Work> works = std::exchange(retired_, {});
    for (Bucket& bk : buckets_) works.push_back(std::exchange(bk.work, comm::Work()));
    for (comm::Work& w : works) w.wait();
    bcast_.retire();
  }

  // Stream-ordered: the all-reduce waits for s's earlier work, s's later work waits for the
  // all-reduce.
  comm::Work all_reduce_on(cudaStream_t s, std::span<T> flat) {
    return comm_->all_reduce(
        TensorView<T, Cuda>(flat.data(), Shape{static_cast<std::int64_t>(flat.size())}),
        {.op = comm::ReduceOp::Avg, .stream = s});
  }

  // torch's fp16/bf16_compress_hook on the device, all on exec's stream (the comm stream), no host
  // wait: wire = H(flat * (1/W)), Sum over ranks of wire, flat = float(wire). The element functors
  // are the CPU hook's (parallel/comm_hooks.hpp), so the rounding is the same bits.
  template <class H>
  comm::Work compressed_all_reduce(const Exec<Cuda>& exec, std::span<T> flat,
                                   Tensor<H, Cuda>& wire) {
    const std::size_t n = flat.size();
    kernels::cuda::for_each_index(
        exec, n,
        detail::CompressToWire<T, H>{.bucket = flat.data(),
                                     .wire = wire.data(),
                                     .inv_world = detail::compress_scale(comm_->size())});
    comm::Work w =
        comm_->all_reduce(TensorView<H, Cuda>(wire.data(), Shape{static_cast<std::int64_t>(n)}),
                          {.op = comm::ReduceOp::Sum, .stream = cuda_stream(exec)});
    kernels::cuda::for_each_index(
        exec, n, detail::DecompressFromWire<T, H>{.wire = wire.data(), .bucket = flat.data()});
    return w;
  }

  std::vector<nn::Parameter<T, Cuda>*> params_;
  Broadcaster<Cuda> bcast_;
  comm::Communicator* comm_;
  CommHookKind hook_;  // Allreduce, Fp16, Bf16 or PowerSgd
  // --comm-hook powersgd (parallel/cuda/powersgd.cuh)
  std::unique_ptr<detail::PowerSgdDevice<T>> psgd_;
  bool view_;           // gradient_as_bucket_view (parallel/grad_views.hpp)
  Stream comm_stream_;  // blocking (cudaStreamDefault): orders with the legacy default stream
  Exec<Cuda> compute_{};
  std::vector<BucketLayout> layouts_;
  std::vector<Bucket> buckets_;
  // Works of replaced buckets and of drained steps, not yet waited
  std::vector<comm::Work> retired_;
};

}  // namespace ddp::parallel
