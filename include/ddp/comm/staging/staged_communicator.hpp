// StagedCommunicator<D>: collectives on CUDA device memory over a host-memory backend (tcp, mpi),
// staged through pinned host memory, with the nccl backend's stream semantics
// (docs/decisions/0023).
// SPDX-License-Identifier: MIT
//
// Why: NCCL refuses two ranks on one GPU, and PyTorch's gloo takes CUDA tensors; so does `--backend
// gloo --device cuda` here. memory() is Cuda, so Transport<T, Cuda> and DistributedDataParallel<T,
// Cuda> use it unchanged; backend() names the host backend ("tcp").
//
// An op on device memory with .stream = s only enqueues (the host never blocks):
//   s:      [earlier work] -> D2H copy into a pinned block -> ready event -> hold -> H2D copy back
//           -> done event
//   worker: waits for `ready` (polling, bounded by the op's timeout), runs the host op on the
//           block through the inner communicator, opens the hold's gate
//   then:   the Work completes once s passed `done`; the block is reused after that
// So, as with nccl, the op sees all work enqueued on s before the call, and all work enqueued after
// it sees the result without a host wait (torch's ProcessGroupGloo orders s only in Work::wait()).
// The hold is a host function (cudaLaunchHostFunc) that waits for the gate and calls no CUDA API,
// or, with DDP_STAGING_MEMORY_WAIT=1 (opt-in), a stream memory wait (cuStreamWaitValue32 on a
// pinned word that the gate's open() writes). Copied is only what the op reads and writes (send:
// D2H; recv: H2D; broadcast: D2H on the root, H2D elsewhere; reduce: H2D on the root only;
// barrier: none). Device memory is touched only on s, in stream order, so nothing needs
// cuda_record_stream. Blocks are cached by size: a step repeats its sizes, so the steady state pins
// no new memory.
//
// Failure (docs/decisions/0009), bounded and loud: an inner error or timeout fails the Work with
// the inner op's exception; a stream that does not reach the op within its timeout is a
// TimeoutError. Either way the gate opens (s is never held past the op's timeout, never a hang)
// and every later call returns a failed Work that quotes the first failure.
// Ordering: ops run one at a time in issue order. As with nccl outside a group, a send and a recv
// that depend on each other must be issued in matching order on the two ranks. Host functions run
// one at a time per process, so with host-function holds, ops on several streams must be issued in
// dependency order; a memory wait blocks only its own stream.
// Ranks that share a GPU must be processes, one CUDA context each (as launchers start them): in one
// process a held stream delays other work in the context (threads as ranks time out; see 0023).
//
// D (the "device ops") is a template parameter so that all of the above is tested on the CPU with a
// fake device whose streams are threads (tests/unit/comm/test_staged.cpp); the CUDA one is
// comm/staging/cuda/staging_device.hpp. Streams are the options' void* (a cudaStream_t; null: the
// legacy default stream). D provides:
//   using Event = ...;   // a copyable handle
//   using Pinned = ...;  // move-only page-locked block: std::byte* data(), bytes()
//   Pinned alloc_pinned(std::size_t bytes);
//   Event create_event();  void destroy_event(Event) noexcept;
//   void copy_to_host(void* host, const void* dev, std::size_t bytes, void* stream);    // async
//   void copy_to_device(void* dev, const void* host, std::size_t bytes, void* stream);  // async
//   void record(Event, void* stream);              // completes when stream gets there
//   bool query(Event);                             // completed? never blocks
//   void hold(void* stream, staging::Gate& gate);  // stream's later work waits for gate.open();
//                                                  // may attach a word to the gate (Gate::attach)
//   void bind_thread();                            // on the worker thread, before its first query
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/failure_state.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm {

namespace staging {

// What a held stream waits for: opened once by the worker; reset only when its block is reused,
// after the stream has passed the hold.
class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
      if (word_)
        std::atomic_ref<std::uint32_t>(*word_).store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  bool is_open() {
    std::lock_guard lock(mu_);
    return open_;
  }
  void reset() {
    std::lock_guard lock(mu_);
    open_ = false;
    ++generation_;
  }
  // For a device whose streams wait on memory (D::hold): `word` (host memory the device reads,
  // owned by D, alive as long as the gate) receives the gate's generation on every open(); a hold
  // made while the gate is closed waits until *word reaches generation(), which reset() advances.
  // Zeroes the word (generations start at 1).
  void attach(std::uint32_t* word) {
    std::lock_guard lock(mu_);
    word_ = word;
    std::atomic_ref<std::uint32_t>(*word_).store(open_ ? generation_ : generation_ - 1,
                                                 std::memory_order_release);
  }
  std::uint32_t* word() {
    std::lock_guard lock(mu_);
    return word_;
  }
  std::uint32_t generation() {
    std::lock_guard lock(mu_);
    return generation_;
  }
  // The host function of a hold (cudaHostFn_t): waits for the gate, calls no CUDA API.
  static void wait_fn(void* gate) noexcept { static_cast<Gate*>(gate)->wait(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::uint32_t generation_ = 1;
  std::uint32_t* word_ = nullptr;
};

template <class D>
concept DeviceOps = requires(D& d, typename D::Pinned& pinned, typename D::Event e, void* p,
                             const void* cp, std::size_t n, Gate& g) {
  { d.alloc_pinned(n) } -> std::same_as<typename D::Pinned>;
  { pinned.data() } -> std::convertible_to<std::byte*>;
  { pinned.bytes() } -> std::convertible_to<std::size_t>;
  { d.create_event() } -> std::same_as<typename D::Event>;
  d.destroy_event(e);
  d.copy_to_host(p, cp, n, p);
  d.copy_to_device(p, cp, n, p);
  d.record(e, p);
  { d.query(e) } -> std::same_as<bool>;
  d.hold(p, g);
  d.bind_thread();
};

// Counters for tests and benchmarks.
struct StagingStats {
  std::int64_t pinned_allocs = 0;  // alloc_pinned calls (constant once the steady state is reached)
  std::int64_t reuses = 0;         // ops served by a cached block
  std::size_t pinned_bytes = 0;    // page-locked bytes held (in use + cached)
};

inline constexpr std::chrono::microseconds kPollInterval{20};
// pinned blocks are whole pages; `out` starts page-aligned
inline constexpr std::size_t kBlockAlign = 4096;

}  // namespace staging

template <staging::DeviceOps D>
class StagedCommunicator final : public Communicator {
 public:
  // Owns `inner` (host memory: tcp or mpi). `opts` gives the default op timeout and the bound on
  // destruction (shutdown_timeout). ConfigError if `inner` reaches device memory itself.
  StagedCommunicator(std::unique_ptr<Communicator> inner, D device, const CommOptions& opts = {})
      : inner_(checked(std::move(inner))),
        dev_(std::move(device)),
        opts_(opts),
        sequence_(inner_->rank(), inner_->size()) {
    worker_ = std::thread([this] { work(); });
  }

  // Runs what was issued (each op bounded by its timeout), waits up to shutdown_timeout for the
  // streams to pass the last copies, then destroys the inner communicator. Never throws.
  ~StagedCommunicator() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    for (auto& [bytes, slot] : free_) release(*slot);
  }

  int rank() const noexcept override { return inner_->rank(); }
  int size() const noexcept override { return inner_->size(); }
  std::string_view backend() const noexcept override { return inner_->backend(); }
  MemoryKind memory() const noexcept override { return MemoryKind::Cuda; }
  // The communicator that moves the bytes.
  Communicator& inner() noexcept { return *inner_; }
  staging::StagingStats stats() {
    std::lock_guard lock(mu_);
    return stats_;
  }

 protected:
  Work send_impl(const OpCall& c) override { return stage(c, true, false); }
  Work recv_impl(const OpCall& c) override { return stage(c, false, true); }
  Work broadcast_impl(const OpCall& c) override {
    const bool root = c.fp.root == rank();
    return stage(c, root, !root);
  }
  Work all_reduce_impl(const OpCall& c) override { return stage(c, true, true); }
  Work reduce_impl(const OpCall& c) override { return stage(c, true, c.fp.root == rank()); }
  Work all_gather_impl(const OpCall& c) override { return stage(c, true, true); }
  Work reduce_scatter_impl(const OpCall& c) override { return stage(c, true, true); }
  Work all_to_all_impl(const OpCall& c) override { return stage(c, true, true); }
  Work barrier_impl(const OpCall& c) override { return stage(c, false, false); }

  // The inner communicator's group, staged the same way. Collective on the inner communicator: it
  // runs once every op issued before it has run, so that it is ordered with them on every rank.
  std::unique_ptr<Communicator> new_group_impl(const std::vector<int>& ranks, int) override {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return queue_.empty() && !running_; });
    }
    std::unique_ptr<Communicator> sub = inner_->new_group(ranks);
    if (!sub) return nullptr;
    return std::make_unique<StagedCommunicator>(std::move(sub), dev_, opts_);
  }

 private:
  using Event = typename D::Event;

  // A pinned block with what one op needs around it; reused whole.
  struct Slot {
    typename D::Pinned block;
    Event ready{}, done{};
    bool has_events = false;
    // stable address for the hold
    std::unique_ptr<staging::Gate> gate = std::make_unique<staging::Gate>();
  };
  // One issued op: its call on the pinned block (host memory, no stream), its Work, its slot.
  struct Op {
    OpCall call;
    std::shared_ptr<detail::WorkState> state;
    std::unique_ptr<Slot> slot;
    bool wait_ready = true;  // false when the op reads nothing from the device (recv, barrier)
    std::chrono::milliseconds timeout{0};
    Clock::time_point deadline;
  };

  static std::unique_ptr<Communicator> checked(std::unique_ptr<Communicator> inner) {
    if (!inner)
      throw ConfigError("ddp: StagedCommunicator needs a communicator to wrap, got nullptr");
    if (inner->memory() != MemoryKind::Cpu)
      throw ConfigError(ddp::detail::str(
          "ddp: staging through pinned host memory needs a backend on host memory (tcp, "
          "mpi), but the ",
          inner->backend(), " backend reaches ", memory_name(inner->memory()),
          " itself; use it directly."));
    return inner;
  }

  static std::size_t round_up(std::size_t n) {
    return (n + staging::kBlockAlign - 1) / staging::kBlockAlign * staging::kBlockAlign;
  }

  // Enqueues the op's device work on the caller's stream and hands it to the worker. copy_in: the
  // op reads call.in from the device; copy_out: it writes call.out back.
  Work stage(OpCall call, bool copy_in, bool copy_out) {
    std::unique_lock lock(mu_);
    const std::string label = sequence_.number(call);
    if (auto refused = failure_.not_run(label)) return Work::completed(label, refused);
    auto state = std::make_shared<detail::WorkState>(label);
    Work work(state);
    const bool in_place = call.in.data == call.out.data && call.in.count == call.out.count;
    const std::size_t in_bytes = call.in.bytes(), out_bytes = in_place ? 0 : call.out.bytes();
    void* const s = call.stream;
    std::unique_ptr<Slot> slot;
    bool held = false;
    try {
      slot = take_slot_locked(round_up(in_bytes) + out_bytes);
      std::byte* host_in = slot->block.data();
      std::byte* host_out = in_place ? host_in : host_in + round_up(in_bytes);
      if (copy_in && in_bytes) dev_.copy_to_host(host_in, call.in.data, in_bytes, s);
      dev_.record(slot->ready, s);
      dev_.hold(s, *slot->gate);
      held = true;
      if (copy_out && call.out.bytes())
        dev_.copy_to_device(call.out.data, host_out, call.out.bytes(), s);
      dev_.record(slot->done, s);
      const BufferRef in{.data = host_in,
                         .count = call.in.count,
                         .dtype = call.in.dtype,
                         .memory = MemoryKind::Cpu};
      const BufferRef out{.data = host_out,
                          .count = call.out.count,
                          .dtype = call.out.dtype,
                          .memory = MemoryKind::Cpu};
      Op op{.call = call,
            .state = state,
            .slot = std::move(slot),
            .wait_ready = copy_in,
            .timeout = call.timeout.count() > 0 ? call.timeout : opts_.timeout};
      op.call.in = in;
      op.call.out = out;
      op.call.stream = nullptr;
      op.deadline = Clock::now() + op.timeout;
      queue_.push_back(std::move(op));
    } catch (const std::exception& e) {
      // The stream may hold work on the block: open the gate (never a held stream) and keep the
      // block out of the cache for good (a leak on a path where the device already failed).
      if (slot) {
        slot->gate->open();
        if (held) (void)slot.release();
      }
      std::string msg =
          ddp::detail::str(label, " failed while enqueueing its device copies: ", e.what());
      failure_.fail(msg);  // the first failure: failure_ was healthy above, and mu_ is held
      state->complete(std::make_exception_ptr(CommError(msg)));
      return work;
    }
    lock.unlock();
    cv_.notify_all();
    return work;
  }

  // A cached block of at least `bytes` (and at most twice that, so that a small op does not pin a
  // large block), or a new one. mu_ held.
  std::unique_ptr<Slot> take_slot_locked(std::size_t bytes) {
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes + staging::kBlockAlign) {
      std::unique_ptr<Slot> slot = std::move(it->second);
      free_.erase(it);
      slot->gate->reset();
      ++stats_.reuses;
      return slot;
    }
    auto slot = std::make_unique<Slot>(Slot{.block = dev_.alloc_pinned(bytes)});
    ++stats_.pinned_allocs;
    stats_.pinned_bytes += slot->block.bytes();
    try {
      slot->ready = dev_.create_event();
      try {
        slot->done = dev_.create_event();
      } catch (...) {
        dev_.destroy_event(slot->ready);
        throw;
      }
      slot->has_events = true;
    } catch (...) {
      release(*slot);
      throw;
    }
    return slot;
  }

  void release(Slot& slot) noexcept {
    if (slot.has_events) {
      dev_.destroy_event(slot.ready);
      dev_.destroy_event(slot.done);
      slot.has_events = false;
    }
    stats_.pinned_bytes -= slot.block.bytes();
  }

  // The worker: runs queued ops in issue order; between ops and while idle, retires ops whose
  // stream has passed their last copy (completes the Work, caches the block).
  void work() {
    try {
      dev_.bind_thread();
    } catch (const std::exception& e) {
      DDP_LOG_ERROR(sequence_.who(), ": the staging thread cannot select its device: ", e.what());
    }
    std::unique_lock lock(mu_);
    Clock::time_point give_up{};  // set once stop_ is seen with nothing left to run
    for (;;) {
      retire_locked();
      if (!queue_.empty()) {
        Op op = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
        const std::exception_ptr refused = failure_.not_run(op.state->label);
        lock.unlock();
        std::exception_ptr error = run(op, refused);
        lock.lock();
        running_ = false;
        if (error) {
          failure_.fail(message_of(error));
          op.state->complete(error);  // at once: the error needs no device
        }
        finishing_.push_back(std::move(op));
        cv_.notify_all();  // new_group waits for the queue to drain
        continue;
      }
      if (finishing_.empty()) {
        if (stop_) return;
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        continue;
      }
      if (stop_) {
        if (give_up == Clock::time_point{}) give_up = Clock::now() + opts_.shutdown_timeout;
        if (Clock::now() > give_up) {
          DDP_LOG_WARN(sequence_.who(), ": ", finishing_.size(),
                       " staged op(s) still wait for their CUDA stream after ",
                       opts_.shutdown_timeout.count(),
                       " ms (shutdown_timeout); their pinned blocks are left allocated");
          for (Op& op : finishing_) {
            op.state->complete(std::make_exception_ptr(CommError(ddp::detail::str(
                op.state->label,
                " did not complete: its CUDA stream did not pass the copy back before shutdown"))));
            (void)op.slot.release();  // the device may still copy into it
          }
          finishing_.clear();
          return;
        }
      }
      cv_.wait_for(lock, staging::kPollInterval);
    }
  }

  // Waits for the stream to reach the op, runs it on the inner communicator, opens the gate. Never
  // throws: returns the op's failure. Called without mu_.
  std::exception_ptr run(Op& op, const std::exception_ptr& refused) {
    std::exception_ptr error;
    try {
      if (refused) std::rethrow_exception(refused);
      while (op.wait_ready && !dev_.query(op.slot->ready)) {
        if (Clock::now() > op.deadline)
          throw TimeoutError(ddp::detail::str(op.state->label, " timed out after ",
                                              op.timeout.count(),
                                              " ms before it started: its CUDA stream did not "
                                              "reach the op (the work enqueued on it before the "
                                              "call did not finish). Raise --timeout-ms "
                                              "(DDP_TIMEOUT_MS) if that work is just slow."));
        std::this_thread::sleep_for(staging::kPollInterval);
      }
      run_checked(*inner_, op.call).wait();
    } catch (...) {
      error = std::current_exception();
    }
    op.slot->gate->open();
    return error;
  }

  // Ops whose stream passed `done`: complete their Work, cache their block. mu_ held.
  void retire_locked() {
    for (auto it = finishing_.begin(); it != finishing_.end();) {
      bool passed = false;
      try {
        passed = dev_.query(it->slot->done);
      } catch (const std::exception& e) {
        failure_.fail(ddp::detail::str(it->state->label, " failed: ", e.what()));
        it->state->complete(std::make_exception_ptr(
            CommError(ddp::detail::str(it->state->label, " failed: ", e.what()))));
        (void)it->slot.release();  // the device's state is unknown: never reuse the block
        it = finishing_.erase(it);
        continue;
      }
      if (!passed) {
        ++it;
        continue;
      }
      it->state->complete();  // no-op when it already failed
      const std::size_t bytes = it->slot->block.bytes();
      free_.emplace(bytes, std::move(it->slot));
      it = finishing_.erase(it);
    }
  }

  static std::string message_of(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "unknown error";
    }
  }

  std::unique_ptr<Communicator> inner_;  // first: destroyed last, after the worker stopped using it
  D dev_;
  const CommOptions opts_;

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  // the same numbers as inner_'s (every op goes through here)
  OpSequence sequence_;
  std::deque<Op> queue_;  // issued, not yet run; in issue order
  // run, waiting for the stream to pass their copy back
  std::deque<Op> finishing_;
  std::multimap<std::size_t, std::unique_ptr<Slot>> free_;  // cached blocks by size
  staging::StagingStats stats_;
  bool running_ = false;
  bool stop_ = false;
  FailureState failure_;
  std::thread worker_;
};

}  // namespace ddp::comm
