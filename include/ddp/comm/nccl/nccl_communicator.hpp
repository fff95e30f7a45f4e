// NcclCommunicator: the nccl backend (GPU memory). One NCCL communicator per group, the ncclUniqueId
// exchanged through the store, work on a dedicated stream, completion and failure watched by a thread.
// SPDX-License-Identifier: MIT
//
// How an op runs: the calling thread checks the arguments (buffers must be CUDA device memory), numbers
// the op, records an event on the caller's stream (set_caller_stream; default the legacy default stream)
// and makes the communicator's own stream wait for it, so the op sees everything the caller's kernels
// wrote before the call. It then enqueues the NCCL call on the communicator's stream, records a "done"
// event after it and returns a Work. Nothing blocks the host: the watcher thread completes the Work when
// cudaEventQuery reports the event done. Work::wait() blocks the host until then, so after it returns the
// data is final for every stream.
//
// Example: grad (4 Mi floats on the device), 2 ranks
//   comm.set_caller_stream(compute_stream);                              // backward runs there
//   Work w = comm.all_reduce(Buffer::of(std::span(d_grad, n), MemoryKind::Cuda), {.op = ReduceOp::Avg});
//   ... more kernels on compute_stream overlap with the all-reduce ...
//   w.wait();                                                            // d_grad holds the average
//
// How failure is bounded (DESIGN D9): communicators are created non-blocking (ncclConfig_t::blocking =
// 0), so neither init nor a collective can hang the host. The watcher thread polls the pending events,
// ncclCommGetAsyncError and, every kStorePollInterval while ops are pending, the store's "failed" key.
// On a timeout, an asynchronous NCCL error or a failure another rank published, it calls ncclCommAbort
// (which stops the kernels), fails every pending Work with a CommError/TimeoutError naming the op and
// its sequence number, and publishes its own message under <prefix>error/<rank> so that the other
// ranks stop too. A timeout also names the ranks whose last issued op is behind (from <prefix>state/).
// NCCL does not exchange fingerprints, so a mismatched collective shows up as a timeout (or garbage).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/nccl/failure_report.hpp"
#include "ddp/comm/nccl/nccl_check.hpp"
#include "ddp/comm/stream_ordered.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm {

namespace nccl {

inline constexpr std::chrono::milliseconds kStorePollInterval{200};

// Sets the current CUDA device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    DDP_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) DDP_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace nccl

class NcclCommunicator final : public Communicator, public StreamOrdered {
 public:
  // Creates the NCCL communicator of the job described by `info` on CUDA device `device` (-1: the
  // local rank). Collective: rank 0 publishes the ncclUniqueId in the store, every rank joins. Throws
  // ConfigError without a usable device, TimeoutError when the ranks do not all join within opts.timeout.
  NcclCommunicator(const env::LaunchInfo& info, store::Store& store, const CommOptions& opts = {}, int device = -1)
      : rank_(info.rank), size_(info.world_size), store_(store), opts_(opts),
        device_(device >= 0 ? device : info.local_rank) {
    check_setup();
    const std::int64_t joined = store_.add("ddp/nccl/joined", 1);  // numbers restarted attempts, as in tcp
    prefix_ = ddp::detail::str("ddp/nccl/", (joined - 1) / size_, '/');
    nccl::DeviceGuard g(device_);
    ncclUniqueId id{};
    const std::string key = prefix_ + "uid";
    if (rank_ == 0) {
      DDP_NCCL_CHECK(ncclGetUniqueId(&id));
      store_.set(key, std::span(reinterpret_cast<const std::uint8_t*>(&id), sizeof id));
    } else {
      const std::string keys[] = {key};
      store_.wait(keys, opts_.timeout);
      const store::Bytes b = store_.get(key);
      if (b.size() != sizeof id)
        throw CommError(ddp::detail::str(who(), ": the ncclUniqueId in the store has ", b.size(), " bytes, expected ",
                                         sizeof id, "; another program may use the same store keys."));
      std::memcpy(&id, b.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    finish_init(rc, "ncclCommInitRankConfig");
    start();
  }

  ~NcclCommunicator() override {
    bool broken;
    {
      std::lock_guard lock(mu_);
      broken = failed_;
    }
    if (!broken && size_ > 1) {
      try {  // bounded barrier: a peer must not tear down while we still need it; never throws
        barrier_impl({.timeout = opts_.shutdown_timeout}).wait();
      } catch (const std::exception& e) {
        DDP_LOG_WARN("shutdown barrier of the nccl communicator failed: ", e.what());
      }
    }
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
    std::lock_guard lock(mu_);
    try {
      nccl::DeviceGuard g(device_);
      if (comm_ && !aborted_) destroy_comm();
      if (barrier_buf_) DDP_CUDA_CHECK_NOTHROW(cudaFree(barrier_buf_));
      if (ready_) DDP_CUDA_CHECK_NOTHROW(cudaEventDestroy(ready_));
      if (stream_) DDP_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
    } catch (const std::exception& e) {
      DDP_LOG_WARN("tearing down the nccl communicator: ", e.what());
    }
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view backend() const noexcept override { return "nccl"; }
  int device() const noexcept { return device_; }
  // The communicator's own stream (where the NCCL kernels run).
  cudaStream_t stream() const noexcept { return stream_; }
  // The stream every later op waits for before it starts (the one the caller's kernels use).
  void set_caller_stream(cudaStream_t s) {
    std::lock_guard lock(mu_);
    caller_stream_ = s;
  }
  // StreamOrdered (comm/stream_ordered.hpp): the same two things with the stream as void*.
  void set_caller_stream_handle(void* s) override { set_caller_stream(static_cast<cudaStream_t>(s)); }
  void* op_stream_handle() const noexcept override { return stream_; }
  Work device_all_reduce(Buffer b, const AllreduceOptions& o) override { return all_reduce_impl(b, o); }
  Work device_broadcast(Buffer b, const BroadcastOptions& o) override { return broadcast_impl(b, o); }

  // Device-memory entry points (Buffer::of(span, MemoryKind::Cuda)); the span templates of Communicator
  // stay visible and describe host memory, which this backend rejects with a ValueError.
  using Communicator::all_gather, Communicator::all_reduce, Communicator::all_to_all, Communicator::barrier,
      Communicator::broadcast, Communicator::irecv, Communicator::isend, Communicator::reduce,
      Communicator::reduce_scatter;
  Work isend(Buffer b, int dst, const SendOptions& o = {}) { return send_impl(b, dst, o); }
  Work irecv(Buffer b, int src, const SendOptions& o = {}) { return recv_impl(b, src, o); }
  Work broadcast(Buffer b, const BroadcastOptions& o = {}) { return broadcast_impl(b, o); }
  Work all_reduce(Buffer b, const AllreduceOptions& o = {}) { return all_reduce_impl(b, o); }
  Work reduce(Buffer b, const ReduceOptions& o = {}) { return reduce_impl(b, o); }
  Work all_gather(Buffer in, Buffer out, const AllgatherOptions& o = {}) { return all_gather_impl(in, out, o); }
  Work reduce_scatter(Buffer in, Buffer out, const ReduceScatterOptions& o = {}) {
    return reduce_scatter_impl(in, out, o);
  }
  Work all_to_all(Buffer in, Buffer out, const AlltoallOptions& o = {}) { return all_to_all_impl(in, out, o); }

  // ncclCommSplit of this communicator; collective over all its ranks (non-members pass NOCOLOR).
  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) override {
    int my = -1;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size_ || (i > 0 && ranks[i] <= ranks[i - 1]))
        throw ValueError(ddp::detail::str(who(), ": new_group needs strictly increasing ranks in [0, ", size_,
                                          "), got [", ddp::detail::join(ranks, ", "), "]"));
      if (ranks[i] == rank_) my = static_cast<int>(i);
    }
    if (ranks.empty()) throw ValueError(ddp::detail::str(who(), ": new_group needs at least one rank"));
    const int id = ++groups_;
    ncclComm_t sub = nullptr;
    {
      std::lock_guard lock(mu_);
      if (failed_) throw CommError(ddp::detail::str(who(), ": new_group on a failed communicator: ", first_error_));
      nccl::DeviceGuard g(device_);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t rc = ncclCommSplit(comm_, my >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, my, &sub, &config);
      const auto deadline = Clock::now() + opts_.timeout;
      // Non-blocking split: the parent and (for members) the new communicator report completion.
      try {
        wait_in_progress(comm_, rc, "ncclCommSplit", deadline);
        if (sub) wait_in_progress(sub, ncclInProgress, "ncclCommSplit (new communicator)", deadline);
      } catch (const std::exception& e) {
        if (sub) ncclCommAbort(sub);
        Pending none{};
        fail_locked(ddp::detail::str(who(), ": new_group failed: ", e.what()), false, none);  // aborts comm_
        throw;
      }
    }
    if (my < 0) return nullptr;
    return std::unique_ptr<Communicator>(new NcclCommunicator(sub, my, static_cast<int>(ranks.size()), store_, opts_,
                                                              device_, ddp::detail::str(prefix_, "group", id, '/')));
  }

 protected:
  Work send_impl(Buffer b, int dst, const SendOptions& o) override {
    check_peer(dst, "send to");
    check_cuda(b);
    Fingerprint fp{.kind = OpKind::Send, .dtype = b.dtype, .root = o.tag, .count = b.count};
    return enqueue(fp, o.timeout, dst, [this, b, dst](cudaStream_t s) {
      return ncclSend(b.data, b.count, nccl::datatype_of(b.dtype), dst, comm_, s);
    });
  }
  Work recv_impl(Buffer b, int src, const SendOptions& o) override {
    check_peer(src, "receive from");
    check_cuda(b);
    Fingerprint fp{.kind = OpKind::Recv, .dtype = b.dtype, .root = o.tag, .count = b.count};
    return enqueue(fp, o.timeout, src, [this, b, src](cudaStream_t s) {
      return ncclRecv(b.data, b.count, nccl::datatype_of(b.dtype), src, comm_, s);
    });
  }
  Work broadcast_impl(Buffer b, const BroadcastOptions& o) override {
    check_root(o.root, "broadcast");
    check_cuda(b);
    Fingerprint fp{.kind = OpKind::Broadcast, .dtype = b.dtype, .root = o.root, .count = b.count};
    return enqueue(fp, o.timeout, -1, [this, b, root = o.root](cudaStream_t s) {
      return ncclBroadcast(b.data, b.data, b.count, nccl::datatype_of(b.dtype), root, comm_, s);
    });
  }
  Work all_reduce_impl(Buffer b, const AllreduceOptions& o) override {
    check_cuda(b);
    Fingerprint fp{.kind = OpKind::AllReduce, .dtype = b.dtype, .op = o.op, .count = b.count};
    return enqueue(fp, o.timeout, -1, [this, b, op = o.op](cudaStream_t s) {
      return ncclAllReduce(b.data, b.data, b.count, nccl::datatype_of(b.dtype), nccl::op_of(op), comm_, s);
    });
  }
  Work reduce_impl(Buffer b, const ReduceOptions& o) override {
    check_root(o.root, "reduce");
    check_cuda(b);
    Fingerprint fp{.kind = OpKind::Reduce, .dtype = b.dtype, .op = o.op, .root = o.root, .count = b.count};
    // In place: NCCL writes recvbuff on the root only, so other ranks' buffers stay unchanged.
    return enqueue(fp, o.timeout, -1, [this, b, op = o.op, root = o.root](cudaStream_t s) {
      return ncclReduce(b.data, b.data, b.count, nccl::datatype_of(b.dtype), nccl::op_of(op), root, comm_, s);
    });
  }
  Work all_gather_impl(Buffer in, Buffer out, const AllgatherOptions& o) override {
    check_cuda(in);
    check_cuda(out);
    check_blocks("all_gather", "out", out.count, "in", in.count);
    Fingerprint fp{.kind = OpKind::AllGather, .dtype = in.dtype, .count = in.count};
    return enqueue(fp, o.timeout, -1, [this, in, out](cudaStream_t s) {
      return ncclAllGather(in.data, out.data, in.count, nccl::datatype_of(in.dtype), comm_, s);
    });
  }
  Work reduce_scatter_impl(Buffer in, Buffer out, const ReduceScatterOptions& o) override {
    check_cuda(in);
    check_cuda(out);
    check_blocks("reduce_scatter", "in", in.count, "out", out.count);
    Fingerprint fp{.kind = OpKind::ReduceScatter, .dtype = in.dtype, .op = o.op, .count = out.count};
    return enqueue(fp, o.timeout, -1, [this, in, out, op = o.op](cudaStream_t s) {
      return ncclReduceScatter(in.data, out.data, out.count, nccl::datatype_of(in.dtype), nccl::op_of(op), comm_, s);
    });
  }
  Work all_to_all_impl(Buffer in, Buffer out, const AlltoallOptions& o) override {
    check_cuda(in);
    check_cuda(out);
    if (in.count != out.count || in.count % static_cast<std::size_t>(size_) != 0)
      throw ValueError(ddp::detail::str(who(), ": all_to_all needs in and out of the same size, a multiple of size() = ",
                                        size_, "; got in ", in.count, " and out ", out.count, " elements"));
    Fingerprint fp{.kind = OpKind::AllToAll, .dtype = in.dtype, .count = in.count};
    // One group of sends and receives; the own block is a device-to-device copy.
    return enqueue(fp, o.timeout, -1, [this, in, out](cudaStream_t s) {
      const std::size_t block = in.count / static_cast<std::size_t>(size_), bb = block * dtype_size(in.dtype);
      const ncclDataType_t t = nccl::datatype_of(in.dtype);
      DDP_CUDA_CHECK(cudaMemcpyAsync(out.bytes_ptr() + static_cast<std::size_t>(rank_) * bb,
                                     in.bytes_ptr() + static_cast<std::size_t>(rank_) * bb, bb,
                                     cudaMemcpyDeviceToDevice, s));
      DDP_NCCL_CHECK(ncclGroupStart());
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        const std::size_t off = static_cast<std::size_t>(j) * bb;
        DDP_NCCL_CHECK(ncclSend(in.bytes_ptr() + off, block, t, j, comm_, s));
        DDP_NCCL_CHECK(ncclRecv(out.bytes_ptr() + off, block, t, j, comm_, s));
      }
      return ncclGroupEnd();
    });
  }
  // A one-element all-reduce on a device scratch word.
  Work barrier_impl(const BarrierOptions& o) override {
    Fingerprint fp{.kind = OpKind::Barrier, .dtype = DType::U8, .op = ReduceOp::Max};
    return enqueue(fp, o.timeout, -1, [this](cudaStream_t s) {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclUint8, ncclMax, comm_, s);
    });
  }

 private:
  using Clock = std::chrono::steady_clock;
  using Launch = std::function<ncclResult_t(cudaStream_t)>;
  struct Pending {  // an enqueued op, owned by the watcher until its event completes
    std::shared_ptr<detail::WorkState> state;
    Fingerprint fp;
    std::chrono::milliseconds timeout;
    Clock::time_point deadline;
    cudaEvent_t done = nullptr;
  };

  // A member of a new_group: the split communicator is already created.
  NcclCommunicator(ncclComm_t comm, int rank, int size, store::Store& store, const CommOptions& opts, int device,
                   std::string prefix)
      : rank_(rank), size_(size), store_(store), opts_(opts), device_(device), prefix_(std::move(prefix)), comm_(comm) {
    start();
  }

  std::string who() const { return ddp::detail::str("ddp[rank ", rank_, '/', size_, ']'); }

  void check_setup() const {
    if (size_ < 1 || rank_ < 0 || rank_ >= size_)
      throw ConfigError(ddp::detail::str("ddp: rank ", rank_, " is not in [0, world_size=", size_,
                                         "); check RANK/WORLD_SIZE (--rank/--world-size)."));
    if (opts_.timeout.count() <= 0)
      throw ConfigError(ddp::detail::str("ddp: the communicator timeout must be positive, got ", opts_.timeout.count(),
                                         " ms; set --timeout-ms (DDP_TIMEOUT_MS)."));
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    if (device_ < 0 || device_ >= n)
      throw ConfigError(ddp::detail::str(who(), ": --backend nccl needs CUDA device ", device_,
                                         " (the local rank), but ", n, " device(s) are visible; check "
                                         "CUDA_VISIBLE_DEVICES and --nproc-per-node, or use --backend tcp."));
  }

  void check_cuda(const Buffer& b) const {
    if (b.memory != MemoryKind::Cuda)
      throw ValueError(ddp::detail::str(who(), ": the nccl backend reaches CUDA device memory only, but got a CPU "
                                               "buffer; pass Buffer::of(span, MemoryKind::Cuda) with a device pointer, "
                                               "or use --backend tcp for host memory."));
  }
  void check_root(int root, std::string_view op) const {
    if (root < 0 || root >= size_)
      throw ValueError(ddp::detail::str(who(), ": ", op, " root ", root, " is out of range [0, ", size_, ")"));
  }
  void check_peer(int peer, std::string_view what) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw ValueError(ddp::detail::str(who(), ": cannot ", what, " rank ", peer, ": peers are the other ranks in [0, ",
                                        size_, ")"));
  }
  void check_blocks(std::string_view op, std::string_view big, std::size_t big_n, std::string_view small,
                    std::size_t small_n) const {
    if (big_n != small_n * static_cast<std::size_t>(size_))
      throw ValueError(ddp::detail::str(who(), ": ", op, " needs ", big, ".size() == size() * ", small, ".size() = ",
                                        size_, " * ", small_n, " = ", small_n * static_cast<std::size_t>(size_),
                                        ", but ", big, " has ", big_n, " elements"));
  }

  // After a non-blocking NCCL call: polls ncclCommGetAsyncError while it reports ncclInProgress.
  void wait_in_progress(ncclComm_t comm, ncclResult_t rc, std::string_view what, Clock::time_point deadline) {
    while (rc == ncclInProgress) {
      if (Clock::now() > deadline) {  // the caller aborts the communicator
        throw TimeoutError(ddp::detail::str(who(), ": ", what, " did not finish within ", opts_.timeout.count(),
                                            " ms; a rank may be missing or stuck. Raise --timeout-ms (DDP_TIMEOUT_MS) "
                                            "if startup is slow."));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (const ncclResult_t q = ncclCommGetAsyncError(comm, &rc); q != ncclSuccess) rc = q;
    }
    if (rc != ncclSuccess)
      throw CommError(ddp::detail::str(who(), ": ", what, " failed: ", nccl::error_text(rc, comm)));
  }

  void finish_init(ncclResult_t rc, std::string_view what) {
    try {
      wait_in_progress(comm_, rc, what, Clock::now() + opts_.timeout);
    } catch (...) {
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

  void start() {
    nccl::DeviceGuard g(device_);
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    DDP_CUDA_CHECK(cudaMalloc(&barrier_buf_, 1));
    send_seq_.assign(static_cast<std::size_t>(size_), 0);
    recv_seq_.assign(static_cast<std::size_t>(size_), 0);
    watcher_ = std::thread([this] { watch(); });
    DDP_LOG_DEBUG(who(), ": nccl communicator ready on device ", device_, " (store prefix ", prefix_, ")");
  }

  void destroy_comm() {
    const ncclResult_t rc = ncclCommFinalize(comm_);
    try {
      wait_in_progress(comm_, rc, "ncclCommFinalize", Clock::now() + opts_.shutdown_timeout);
      ncclCommDestroy(comm_);
    } catch (const std::exception& e) {
      DDP_LOG_WARN(e.what());
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }

  // Numbers the op, orders it after the caller's stream, launches it and hands it to the watcher.
  Work enqueue(Fingerprint fp, std::chrono::milliseconds timeout, int peer, const Launch& launch) {
    std::unique_lock lock(mu_);
    if (fp.kind == OpKind::Send) fp.seq = ++send_seq_[peer];
    else if (fp.kind == OpKind::Recv) fp.seq = ++recv_seq_[peer];
    else fp.seq = ++seq_;
    std::string label = ddp::detail::str(who(), ": ", fp.label());
    if (peer >= 0) label += ddp::detail::str(fp.kind == OpKind::Send ? " to rank " : " from rank ", peer);
    if (failed_)
      return Work::completed(label, std::make_exception_ptr(CommError(ddp::detail::str(
                                        label, " was not run: this communicator failed earlier: ", first_error_))));
    Pending p{std::make_shared<detail::WorkState>(label), fp, timeout.count() > 0 ? timeout : opts_.timeout, {}, nullptr};
    p.deadline = Clock::now() + p.timeout;
    Work work(p.state);
    try {
      nccl::DeviceGuard g(device_);
      DDP_CUDA_CHECK(cudaEventRecord(ready_, caller_stream_));
      DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
      wait_in_progress(comm_, launch(stream_), fp.label(), p.deadline);
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming));
      DDP_CUDA_CHECK(cudaEventRecord(p.done, stream_));
    } catch (const std::exception& e) {
      if (p.done) cudaEventDestroy(p.done);
      p.done = nullptr;
      const bool timed_out = dynamic_cast<const TimeoutError*>(&e) != nullptr;
      fail_locked(ddp::detail::str(label, " failed: ", e.what()), timed_out, p);
      return work;
    }
    pending_.push_back(std::move(p));
    lock.unlock();
    cv_.notify_all();
    return work;
  }

  // How the watcher works: ops complete in issue order on one stream, so it polls the oldest pending
  // event (every 20 us while something is pending), checks ncclCommGetAsyncError and each op's deadline,
  // and every kStorePollInterval asks the store whether another rank failed.
  void watch() {
    try {
      DDP_CUDA_CHECK(cudaSetDevice(device_));
    } catch (const std::exception& e) {
      DDP_LOG_ERROR(who(), ": the nccl watcher cannot select device ", device_, ": ", e.what());
    }
    auto next_store_poll = Clock::now() + nccl::kStorePollInterval;
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !pending_.empty() || stop_; });
      if (pending_.empty()) return;  // stop_ with nothing pending
      while (!pending_.empty()) {
        const cudaError_t q = cudaEventQuery(pending_.front().done);
        if (q == cudaErrorNotReady) break;
        Pending p = std::move(pending_.front());
        pending_.pop_front();
        cudaEventDestroy(p.done);
        if (q == cudaSuccess) p.state->complete();
        else fail_locked(ddp::detail::str(p.state->label, " failed: ", ddp::detail::cuda_error_text(
                                              "cudaEventQuery", q, __FILE__, __LINE__)), false, p);
      }
      if (pending_.empty()) continue;
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
        fail_all_locked(ddp::detail::str(pending_.front().state->label, " failed: NCCL reported ",
                                         nccl::error_text(async, comm_)), false);
        continue;
      }
      const auto now = Clock::now();
      if (now > pending_.front().deadline) {
        const Pending& f = pending_.front();
        std::string msg = ddp::detail::str(f.state->label, " timed out after ", f.timeout.count(), " ms. Raise "
                                           "--timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.");
        if (!f.fp.is_p2p()) {
          const Fingerprint fp = f.fp;
          lock.unlock();
          msg += nccl::timeout_report(store_, prefix_, rank_, size_, fp, opts_.timeout);
          lock.lock();
        }
        if (!pending_.empty()) fail_all_locked(msg, true);  // enqueue may have failed them meanwhile
        continue;
      }
      if (now > next_store_poll && size_ > 1) {
        next_store_poll = now + nccl::kStorePollInterval;
        lock.unlock();
        std::string other = nccl::peer_failure(store_, prefix_, rank_, size_);
        lock.lock();
        if (!other.empty() && !pending_.empty()) {
          fail_all_locked(ddp::detail::str(pending_.front().state->label, " failed: ", other), false);
          continue;
        }
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
    }
  }

  // Aborts the communicator, fails every pending op with `msg`, publishes it. mu_ held.
  void fail_all_locked(const std::string& msg, bool timed_out) {
    Pending oldest = std::move(pending_.front());  // msg names it
    pending_.pop_front();
    if (oldest.done) cudaEventDestroy(oldest.done);
    fail_locked(msg, timed_out, oldest);
  }

  // Marks the communicator failed and publishes msg (first failure only), aborts the NCCL communicator,
  // fails `p` with msg and every other pending op with a message quoting it. mu_ held.
  void fail_locked(const std::string& msg, bool timed_out, Pending& p) {
    if (!failed_) {
      failed_ = true;
      first_error_ = msg;
      nccl::publish_failure(store_, prefix_, rank_, msg);
    }
    if (comm_ && !aborted_) {
      ncclCommAbort(comm_);  // stops the kernels of every pending op; comm_ is gone afterwards
      aborted_ = true;
    }
    if (p.state) p.state->complete(error_of(msg, timed_out));
    while (!pending_.empty()) {
      Pending q = std::move(pending_.front());
      pending_.pop_front();
      if (q.done) cudaEventDestroy(q.done);
      q.state->complete(error_of(ddp::detail::str(q.state->label, " was not completed: ", msg), timed_out));
    }
  }

  static std::exception_ptr error_of(const std::string& msg, bool timed_out) {
    if (timed_out) return std::make_exception_ptr(TimeoutError(msg));
    return std::make_exception_ptr(CommError(msg));
  }

  int rank_, size_;
  store::Store& store_;
  CommOptions opts_;
  int device_;
  std::string prefix_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;         // the communicator's stream
  cudaEvent_t ready_ = nullptr;           // recorded on the caller's stream before each op
  void* barrier_buf_ = nullptr;           // one device byte for barrier()
  int groups_ = 0;

  std::mutex mu_;  // guards everything below, and every NCCL call on comm_
  std::condition_variable cv_;
  cudaStream_t caller_stream_ = nullptr;  // legacy default stream unless set_caller_stream
  std::deque<Pending> pending_;
  bool stop_ = false;
  bool failed_ = false;
  bool aborted_ = false;
  std::string first_error_;
  std::uint64_t seq_ = 0;
  std::vector<std::uint64_t> send_seq_, recv_seq_;
  std::thread watcher_;
};

}  // namespace ddp::comm
