// NcclCommunicator: the nccl backend (GPU memory). One NCCL communicator per group, the
// ncclUniqueId exchanged through the store, work on a dedicated stream, completion and failure
// watched by a thread.
// SPDX-License-Identifier: MIT
//
// An op (arguments checked by Communicator: CUDA device memory) gets its number (OpSequence) under
// the lock; an event recorded on the caller's stream (OpCall::stream; null: the legacy default
// stream) makes the communicator's stream wait, so the op sees what the caller's kernels wrote.
// The NCCL call runs on the communicator's stream, and the caller's stream waits for a "done"
// event after it: stream-ordered, the host never blocks. The watcher thread completes the Work
// when cudaEventQuery reports "done"; Work::wait() blocks the host until then.
//
// Example: grad (4 Mi floats on the device), 2 ranks; backward and the optimizer run on `compute`
//   Work w = comm.all_reduce(d_grad.view(), {.op = ReduceOp::Avg, .stream = compute});
//   sgd_step<<<..., compute>>>(...);   // enqueued at once, runs after the all-reduce; no host wait
//   ... at the end of the step: w.wait() raises a failure of the op
//
// Bounded failure (docs/decisions/0009): communicators are non-blocking (ncclConfig_t::blocking =
// 0), so neither init nor a collective can hang the host. The watcher polls the pending events,
// ncclCommGetAsyncError and, every kStorePollInterval while ops are pending, whether another rank
// published a failure (comm/failure_report.hpp). On a timeout, an asynchronous NCCL error or
// another rank's failure it calls ncclCommAbort (stops the kernels), fails every pending Work with
// a CommError/TimeoutError naming the op and its sequence number, and publishes its message and
// position so the others stop too; a timeout names the ranks that are behind. NCCL exchanges no
// fingerprints: a mismatched collective shows up as a timeout (or garbage).
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

#include "ddp/comm/checks.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/failure_report.hpp"
#include "ddp/comm/failure_state.hpp"
#include "ddp/comm/nccl/nccl_check.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/store/store.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/current_device.hpp"

namespace ddp::comm {

namespace nccl {

inline constexpr std::chrono::milliseconds kStorePollInterval{200};

}  // namespace nccl

class NcclCommunicator final : public Communicator {
 public:
  // On CUDA device `device` (-1: the local rank). Collective: rank 0 publishes the ncclUniqueId in
  // the store, every rank joins. Throws ConfigError without a usable device, TimeoutError when the
  // ranks do not all join within opts.timeout.
  NcclCommunicator(const env::LaunchInfo& info, store::Store& store, const CommOptions& opts = {},
                   int device = -1)
      : rank_(check_setup(info.rank, info.world_size, opts)),
        size_(info.world_size),
        store_(store),
        opts_(opts),
        device_(usable_device(device >= 0 ? device : info.local_rank, info.rank, info.world_size)),
        prefix_(attempt_prefix(store, "nccl", size_)),
        report_(store, prefix_, rank_, size_),
        sequence_(rank_, size_) {
    CudaDeviceGuard g(device_);
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
        throw CommError(ddp::detail::str(who(rank_, size_), ": the ncclUniqueId in the store has ",
                                         b.size(), " bytes, expected ", sizeof id,
                                         "; another program may use the same store keys."));
      std::memcpy(&id, b.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    finish_init(rc, "ncclCommInitRankConfig");
    start();
  }

  ~NcclCommunicator() override {
    if (!failure_.failed() && size_ > 1) {
      try {  // bounded barrier: a peer must not tear down while we still need it; never throws
        barrier({.timeout = opts_.shutdown_timeout}).wait();
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
      CudaDeviceGuard g(device_);
      if (comm_ && !aborted_) destroy_comm();
      if (barrier_buf_) DDP_CUDA_CHECK_NOTHROW(cudaFree(barrier_buf_));
      if (ready_) DDP_CUDA_CHECK_NOTHROW(cudaEventDestroy(ready_));
      if (stream_) {
        // tensors that ops here used may be freed after this stream is gone
        cuda_retire_stream(stream_);
        DDP_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
      }
    } catch (const std::exception& e) {
      DDP_LOG_WARN("tearing down the nccl communicator: ", e.what());
    }
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view backend() const noexcept override { return "nccl"; }
  MemoryKind memory() const noexcept override { return MemoryKind::Cuda; }
  int device() const noexcept { return device_; }

 protected:
  Work send_impl(const OpCall& c) override {
    return enqueue(c, [this, b = c.in, dst = c.peer](cudaStream_t s) {
      return ncclSend(b.data, b.count, nccl::datatype_of(b.dtype), dst, comm_, s);
    });
  }
  Work recv_impl(const OpCall& c) override {
    return enqueue(c, [this, b = c.in, src = c.peer](cudaStream_t s) {
      return ncclRecv(b.data, b.count, nccl::datatype_of(b.dtype), src, comm_, s);
    });
  }
  Work broadcast_impl(const OpCall& c) override {
    return enqueue(c, [this, b = c.in, root = static_cast<int>(c.fp.root)](cudaStream_t s) {
      return ncclBroadcast(b.data, b.data, b.count, nccl::datatype_of(b.dtype), root, comm_, s);
    });
  }
  Work all_reduce_impl(const OpCall& c) override {
    return enqueue(c, [this, b = c.in, op = c.fp.op](cudaStream_t s) {
      return ncclAllReduce(b.data, b.data, b.count, nccl::datatype_of(b.dtype), nccl::op_of(op),
                           comm_, s);
    });
  }
  Work reduce_impl(const OpCall& c) override {
    // In place: NCCL writes recvbuff on the root only, so other ranks' buffers stay unchanged.
    return enqueue(
        c, [this, b = c.in, op = c.fp.op, root = static_cast<int>(c.fp.root)](cudaStream_t s) {
          return ncclReduce(b.data, b.data, b.count, nccl::datatype_of(b.dtype), nccl::op_of(op),
                            root, comm_, s);
        });
  }
  Work all_gather_impl(const OpCall& c) override {
    return enqueue(c, [this, in = c.in, out = c.out](cudaStream_t s) {
      return ncclAllGather(in.data, out.data, in.count, nccl::datatype_of(in.dtype), comm_, s);
    });
  }
  Work reduce_scatter_impl(const OpCall& c) override {
    return enqueue(c, [this, in = c.in, out = c.out, op = c.fp.op](cudaStream_t s) {
      return ncclReduceScatter(in.data, out.data, out.count, nccl::datatype_of(in.dtype),
                               nccl::op_of(op), comm_, s);
    });
  }
  Work all_to_all_impl(const OpCall& c) override {
    // One group of sends and receives; the own block is a device-to-device copy.
    return enqueue(c, [this, in = c.in, out = c.out](cudaStream_t s) {
      const std::size_t block = in.count / static_cast<std::size_t>(size_),
                        bb = block * dtype_size(in.dtype);
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
  // A one-element max all-reduce on a device scratch byte.
  Work barrier_impl(const OpCall& c) override {
    return enqueue(c, [this](cudaStream_t s) {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclUint8, ncclMax, comm_, s);
    });
  }

  // ncclCommSplit of this communicator; collective over all its ranks (non-members pass NOCOLOR).
  std::unique_ptr<Communicator> new_group_impl(const std::vector<int>& ranks, int index) override {
    const int id = ++groups_;
    ncclComm_t sub = nullptr;
    {
      std::lock_guard lock(mu_);
      failure_.throw_if_failed(ddp::detail::str(who(rank_, size_), ": new_group"));
      CudaDeviceGuard g(device_);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t rc =
          ncclCommSplit(comm_, index >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, index, &sub, &config);
      const auto deadline = Clock::now() + opts_.timeout;
      // Non-blocking split: the parent and (for members) the new communicator report completion.
      try {
        wait_in_progress(comm_, rc, "ncclCommSplit", deadline);
        if (sub)
          wait_in_progress(sub, ncclInProgress, "ncclCommSplit (new communicator)", deadline);
      } catch (const std::exception& e) {
        if (sub) ncclCommAbort(sub);
        Pending none{.timeout = opts_.timeout};
        // aborts comm_
        fail_locked(ddp::detail::str(who(rank_, size_), ": new_group failed: ", e.what()), false,
                    none);
        throw;
      }
    }
    if (index < 0) return nullptr;
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(sub, index, static_cast<int>(ranks.size()), store_, opts_, device_,
                             ddp::detail::str(prefix_, "group", id, '/')));
  }

 private:
  using Launch = std::function<ncclResult_t(cudaStream_t)>;
  struct Pending {  // an enqueued op, owned by the watcher until its event completes
    std::shared_ptr<detail::WorkState> state;
    Fingerprint fp;
    std::chrono::milliseconds timeout;
    Clock::time_point deadline;
    cudaEvent_t done = nullptr;
  };

  // A member of a new_group: the split communicator is already created.
  NcclCommunicator(ncclComm_t comm, int rank, int size, store::Store& store,
                   const CommOptions& opts, int device, std::string prefix)
      : rank_(rank),
        size_(size),
        store_(store),
        opts_(opts),
        device_(device),
        prefix_(std::move(prefix)),
        report_(store, prefix_, rank_, size_),
        sequence_(rank_, size_),
        comm_(comm) {
    start();
  }

  // `device` if this process can use it, else a ConfigError naming what to check.
  static int usable_device(int device, int rank, int size) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    if (device < 0 || device >= n)
      throw ConfigError(
          ddp::detail::str(who(rank, size), ": --backend nccl needs CUDA device ", device,
                           " (the local rank), but ", n,
                           " device(s) are visible; check "
                           "CUDA_VISIBLE_DEVICES and --nproc-per-node, or use --backend tcp."));
    return device;
  }

  // After a non-blocking NCCL call: polls ncclCommGetAsyncError while it reports ncclInProgress.
  void wait_in_progress(ncclComm_t comm, ncclResult_t rc, std::string_view what,
                        Clock::time_point deadline) {
    while (rc == ncclInProgress) {
      if (Clock::now() > deadline) {  // the caller aborts the communicator
        throw TimeoutError(ddp::detail::str(
            who(rank_, size_), ": ", what, " did not finish within ", opts_.timeout.count(),
            " ms; a rank may be missing or stuck. Raise --timeout-ms (DDP_TIMEOUT_MS) "
            "if startup is slow."));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (const ncclResult_t q = ncclCommGetAsyncError(comm, &rc); q != ncclSuccess) rc = q;
    }
    if (rc != ncclSuccess)
      throw CommError(
          ddp::detail::str(who(rank_, size_), ": ", what, " failed: ", nccl::error_text(rc, comm)));
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
    CudaDeviceGuard g(device_);
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    DDP_CUDA_CHECK(cudaMalloc(&barrier_buf_, 1));
    watcher_ = std::thread([this] { watch(); });
    DDP_LOG_DEBUG(who(rank_, size_), ": nccl communicator ready on device ", device_,
                  " (store prefix ", prefix_, ")");
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

  // Numbers the op, orders it between the caller's stream and its own, hands it to the watcher.
  Work enqueue(OpCall call, const Launch& launch) {
    std::unique_lock lock(mu_);
    const std::string label = sequence_.number(call);
    const Fingerprint& fp = call.fp;
    if (auto refused = failure_.not_run(label)) return Work::completed(label, refused);
    Pending p{std::make_shared<detail::WorkState>(label),
              fp,
              call.timeout.count() > 0 ? call.timeout : opts_.timeout,
              {},
              nullptr};
    p.deadline = Clock::now() + p.timeout;
    Work work(p.state);
    const auto caller = static_cast<cudaStream_t>(call.stream);
    try {
      CudaDeviceGuard g(device_);
      DDP_CUDA_CHECK(cudaEventRecord(ready_, caller));
      DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
      wait_in_progress(comm_, launch(stream_), fp.label(), p.deadline);
      // NCCL uses these blocks on stream_: the caching allocator reuses them only after it has.
      for (const BufferRef* b : {&call.in, &call.out})
        if (b->memory == MemoryKind::Cuda) cuda_record_stream(b->data, stream_);
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming));
      DDP_CUDA_CHECK(cudaEventRecord(p.done, stream_));
      DDP_CUDA_CHECK(cudaStreamWaitEvent(caller, p.done, 0));
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

  // Ops complete in issue order on one stream, so it polls the oldest pending event (every 20 us
  // while one is pending), ncclCommGetAsyncError and each op's deadline, and every
  // kStorePollInterval asks the store whether another rank failed.
  void watch() {
    try {
      DDP_CUDA_CHECK(cudaSetDevice(device_));
    } catch (const std::exception& e) {
      DDP_LOG_ERROR(who(rank_, size_), ": the nccl watcher cannot select device ", device_, ": ",
                    e.what());
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
        if (q == cudaSuccess)
          p.state->complete();
        else
          fail_locked(ddp::detail::str(
                          p.state->label, " failed: ",
                          ddp::detail::cuda_error_text("cudaEventQuery", q, __FILE__, __LINE__)),
                      false, p);
      }
      if (pending_.empty()) continue;
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        fail_all_locked(ddp::detail::str(pending_.front().state->label, " failed: NCCL reported ",
                                         nccl::error_text(async, comm_)),
                        false);
        continue;
      }
      const auto now = Clock::now();
      if (now > pending_.front().deadline) {
        const Pending& f = pending_.front();
        std::string msg = ddp::detail::str(f.state->label, " timed out after ", f.timeout.count(),
                                           " ms. Raise "
                                           "--timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.");
        const Fingerprint fp = f.fp;
        const auto timeout = f.timeout;
        const bool publish = !failure_.failed();
        const std::uint64_t at = position(fp);
        lock.unlock();
        // Published before the report waits for the others' positions: seeing it, they stop and
        // publish theirs.
        if (publish) report_.publish(msg, at, fp, timeout);
        if (!fp.is_p2p()) msg += report_.timeout_report(fp, timeout);
        lock.lock();
        // enqueue may have failed them meanwhile
        if (!pending_.empty()) fail_all_locked(msg, true, !publish);
        continue;
      }
      if (now > next_store_poll && size_ > 1) {
        next_store_poll = now + nccl::kStorePollInterval;
        lock.unlock();
        std::string other = report_.any_peer_failure(opts_.timeout);
        lock.lock();
        if (!other.empty() && !pending_.empty()) {
          fail_all_locked(ddp::detail::str(pending_.front().state->label, " failed: ", other),
                          false);
          continue;
        }
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
    }
  }

  // Aborts, fails every pending op with `msg`, publishes it (see fail_locked). mu_ held.
  void fail_all_locked(const std::string& msg, bool timed_out, bool publish = true) {
    Pending oldest = std::move(pending_.front());  // msg names it
    pending_.pop_front();
    if (oldest.done) cudaEventDestroy(oldest.done);
    fail_locked(msg, timed_out, oldest, publish);
  }

  // Marks the communicator failed, publishes msg with this rank's position at p (first failure
  // only, unless the caller did), aborts, fails `p` with msg and every other pending op with a
  // message quoting it. mu_ held.
  void fail_locked(const std::string& msg, bool timed_out, Pending& p, bool publish = true) {
    if (failure_.fail(msg) && publish) report_.publish(msg, position(p.fp), p.fp, p.timeout);
    if (comm_ && !aborted_) {
      ncclCommAbort(comm_);  // stops the kernels of every pending op; comm_ is gone afterwards
      aborted_ = true;
    }
    if (p.state) p.state->complete(error_of(msg, timed_out));
    while (!pending_.empty()) {
      Pending q = std::move(pending_.front());
      pending_.pop_front();
      if (q.done) cudaEventDestroy(q.done);
      q.state->complete(
          error_of(ddp::detail::str(q.state->label, " was not completed: ", msg), timed_out));
    }
  }

  // This rank's position for the failure report: a collective's own number; for send/recv, the
  // last collective issued. mu_ held.
  std::uint64_t position(const Fingerprint& fp) const noexcept {
    return fp.is_p2p() ? sequence_.last_collective() : fp.seq;
  }

  static std::exception_ptr error_of(const std::string& msg, bool timed_out) {
    if (timed_out) return std::make_exception_ptr(TimeoutError(msg));
    return std::make_exception_ptr(CommError(msg));
  }

  const int rank_, size_;
  store::Store& store_;
  const CommOptions opts_;
  const int device_;
  // this communicator's store keys: "ddp/nccl/<attempt>/" or the parent's + "group<id>/"
  const std::string prefix_;
  FailureReport report_;
  OpSequence sequence_;  // guarded by mu_
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the communicator's stream: every op runs there, in issue order
  cudaEvent_t ready_ = nullptr;    // recorded on the caller's stream before each op
  void* barrier_buf_ = nullptr;    // one device byte for barrier()
  int groups_ = 0;

  std::mutex mu_;  // guards everything below, and every NCCL call on comm_
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  bool aborted_ = false;
  FailureState failure_;  // written under mu_; its own lock lets the destructor read it without mu_
  std::thread watcher_;
};

}  // namespace ddp::comm
