// Vocabulary of the collectives: ReduceOp, the op kinds and their fingerprints, per-call option
// structs, CommOptions, the type-erased BufferRef, and OpCall: one checked call as every backend
// receives it.
// SPDX-License-Identifier: MIT
//
// Options are filled with designated initializers; a timeout of 0 means "the communicator's
// default" (CommOptions::timeout), which is always finite:
//   comm.all_reduce(grad.view(), {.op = ddp::comm::ReduceOp::Avg});
//   comm.broadcast(weights.view(), {.root = 0, .timeout = std::chrono::seconds(30)});
//   comm.all_reduce(d_grad.view(), {.op = ReduceOp::Avg, .stream = exec.stream});  // nccl
// `stream` (a cudaStream_t, null: the legacy default stream) orders an op on device memory with the
// caller's kernels, without the host (comm/communicator.hpp). Communicators on host memory (tcp,
// mpi without CommOptions::cuda_device) take no stream: a non-null one is a ValueError rather than
// an argument silently ignored.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/core/dtype.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::comm {

enum class ReduceOp : std::uint8_t { Sum, Avg, Min, Max, Product };

inline constexpr std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

// What an op is, for fingerprints and messages. Send and Recv are one kind on the wire (a receive
// matches a send); Recv exists so that messages read naturally.
enum class OpKind : std::uint8_t {
  Send,
  Recv,
  Broadcast,
  AllReduce,
  Reduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Barrier
};

inline constexpr std::string_view op_name(OpKind k) noexcept {
  switch (k) {
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::Reduce: return "reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::Barrier: return "barrier";
  }
  return "?";
}

// Identity of one op as every rank must see it (docs/decisions/0009). `count` is the per-rank
// element count of the user's input (all_gather: elements each rank contributes; reduce_scatter:
// elements each rank receives); `root` is the root rank, the tag of a send/recv, or -1.
struct Fingerprint {
  OpKind kind = OpKind::Barrier;
  DType dtype = DType::U8;
  ReduceOp op = ReduceOp::Sum;
  std::int64_t root = -1;
  std::uint64_t count = 0;
  // collectives: per communicator, from 1; send/recv: per (sender, receiver) pair
  std::uint64_t seq = 0;

  bool has_reduce_op() const noexcept {
    return kind == OpKind::AllReduce || kind == OpKind::Reduce || kind == OpKind::ReduceScatter;
  }
  bool is_p2p() const noexcept { return kind == OpKind::Send || kind == OpKind::Recv; }

  // "all_reduce #17 (F32 x 4194304)", "broadcast #3 (F32 x 4, root 0)", "send #2 (I64 x 1, tag 0)".
  std::string label() const {
    std::string extra;
    if (is_p2p())
      extra = ddp::detail::str(", tag ", root);
    else if (kind == OpKind::Broadcast || kind == OpKind::Reduce)
      extra = ddp::detail::str(", root ", root);
    if (kind == OpKind::Barrier) return ddp::detail::str(op_name(kind), " #", seq);
    return ddp::detail::str(op_name(kind), " #", seq, " (", dtype_name(dtype), " x ", count, extra,
                            ")");
  }
  // The label plus the reduce op, for mismatch messages: "all_reduce #3 (F32 x 4, sum)".
  std::string full_label() const {
    if (!has_reduce_op()) return label();
    std::string l = label();
    l.insert(l.size() - 1, ddp::detail::str(", ", reduce_op_name(op)));
    return l;
  }
};

// Per-call options. timeout 0: the communicator's default. stream: see the file comment.
struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;
  // The caller waits for the Work at once (torch's default async_op=False): tcp and mpi may then
  // run it on the calling thread at any size (runs_inline) and return it complete, saving the
  // progress thread's wake-up and hand-back (~16 us per op at 256 KiB on a loaded 2-core host).
  // nccl ignores it.
  bool blocking = false;
};
struct BroadcastOptions {
  int root = 0;
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;
};
struct ReduceOptions {
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;
};
struct AllgatherOptions {
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;
};
struct AlltoallOptions {
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;
};
struct BarrierOptions {
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;
};
struct SendOptions {  // also for recv: tags must match
  std::int64_t tag = 0;
  std::chrono::milliseconds timeout{0};
  void* stream = nullptr;
};

// PyTorch's default: 5 minutes
inline constexpr std::chrono::milliseconds kDefaultCommTimeout{300'000};

// Communicator-wide settings. Programs fill them from flags: --timeout-ms (DDP_TIMEOUT_MS) and
// --socket-ifname (DDP_SOCKET_IFNAME).
struct CommOptions {
  std::chrono::milliseconds timeout = kDefaultCommTimeout;  // every op's default; must be > 0
  // tcp: the interface to listen on ("eth0"); empty: the one that routes to master_addr
  std::string socket_ifname;
  // All-reduces of at most this many bytes take the latency-bound algorithm: tcp's recursive
  // doubling (larger: the ring), shm's one-barrier reduce.
  std::size_t small_allreduce_bytes = 64 * 1024;
  // tcp and mpi: an op of at most this many bytes issued while nothing is queued runs on the
  // calling thread (saves tens of us of hand-off); larger ones run on the progress thread so that
  // they overlap with the caller's compute. 0 disables inline execution.
  std::size_t inline_max_bytes = 64 * 1024;
  // tcp and mpi: the CPUs the progress thread may run on (empty: anywhere). A core the training
  // threads leave free lets communication overlap with compute (Horovod's
  // HOROVOD_THREAD_AFFINITY). From --comm-cpus / DDP_COMM_CPUS ("1" or "0-3,6"); a CPU the kernel
  // refuses is a ConfigError.
  std::vector<int> progress_cpus;
  // Bound on the destructor's barrier or drain (tcp, nccl, staging): a program never hangs at exit.
  std::chrono::milliseconds shutdown_timeout{10'000};
  // tcp and mpi: when every rank runs on one host, collectives go through a shared-memory segment
  // (comm/shm/collectives.hpp, docs/decisions/0055): on tcp all-reduce, broadcast, all-gather and
  // barrier (the sockets stay open to detect dead peers), on mpi all-reduce, broadcast and barrier.
  // From --shm / DDP_SHM (0 disables). Every rank must pass the same value.
  bool shm = true;
  // mpi: exchange each collective's fingerprint first, so that mismatched collectives fail on
  // every rank with a message instead of meeting inside MPI (one 32-byte message to each peer per
  // op; docs/decisions/0038). tcp checks every frame header and ignores this. Every rank must pass
  // the same value.
  bool check_fingerprints = true;
  // The CUDA device the collectives' tensors live on; -1: host memory. With tcp/gloo or mpi,
  // make_communicator then stages device buffers through pinned host memory
  // (comm/staging/staged_communicator.hpp); nccl uses this device instead of the local rank. From
  // --device cuda (the local rank's GPU).
  int cuda_device = -1;
};

// Where a BufferRef's memory lives; Communicator::memory() says which one a backend reaches.
enum class MemoryKind : std::uint8_t { Cpu, Cuda };

inline constexpr std::string_view memory_name(MemoryKind m) noexcept {
  return m == MemoryKind::Cpu ? "host memory" : "CUDA device memory";
}

// The type-erased view every backend receives: pointer + element count + dtype + memory kind. A
// reference: the caller owns the memory (unlike nn::Buffer, a module's own tensor). Inputs that the
// op only reads are passed as BufferRef too; backends never write them.
struct BufferRef {
  void* data = nullptr;
  std::size_t count = 0;  // elements
  DType dtype = DType::F32;
  MemoryKind memory = MemoryKind::Cpu;

  std::size_t bytes() const noexcept { return count * dtype_size(dtype); }
  std::byte* bytes_ptr() const noexcept { return static_cast<std::byte*>(data); }

  template <class T, Device D>
  static BufferRef of(TensorView<T, D> v) {
    return {.data = const_cast<std::remove_const_t<T>*>(v.data()),
            .count = static_cast<std::size_t>(v.numel()),
            .dtype = dtype_of<std::remove_const_t<T>>,
            .memory = D::host_memory ? MemoryKind::Cpu : MemoryKind::Cuda};
  }
};

// One call as every backend receives it, after Communicator checked its arguments. E.g.
// all_reduce of 4 floats with Avg -> {.fp = {AllReduce, F32, Avg, root -1, count 4, seq 0},
// .in = .out = the buffer, .peer = -1, .timeout = 0ms}
struct OpCall {
  // kind, dtype, reduce op, root (send/recv: tag), count; seq 0 until the backend numbers it
  Fingerprint fp;
  // the data of in-place ops (broadcast, all_reduce, reduce, send, recv), else the input
  BufferRef in;
  // all_gather, reduce_scatter, all_to_all: the output; in-place ops: the same as `in`
  BufferRef out;
  int peer = -1;                         // send: the destination; recv: the source
  std::chrono::milliseconds timeout{0};  // 0: CommOptions::timeout
  // cudaStream_t (device-memory backends); null: the legacy default stream
  void* stream = nullptr;
  bool blocking = false;  // all_reduce: AllreduceOptions::blocking
};

// Whether an op that moves `bytes` may run on the calling thread when nothing else is queued (tcp
// and mpi): up to inline_max_bytes, or at any size when blocking and inline_max_bytes > 0.
inline bool runs_inline(std::size_t bytes, bool blocking, std::size_t inline_max_bytes) noexcept {
  return bytes <= inline_max_bytes || (blocking && inline_max_bytes > 0);
}

// Element types the collectives accept: float, double, bfloat16, half, int32, int64, uint8.
template <class T>
concept CommElement = requires {
  DTypeOf<std::remove_cv_t<T>>::value;
};

}  // namespace ddp::comm
