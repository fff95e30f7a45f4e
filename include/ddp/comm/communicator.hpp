// Communicator: the abstract collective interface every backend (tcp, mpi, nccl) implements.
// SPDX-License-Identifier: MIT
//
// Typed at the edge, type-erased inside (as gloo): user code calls one entry point per op, a
// template over TensorView<T, D> (counts are elements; T a CommElement: float, double, bfloat16,
// half, int32, int64, uint8; D Cpu or Cuda); std::span<T> overloads forward to TensorView<T, Cpu>.
// Communicator checks every call's arguments once for all backends (comm/checks.hpp) and hands the
// backend an OpCall through the protected *_impl calls.
//
//   Work w = comm.all_reduce(grad.view(), {.op = ReduceOp::Avg});  // tcp: returns at once
//   w.wait();                                                       // CommError if a peer died
//   comm.all_reduce(d_grad.view(), {.op = ReduceOp::Avg, .stream = exec.stream});  // nccl
//
// Contract:
// - Every collective must be called by every rank of the communicator, in the same order, with the
//   same dtype, count (see each function), root and reduce op. A mismatch is reported on every
//   rank as a CommError naming both ops and the sequence number (docs/decisions/0009).
// - Every call returns a Work; ops complete in issue order. Buffers must stay alive and untouched
//   until the Work completes. Ops run on a progress thread, overlapping the caller's compute (small
//   ones may run on the calling thread: CommOptions::inline_max_bytes). send/recv are blocking
//   (they return a completed Work); isend/irecv are asynchronous.
// - Memory: a communicator reaches one kind, memory(): host memory (tcp, mpi) or CUDA device
//   memory (nccl; tcp and mpi staged, comm/staging/staged_communicator.hpp). Any other is a
//   ValueError at the call that names the backend and the fix.
// - Streams (device memory): an op with options.stream = s (a cudaStream_t; null: the legacy
//   default stream) waits on the device for the work already enqueued on s, and the work enqueued
//   on s after the call waits for it; the host never blocks. Work::wait() blocks the host until the
//   op is done and raises its failure. Communicators on host memory take no stream (ValueError).
// - Argument errors (root out of range, size mismatch) throw ValueError before anything is sent.
// - Calls from several threads are serialised, but their order then decides the op order: issue
//   collectives from one thread.
// - After a failure (peer died, mismatch, timeout) every later op fails with a CommError that
//   quotes the first failure; create a new communicator to continue (torchrun restarts the job).
// - Not copyable or movable. Destruction runs a bounded barrier and never hangs or throws.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::comm {

// An element type a collective may write (recv, in-place ops, outputs).
template <class T>
concept WritableCommElement = CommElement<T> && !std::is_const_v<T>;

class Communicator {
 public:
  Communicator() = default;
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // "tcp", "mpi", "nccl".
  virtual std::string_view backend() const noexcept = 0;
  // The memory this backend's buffers must live in (see the contract).
  virtual MemoryKind memory() const noexcept = 0;

  // ---- point to point ----
  template <CommElement T, Device D>  // T may be const
  Work send(TensorView<T, D> data, int dst, const SendOptions& o = {}) {
    return waited(isend(data, dst, o));
  }
  template <WritableCommElement T, Device D>
  Work recv(TensorView<T, D> data, int src, const SendOptions& o = {}) {
    return waited(irecv(data, src, o));
  }
  template <CommElement T, Device D>
  Work isend(TensorView<T, D> data, int dst, const SendOptions& o = {}) {
    return send_impl(checks().send(BufferRef::of(data), dst, o));
  }
  template <WritableCommElement T, Device D>
  Work irecv(TensorView<T, D> data, int src, const SendOptions& o = {}) {
    return recv_impl(checks().recv(BufferRef::of(data), src, o));
  }

  // ---- collectives ----
  // In place: every rank ends with root's data.
  template <WritableCommElement T, Device D>
  Work broadcast(TensorView<T, D> data, const BroadcastOptions& o = {}) {
    return broadcast_impl(checks().broadcast(BufferRef::of(data), o));
  }
  // In place: every rank ends with the element-wise reduction over ranks. bfloat16/half reduce in
  // float; Avg divides the sum by size() (integer division for integer types).
  template <WritableCommElement T, Device D>
  Work all_reduce(TensorView<T, D> data, const AllreduceOptions& o = {}) {
    return all_reduce_impl(checks().all_reduce(BufferRef::of(data), o));
  }
  // In place on root; other ranks' buffers are left unchanged.
  template <WritableCommElement T, Device D>
  Work reduce(TensorView<T, D> data, const ReduceOptions& o = {}) {
    return reduce_impl(checks().reduce(BufferRef::of(data), o));
  }
  // out (size() * in.numel() elements) = concatenation of every rank's in, in rank order.
  template <CommElement In, WritableCommElement T, Device D>
  requires std::same_as<std::remove_const_t<In>, T> Work
  all_gather(TensorView<In, D> in, TensorView<T, D> out, const AllgatherOptions& o = {}) {
    return all_gather_impl(checks().all_gather(BufferRef::of(in), BufferRef::of(out), o));
  }
  // in: size() * out.numel() elements; rank r receives the reduction of every rank's block r.
  template <CommElement In, WritableCommElement T, Device D>
  requires std::same_as<std::remove_const_t<In>, T> Work
  reduce_scatter(TensorView<In, D> in, TensorView<T, D> out, const ReduceScatterOptions& o = {}) {
    return reduce_scatter_impl(checks().reduce_scatter(BufferRef::of(in), BufferRef::of(out), o));
  }
  // in and out have size() * k elements; block j of rank r's in lands in block r of rank j's out.
  template <CommElement In, WritableCommElement T, Device D>
  requires std::same_as<std::remove_const_t<In>, T> Work all_to_all(TensorView<In, D> in,
                                                                    TensorView<T, D> out,
                                                                    const AlltoallOptions& o = {}) {
    return all_to_all_impl(checks().all_to_all(BufferRef::of(in), BufferRef::of(out), o));
  }
  Work barrier(const BarrierOptions& o = {}) { return barrier_impl(checks().barrier(o)); }

  // ---- the same calls on host memory: a std::span<T> is a one-dimensional TensorView<T, Cpu> ----
  template <CommElement T>
  Work send(std::span<T> data, int dst, const SendOptions& o = {}) {
    return send(host(data), dst, o);
  }
  template <WritableCommElement T>
  Work recv(std::span<T> data, int src, const SendOptions& o = {}) {
    return recv(host(data), src, o);
  }
  template <CommElement T>
  Work isend(std::span<T> data, int dst, const SendOptions& o = {}) {
    return isend(host(data), dst, o);
  }
  template <WritableCommElement T>
  Work irecv(std::span<T> data, int src, const SendOptions& o = {}) {
    return irecv(host(data), src, o);
  }
  template <WritableCommElement T>
  Work broadcast(std::span<T> data, const BroadcastOptions& o = {}) {
    return broadcast(host(data), o);
  }
  template <WritableCommElement T>
  Work all_reduce(std::span<T> data, const AllreduceOptions& o = {}) {
    return all_reduce(host(data), o);
  }
  template <WritableCommElement T>
  Work reduce(std::span<T> data, const ReduceOptions& o = {}) {
    return reduce(host(data), o);
  }
  template <CommElement In, WritableCommElement T>
  requires std::same_as<std::remove_const_t<In>, T> Work
  all_gather(std::span<In> in, std::span<T> out, const AllgatherOptions& o = {}) {
    return all_gather(host(in), host(out), o);
  }
  template <CommElement In, WritableCommElement T>
  requires std::same_as<std::remove_const_t<In>, T> Work
  reduce_scatter(std::span<In> in, std::span<T> out, const ReduceScatterOptions& o = {}) {
    return reduce_scatter(host(in), host(out), o);
  }
  template <CommElement In, WritableCommElement T>
  requires std::same_as<std::remove_const_t<In>, T> Work all_to_all(std::span<In> in,
                                                                    std::span<T> out,
                                                                    const AlltoallOptions& o = {}) {
    return all_to_all(host(in), host(out), o);
  }

  // A communicator over `ranks` (strictly increasing). Every rank calls new_group with the same
  // list, in the same order relative to other new_group calls; members get the new communicator
  // (their rank is their index in `ranks`), others nullptr.
  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) {
    return new_group_impl(ranks, checks().group_index(ranks));
  }

 protected:
  // Each receives a checked call of its kind (call.fp.kind); see OpCall in types.hpp.
  virtual Work send_impl(const OpCall& call) = 0;
  virtual Work recv_impl(const OpCall& call) = 0;
  virtual Work broadcast_impl(const OpCall& call) = 0;
  virtual Work all_reduce_impl(const OpCall& call) = 0;
  virtual Work reduce_impl(const OpCall& call) = 0;
  virtual Work all_gather_impl(const OpCall& call) = 0;
  virtual Work reduce_scatter_impl(const OpCall& call) = 0;
  virtual Work all_to_all_impl(const OpCall& call) = 0;
  virtual Work barrier_impl(const OpCall& call) = 0;
  // `index`: this rank's index in the checked `ranks`; -1 for a non-member, which still takes part.
  virtual std::unique_ptr<Communicator> new_group_impl(const std::vector<int>& ranks,
                                                       int index) = 0;

  // Hands an already checked call to `to`'s backend: how a wrapper (StagedCommunicator) runs the op
  // it staged in host memory on the communicator that moves the bytes, without a second check.
  static Work run_checked(Communicator& to, const OpCall& call) {
    switch (call.fp.kind) {
      case OpKind::Send: return to.send_impl(call);
      case OpKind::Recv: return to.recv_impl(call);
      case OpKind::Broadcast: return to.broadcast_impl(call);
      case OpKind::AllReduce: return to.all_reduce_impl(call);
      case OpKind::Reduce: return to.reduce_impl(call);
      case OpKind::AllGather: return to.all_gather_impl(call);
      case OpKind::ReduceScatter: return to.reduce_scatter_impl(call);
      case OpKind::AllToAll: return to.all_to_all_impl(call);
      case OpKind::Barrier: return to.barrier_impl(call);
    }
    return to.barrier_impl(call);  // unreachable: every kind is listed
  }

 private:
  CallChecks checks() const { return CallChecks(rank(), size(), backend(), memory()); }
  template <class T>
  static TensorView<T, Cpu> host(std::span<T> s) {
    return TensorView<T, Cpu>(s.data(), Shape{static_cast<std::int64_t>(s.size())});
  }
  static Work waited(Work w) {
    w.wait();
    return w;
  }
};

}  // namespace ddp::comm
