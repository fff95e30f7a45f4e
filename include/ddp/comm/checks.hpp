// What every backend does before it runs an op, written once: a new communicator's setup checks
// (check_setup) and store keys (attempt_prefix), every call's preconditions (CallChecks, applied
// by Communicator before a backend sees the call), and the numbering and naming of ops
// (OpSequence).
// SPDX-License-Identifier: MIT
//
// So every backend raises the same ValueError words for the same mistake:
//   ddp[rank 0/2]: broadcast root 2 is out of range [0, 2)
//   ddp[rank 0/2]: cannot send to rank 0: peers are the other ranks in [0, 2)
// and names ops the same way in Work labels and failures:
//   ddp[rank 0/4]: all_reduce #17 (F32 x 4)
//   ddp[rank 0/4]: send #2 (I64 x 1, tag 0) to rank 3
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/types.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm {

// "ddp[rank 2/4]": how every message of a communicator starts.
inline std::string who(int rank, int size) {
  return ddp::detail::str("ddp[rank ", rank, '/', size, ']');
}

// Returns rank, so that a constructor can check in its first member initializer. Throws
// ConfigError naming the variable or flag that fixes it.
inline int check_setup(int rank, int size, const CommOptions& opts) {
  if (size < 1 || rank < 0 || rank >= size)
    throw ConfigError(ddp::detail::str("ddp: rank ", rank, " is not in [0, world_size=", size,
                                       "); check RANK/WORLD_SIZE (--rank/--world-size)."));
  if (opts.timeout.count() <= 0)
    throw ConfigError(ddp::detail::str("ddp: the communicator timeout must be positive, got ",
                                       opts.timeout.count(),
                                       " ms; set --timeout-ms (DDP_TIMEOUT_MS)."));
  return rank;
}

// "ddp/<backend>/<attempt>/", the world communicator's keys. A job restarted in place (torchrun
// keeps its store) must not read the previous attempt's keys; every rank joins once per attempt,
// so the join count numbers attempts alike everywhere. Collective: every rank calls it.
inline std::string attempt_prefix(store::Store& store, std::string_view backend, int size) {
  const std::int64_t joined = store.add(ddp::detail::str("ddp/", backend, "/joined"), 1);
  return ddp::detail::str("ddp/", backend, '/', (joined - 1) / size, '/');
}

// Each function throws ValueError at the call, before anything is sent, or returns the checked
// OpCall.
class CallChecks {
 public:
  CallChecks(int rank, int size, std::string_view backend, MemoryKind memory) noexcept
      : rank_(rank), size_(size), backend_(backend), memory_(memory) {}

  OpCall send(BufferRef b, int dst, const SendOptions& o) const {
    peer(dst, "send to");
    reaches("send", b, o.stream);
    return p2p(OpKind::Send, b, dst, o);
  }
  OpCall recv(BufferRef b, int src, const SendOptions& o) const {
    peer(src, "receive from");
    reaches("recv", b, o.stream);
    return p2p(OpKind::Recv, b, src, o);
  }
  OpCall broadcast(BufferRef b, const BroadcastOptions& o) const {
    root("broadcast", o.root);
    reaches("broadcast", b, o.stream);
    return in_place({.kind = OpKind::Broadcast, .dtype = b.dtype, .root = o.root, .count = b.count},
                    b, o);
  }
  OpCall all_reduce(BufferRef b, const AllreduceOptions& o) const {
    reaches("all_reduce", b, o.stream);
    OpCall c =
        in_place({.kind = OpKind::AllReduce, .dtype = b.dtype, .op = o.op, .count = b.count}, b, o);
    c.blocking = o.blocking;
    return c;
  }
  OpCall reduce(BufferRef b, const ReduceOptions& o) const {
    root("reduce", o.root);
    reaches("reduce", b, o.stream);
    return in_place(
        {.kind = OpKind::Reduce, .dtype = b.dtype, .op = o.op, .root = o.root, .count = b.count}, b,
        o);
  }
  // Fingerprint count: what each rank contributes (in.count).
  OpCall all_gather(BufferRef in, BufferRef out, const AllgatherOptions& o) const {
    reaches("all_gather", in, o.stream);
    reaches("all_gather", out, o.stream);
    blocks("all_gather", "out", out.count, "in", in.count);
    return in_out({.kind = OpKind::AllGather, .dtype = in.dtype, .count = in.count}, in, out, o);
  }
  // Fingerprint count: what each rank receives (out.count).
  OpCall reduce_scatter(BufferRef in, BufferRef out, const ReduceScatterOptions& o) const {
    reaches("reduce_scatter", in, o.stream);
    reaches("reduce_scatter", out, o.stream);
    blocks("reduce_scatter", "in", in.count, "out", out.count);
    return in_out(
        {.kind = OpKind::ReduceScatter, .dtype = in.dtype, .op = o.op, .count = out.count}, in, out,
        o);
  }
  OpCall all_to_all(BufferRef in, BufferRef out, const AlltoallOptions& o) const {
    reaches("all_to_all", in, o.stream);
    reaches("all_to_all", out, o.stream);
    if (in.count != out.count || in.count % static_cast<std::size_t>(size_) != 0)
      throw ValueError(
          ddp::detail::str(who(rank_, size_),
                           ": all_to_all needs in and out of the same size, a multiple "
                           "of size() = ",
                           size_, "; got in ", in.count, " and out ", out.count, " elements"));
    return in_out({.kind = OpKind::AllToAll, .dtype = in.dtype, .count = in.count}, in, out, o);
  }
  // A barrier is a one-byte max all-reduce on every backend that needs data to synchronise.
  OpCall barrier(const BarrierOptions& o) const {
    reaches("barrier", BufferRef{.memory = memory_}, o.stream);
    return {.fp = {.kind = OpKind::Barrier, .dtype = DType::U8, .op = ReduceOp::Max},
            .timeout = o.timeout,
            .stream = o.stream};
  }

  // new_group's ranks: strictly increasing, at least one. Returns this rank's index in them (its
  // group rank), or -1 when it is not a member.
  int group_index(const std::vector<int>& ranks) const {
    if (ranks.empty())
      throw ValueError(ddp::detail::str(who(rank_, size_), ": new_group needs at least one rank"));
    int index = -1;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size_ || (i > 0 && ranks[i] <= ranks[i - 1]))
        throw ValueError(ddp::detail::str(who(rank_, size_),
                                          ": new_group needs strictly increasing ranks in [0, ",
                                          size_, "), got [", ddp::detail::join(ranks, ", "), "]"));
      if (ranks[i] == rank_) index = static_cast<int>(i);
    }
    return index;
  }

 private:
  template <class Options>
  static OpCall in_place(Fingerprint fp, BufferRef b, const Options& o) {
    return {.fp = fp, .in = b, .out = b, .timeout = o.timeout, .stream = o.stream};
  }
  template <class Options>
  static OpCall in_out(Fingerprint fp, BufferRef in, BufferRef out, const Options& o) {
    return {.fp = fp, .in = in, .out = out, .timeout = o.timeout, .stream = o.stream};
  }
  static OpCall p2p(OpKind kind, BufferRef b, int peer, const SendOptions& o) {
    return {.fp = {.kind = kind, .dtype = b.dtype, .root = o.tag, .count = b.count},
            .in = b,
            .out = b,
            .peer = peer,
            .timeout = o.timeout,
            .stream = o.stream};
  }

  // The buffer lives where this backend reaches, and a stream comes only with device memory.
  void reaches(std::string_view op, const BufferRef& b, void* stream) const {
    if (b.memory != memory_) {
      const std::string_view fix =
          memory_ == MemoryKind::Cpu
              ? "copy the tensor to the host (ddp::to<Cpu>), or make the communicator for device "
                "memory "
                "(--backend nccl, or CommOptions::cuda_device)"
              : "pass a TensorView<T, Cuda> over device memory, or use a communicator "
                "made for host memory (--backend tcp without CommOptions::cuda_device)";
      throw ValueError(ddp::detail::str(who(rank_, size_), ": ", op, " got ", memory_name(b.memory),
                                        ", but the ", backend_, " backend reaches ",
                                        memory_name(memory_), " only; ", fix, '.'));
    }
    if (stream && memory_ == MemoryKind::Cpu)
      throw ValueError(ddp::detail::str(
          who(rank_, size_), ": ", op, " got a CUDA stream (.stream), but the ", backend_,
          " backend works on host memory, which streams do not order; leave .stream "
          "null, or make the communicator for device memory (--backend nccl, or "
          "CommOptions::cuda_device)."));
  }
  void root(std::string_view op, int r) const {
    if (r < 0 || r >= size_)
      throw ValueError(ddp::detail::str(who(rank_, size_), ": ", op, " root ", r,
                                        " is out of range [0, ", size_, ")"));
  }
  void peer(int p, std::string_view what) const {
    if (p < 0 || p >= size_ || p == rank_)
      throw ValueError(ddp::detail::str(who(rank_, size_), ": cannot ", what, " rank ", p,
                                        ": peers are the other ranks in [0, ", size_, ")"));
  }
  // big.size() == size() * small.size(), e.g. all_gather's out and in.
  void blocks(std::string_view op, std::string_view big, std::size_t big_n, std::string_view small,
              std::size_t small_n) const {
    const std::size_t want = small_n * static_cast<std::size_t>(size_);
    if (big_n != want)
      throw ValueError(ddp::detail::str(who(rank_, size_), ": ", op, " needs ", big,
                                        ".size() == size() * ", small, ".size() = ", size_, " * ",
                                        small_n, " = ", want, ", but ", big, " has ", big_n,
                                        " elements"));
  }

  int rank_, size_;
  std::string_view backend_;
  MemoryKind memory_;
};

// Collectives share one sequence per communicator, from 1; send and recv count per (peer,
// direction), so that a rank's n-th send to rank j matches rank j's n-th receive from it. Not
// thread-safe: a backend calls it under the lock that orders its queue, so numbers follow issue
// order.
class OpSequence {
 public:
  OpSequence(int rank, int size)
      : who_(comm::who(rank, size)),
        send_(static_cast<std::size_t>(size), 0),
        recv_(static_cast<std::size_t>(size), 0) {}

  // Sets call.fp.seq; returns the op's label for Work and messages.
  std::string number(OpCall& call) {
    Fingerprint& fp = call.fp;
    if (fp.kind == OpKind::Send)
      fp.seq = ++send_[static_cast<std::size_t>(call.peer)];
    else if (fp.kind == OpKind::Recv)
      fp.seq = ++recv_[static_cast<std::size_t>(call.peer)];
    else
      fp.seq = last_collective_ = last_collective_ + 1;
    std::string label = ddp::detail::str(who_, ": ", fp.label());
    if (fp.is_p2p())
      label += ddp::detail::str(fp.kind == OpKind::Send ? " to rank " : " from rank ", call.peer);
    return label;
  }

  // The number of the last collective issued (0 before the first).
  std::uint64_t last_collective() const noexcept { return last_collective_; }
  const std::string& who() const noexcept { return who_; }

 private:
  std::string who_;
  std::uint64_t last_collective_ = 0;
  std::vector<std::uint64_t> send_, recv_;
};

}  // namespace ddp::comm
