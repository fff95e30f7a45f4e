// Communicator: the abstract collective interface every backend (tcp, mpi, nccl) implements.
// SPDX-License-Identifier: MIT
//
// Typed at the edge, type-erased inside [gloo]: user code calls the templates below with std::span<T>
// (counts are elements, T one of float, double, bfloat16, half, int32, int64, uint8); they forward a
// Buffer (pointer + count + dtype + memory kind) to the protected virtual *_impl functions. A TensorView
// overload and GPU memory plug in by building a Buffer with MemoryKind::Cuda.
//
// Contract:
// - Every collective must be called by every rank of the communicator, in the same order, with the same
//   dtype, count (see each function), root and reduce op. A mismatch is detected and reported on every
//   rank as a CommError naming both ops and the sequence number (DESIGN D9).
// - Every call returns a Work; ops complete in issue order. Buffers must stay alive and untouched until
//   the Work completes. Ops run on a progress thread, so they overlap with the caller's compute; a backend
//   may run a small op issued while it is idle on the calling thread (tcp: CommOptions::inline_max_bytes,
//   0 = never). send/recv are blocking (they return a completed Work); isend/irecv are asynchronous.
// - Argument errors (root out of range, size mismatch) throw ValueError at the call, before anything is sent.
// - Calls from several threads are serialised, but their order then decides the op order: issue
//   collectives from one thread.
// - After a failure (peer died, mismatch, timeout) the communicator is broken: every later op fails with
//   a CommError that quotes the first failure. Create a new one to continue (torchrun restarts the job).
// - Not copyable or movable. Destruction runs a bounded barrier and never hangs or throws.
#pragma once

#include <concepts>
#include <memory>
#include <string_view>
#include <type_traits>
#include <span>
#include <vector>

#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"

namespace ddp::comm {

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

  // ---- point to point ----
  template <CommElement T>  // T may be const
  Work send(std::span<T> data, int dst, const SendOptions& o = {}) {
    Work w = send_impl(Buffer::of(data), dst, o);
    w.wait();
    return w;
  }
  template <CommElement T>
  Work recv(std::span<T> data, int src, const SendOptions& o = {}) {
    Work w = recv_impl(Buffer::of(data), src, o);
    w.wait();
    return w;
  }
  template <CommElement T>
  Work isend(std::span<T> data, int dst, const SendOptions& o = {}) {
    return send_impl(Buffer::of(data), dst, o);
  }
  template <CommElement T>
  Work irecv(std::span<T> data, int src, const SendOptions& o = {}) {
    return recv_impl(Buffer::of(data), src, o);
  }

  // ---- collectives ----
  // In place: every rank ends with root's data.
  template <CommElement T>
  Work broadcast(std::span<T> data, const BroadcastOptions& o = {}) {
    return broadcast_impl(Buffer::of(data), o);
  }
  // In place: every rank ends with the element-wise reduction over ranks. bfloat16/half reduce in float;
  // Avg divides the sum by size() (integer division for integer types).
  template <CommElement T>
  Work all_reduce(std::span<T> data, const AllreduceOptions& o = {}) {
    return all_reduce_impl(Buffer::of(data), o);
  }
  // In place on root; other ranks' buffers are left unchanged.
  template <CommElement T>
  Work reduce(std::span<T> data, const ReduceOptions& o = {}) {
    return reduce_impl(Buffer::of(data), o);
  }
  // out (size() * in.size() elements) = concatenation of every rank's in, in rank order.
  template <CommElement In, CommElement T>
    requires std::same_as<std::remove_const_t<In>, T>
  Work all_gather(std::span<In> in, std::span<T> out, const AllgatherOptions& o = {}) {
    return all_gather_impl(Buffer::of(in), Buffer::of(out), o);
  }
  // in has size() * out.size() elements; rank r receives the reduction of block r of every rank's in.
  template <CommElement In, CommElement T>
    requires std::same_as<std::remove_const_t<In>, T>
  Work reduce_scatter(std::span<In> in, std::span<T> out, const ReduceScatterOptions& o = {}) {
    return reduce_scatter_impl(Buffer::of(in), Buffer::of(out), o);
  }
  // in and out have size() * k elements; block j of rank r's in lands in block r of rank j's out.
  template <CommElement In, CommElement T>
    requires std::same_as<std::remove_const_t<In>, T>
  Work all_to_all(std::span<In> in, std::span<T> out, const AlltoallOptions& o = {}) {
    return all_to_all_impl(Buffer::of(in), Buffer::of(out), o);
  }
  Work barrier(const BarrierOptions& o = {}) { return barrier_impl(o); }

  // A communicator over `ranks` (ranks of this communicator, strictly increasing). Every rank of this
  // communicator calls new_group with the same list, in the same order relative to other new_group
  // calls; members get the new communicator (their rank is their index in `ranks`), others nullptr.
  virtual std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) = 0;

 protected:
  virtual Work send_impl(Buffer data, int dst, const SendOptions& o) = 0;
  virtual Work recv_impl(Buffer data, int src, const SendOptions& o) = 0;
  virtual Work broadcast_impl(Buffer data, const BroadcastOptions& o) = 0;
  virtual Work all_reduce_impl(Buffer data, const AllreduceOptions& o) = 0;
  virtual Work reduce_impl(Buffer data, const ReduceOptions& o) = 0;
  virtual Work all_gather_impl(Buffer in, Buffer out, const AllgatherOptions& o) = 0;
  virtual Work reduce_scatter_impl(Buffer in, Buffer out, const ReduceScatterOptions& o) = 0;
  virtual Work all_to_all_impl(Buffer in, Buffer out, const AlltoallOptions& o) = 0;
  virtual Work barrier_impl(const BarrierOptions& o) = 0;
};

}  // namespace ddp::comm
