// TcpCommunicator: the CPU backend over a full mesh of TCP sockets, with a progress thread that runs ops
// in issue order, fingerprint checks, and failure reporting through the store (DESIGN D4, D9).
// SPDX-License-Identifier: MIT
//
// How an op runs: the calling thread checks the arguments, numbers the op (collectives share one sequence
// per communicator; send/recv count per peer pair) and queues it; the progress thread runs queued ops one
// at a time, so ops complete in issue order and overlap with the caller's compute. Small ops
// (CommOptions::inline_max_bytes) issued while nothing is queued run on the calling thread instead, which
// saves the thread hand-off.
// When every rank runs on one host (and CommOptions::shm is on), all-reduce, broadcast, all-gather and
// barrier move their data through one shared-memory segment instead (shm_collectives.hpp); the sockets
// stay open and keep detecting dead peers, and the other ops keep using them.
//
// How a failure spreads: the rank that sees a failure first (mismatched header, peer closed, timeout)
// writes its message to <prefix>error/<rank> and its position to <prefix>state/<rank> in the store, then
// shuts all its sockets down. Its peers see the close during whatever op they are in (every op polls every
// peer), read the message from the store and fail with "rank r reported: ...", or, when there is no
// message, "rank r closed its connection (process died?)". They spread it the same way, so every rank
// fails promptly, and the communicator stays failed: later ops fail at once quoting the first error.
// A rank whose op times out additionally collects the other ranks' positions for a short grace period
// and names the ranks that never reached the op or ran a different one there.
#pragma once

#include <sys/eventfd.h>

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
#include "ddp/comm/tcp/algorithms.hpp"
#include "ddp/comm/tcp/mesh.hpp"
#include "ddp/comm/tcp/shm_collectives.hpp"
#include "ddp/comm/tcp/listen_address.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm {

class TcpCommunicator final : public Communicator {
 public:
  // Builds the mesh for the job described by `info` (rank, world_size, master_addr). Blocks until every
  // rank has connected or opts.timeout passes (TimeoutError). The store must outlive the communicator.
  TcpCommunicator(const env::LaunchInfo& info, store::Store& store, const CommOptions& opts = {})
      : TcpCommunicator(info.rank, info.world_size, store, opts, "",
                        info.world_size > 1 ? tcp::choose_listen_address(opts.socket_ifname, info.master_addr)
                                            : std::string("127.0.0.1")) {}

  ~TcpCommunicator() override {
    bool broken;
    {
      std::lock_guard lock(mu_);
      broken = failed_;
    }
    if (!broken && size_ > 1) {
      // Bounded barrier: peers must not see our sockets close while they still need us; never throws.
      try {
        Fingerprint fp{.kind = OpKind::Barrier, .dtype = DType::U8, .op = ReduceOp::Max};
        std::uint8_t one = 1;
        Work w = submit(fp, 0, opts_.shutdown_timeout, false, -1, [this, &one](const tcp::OpContext& ctx) {
          if (shm_) return shm_->barrier_op(mesh_, ctx);
          tcp::recursive_doubling_all_reduce(mesh_, ctx, reinterpret_cast<std::byte*>(&one), 1, scratch_);
        });
        w.wait();
      } catch (const std::exception& e) {
        DDP_LOG_WARN("shutdown barrier of the tcp communicator failed: ", e.what());
      }
    }
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    mesh_.close_all();
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view backend() const noexcept override { return "tcp"; }
  const std::string& listen_address() const noexcept { return listen_ip_; }
  // True when collectives go through shared memory (every rank on this host, CommOptions::shm).
  bool uses_shm() const noexcept { return shm_ != nullptr; }

  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) override {
    const int id = ++groups_;
    int my = -1;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size_ || (i > 0 && ranks[i] <= ranks[i - 1]))
        throw ValueError(ddp::detail::str(who(), ": new_group needs strictly increasing ranks in [0, ", size_,
                                          "), got [", ddp::detail::join(ranks, ", "), "]"));
      if (ranks[i] == rank_) my = static_cast<int>(i);
    }
    if (ranks.empty()) throw ValueError(ddp::detail::str(who(), ": new_group needs at least one rank"));
    if (my < 0) return nullptr;
    return std::unique_ptr<Communicator>(new TcpCommunicator(my, static_cast<int>(ranks.size()), store_, opts_,
                                                             ddp::detail::str(prefix_, "group", id, '/'), listen_ip_));
  }

 protected:
  Work send_impl(Buffer b, int dst, const SendOptions& o) override {
    check_peer(dst, "send to");
    check_cpu(b);
    Fingerprint fp{.kind = OpKind::Send, .dtype = b.dtype, .root = o.tag, .count = b.count};
    return submit(fp, b.bytes(), o.timeout, true, dst, {},
                  tcp::Transfer{.peer = dst, .is_send = true, .data = b.bytes_ptr(), .bytes = b.bytes()});
  }
  Work recv_impl(Buffer b, int src, const SendOptions& o) override {
    check_peer(src, "receive from");
    check_cpu(b);
    Fingerprint fp{.kind = OpKind::Recv, .dtype = b.dtype, .root = o.tag, .count = b.count};
    return submit(fp, b.bytes(), o.timeout, true, src, {},
                  tcp::Transfer{.peer = src, .is_send = false, .data = b.bytes_ptr(), .bytes = b.bytes()});
  }
  Work broadcast_impl(Buffer b, const BroadcastOptions& o) override {
    check_root(o.root, "broadcast");
    check_cpu(b);
    Fingerprint fp{.kind = OpKind::Broadcast, .dtype = b.dtype, .root = o.root, .count = b.count};
    return submit(fp, b.bytes(), o.timeout, true, -1, [this, b, root = o.root](const tcp::OpContext& ctx) {
      if (shm_) return shm_->broadcast(mesh_, ctx, b.bytes_ptr(), b.bytes(), root);
      tcp::binomial_broadcast(mesh_, ctx, b.bytes_ptr(), b.bytes(), root);
    });
  }
  Work all_reduce_impl(Buffer b, const AllreduceOptions& o) override {
    check_cpu(b);
    Fingerprint fp{.kind = OpKind::AllReduce, .dtype = b.dtype, .op = o.op, .count = b.count};
    return submit(fp, b.bytes(), o.timeout, true, -1, [this, b](const tcp::OpContext& ctx) {
      if (size_ == 1) return;  // Avg over one rank is the identity
      if (shm_) return shm_->all_reduce(mesh_, ctx, b.bytes_ptr(), b.count);
      if (b.bytes() <= opts_.small_allreduce_bytes)
        tcp::recursive_doubling_all_reduce(mesh_, ctx, b.bytes_ptr(), b.count, scratch_);
      else
        tcp::ring_all_reduce(mesh_, ctx, b.bytes_ptr(), b.count, scratch_);
    });
  }
  Work reduce_impl(Buffer b, const ReduceOptions& o) override {
    check_root(o.root, "reduce");
    check_cpu(b);
    Fingerprint fp{.kind = OpKind::Reduce, .dtype = b.dtype, .op = o.op, .root = o.root, .count = b.count};
    return submit(fp, b.bytes(), o.timeout, true, -1, [this, b, root = o.root](const tcp::OpContext& ctx) {
      if (size_ == 1) return;
      std::byte* acc = b.bytes_ptr();
      if (rank_ != root) {  // keep the caller's buffer intact on non-roots
        acc = tcp::Scratch::sized(scratch_.acc, b.bytes());
        tcp::copy_bytes(acc, b.bytes_ptr(), b.bytes());
      }
      tcp::binomial_reduce(mesh_, ctx, acc, b.count, root, scratch_);
    });
  }
  Work all_gather_impl(Buffer in, Buffer out, const AllgatherOptions& o) override {
    check_cpu(in);
    check_cpu(out);
    check_blocks("all_gather", "out", out.count, "in", in.count);
    Fingerprint fp{.kind = OpKind::AllGather, .dtype = in.dtype, .count = in.count};
    return submit(fp, out.bytes(), o.timeout, true, -1, [this, in, out](const tcp::OpContext& ctx) {
      if (shm_) return shm_->all_gather(mesh_, ctx, in.bytes_ptr(), out.bytes_ptr(), in.bytes());
      if (in.bytes() != 0)  // empty buffers may be null, which memmove does not accept even for 0 bytes
        std::memmove(out.bytes_ptr() + static_cast<std::size_t>(rank_) * in.bytes(), in.bytes_ptr(), in.bytes());
      const auto offs = blocks(in.count);
      tcp::ring_all_gather(mesh_, ctx, out.bytes_ptr(), offs, -1);
    });
  }
  Work reduce_scatter_impl(Buffer in, Buffer out, const ReduceScatterOptions& o) override {
    check_cpu(in);
    check_cpu(out);
    check_blocks("reduce_scatter", "in", in.count, "out", out.count);
    Fingerprint fp{.kind = OpKind::ReduceScatter, .dtype = in.dtype, .op = o.op, .count = out.count};
    return submit(fp, in.bytes(), o.timeout, true, -1, [this, in, out](const tcp::OpContext& ctx) {
      std::byte* acc = tcp::Scratch::sized(scratch_.acc, in.bytes());
      tcp::copy_bytes(acc, in.bytes_ptr(), in.bytes());
      tcp::ring_reduce_scatter(mesh_, ctx, acc, blocks(out.count), -1, scratch_);
      tcp::copy_bytes(out.bytes_ptr(), acc + static_cast<std::size_t>(rank_) * out.bytes(), out.bytes());
      if (ctx.fp.op == ReduceOp::Avg) divide_by(out.data, out.count, out.dtype, size_);
    });
  }
  Work all_to_all_impl(Buffer in, Buffer out, const AlltoallOptions& o) override {
    check_cpu(in);
    check_cpu(out);
    if (in.count != out.count || in.count % static_cast<std::size_t>(size_) != 0)
      throw ValueError(ddp::detail::str(who(), ": all_to_all needs in and out of the same size, a multiple of size() = ",
                                        size_, "; got in ", in.count, " and out ", out.count, " elements"));
    Fingerprint fp{.kind = OpKind::AllToAll, .dtype = in.dtype, .count = in.count};
    return submit(fp, in.bytes(), o.timeout, true, -1, [this, in, out](const tcp::OpContext& ctx) {
      tcp::pairwise_all_to_all(mesh_, ctx, in.bytes_ptr(), out.bytes_ptr(), in.bytes() / static_cast<std::size_t>(size_));
    });
  }
  Work barrier_impl(const BarrierOptions& o) override {
    Fingerprint fp{.kind = OpKind::Barrier, .dtype = DType::U8, .op = ReduceOp::Max};
    return submit(fp, 0, o.timeout, true, -1, [this](const tcp::OpContext& ctx) {
      if (size_ == 1) return;
      if (shm_) return shm_->barrier_op(mesh_, ctx);
      std::uint8_t one = 1;
      tcp::recursive_doubling_all_reduce(mesh_, ctx, reinterpret_cast<std::byte*>(&one), 1, scratch_);
    });
  }

 private:
  using Body = std::function<void(const tcp::OpContext&)>;
  struct Task {
    std::shared_ptr<detail::WorkState> state;
    Fingerprint fp;
    std::chrono::milliseconds timeout;
    bool strict;
    int peer;
    Body body;
    tcp::Transfer xfer;  // send/recv: the transfer, run batched by run_p2p
    tcp::Clock::time_point deadline{};
  };

  TcpCommunicator(int rank, int size, store::Store& store, const CommOptions& opts, std::string prefix,
                  std::string listen_ip)
      : rank_(rank), size_(size), store_(store), opts_(opts), listen_ip_(std::move(listen_ip)), mesh_(rank, size) {
    if (size < 1 || rank < 0 || rank >= size)
      throw ConfigError(ddp::detail::str("ddp: rank ", rank, " is not in [0, world_size=", size,
                                         "); check RANK/WORLD_SIZE (--rank/--world-size)."));
    if (opts_.timeout.count() <= 0)
      throw ConfigError(ddp::detail::str("ddp: the communicator timeout must be positive, got ", opts_.timeout.count(),
                                         " ms; set --timeout-ms (DDP_TIMEOUT_MS)."));
    send_seq_.assign(static_cast<std::size_t>(size), 0);
    recv_seq_.assign(static_cast<std::size_t>(size), 0);
    try {
      if (prefix.empty()) {
        // A job restarted in place (torchrun keeps its store) must not read the previous attempt's keys:
        // every rank joins once per attempt, so the join count numbers the attempts consistently everywhere.
        const std::int64_t joined = store_.add("ddp/tcp/joined", 1);
        prefix = ddp::detail::str("ddp/tcp/", (joined - 1) / size, '/');
      }
      prefix_ = std::move(prefix);
      mesh_.connect(store_, prefix_, listen_ip_, tcp::Clock::now() + opts_.timeout);
      if (size_ > 1 && size_ <= tcp::kShmMaxRanks) {  // collective: every rank takes part, even with shm off
        auto seg = tcp::ShmSegment::create(store_, prefix_, rank_, size_, opts_.shm,
                                           tcp::ShmCollectives::segment_bytes(size_), tcp::Clock::now() + opts_.timeout);
        if (seg) shm_ = std::make_unique<tcp::ShmCollectives>(std::move(seg), rank_, size_, opts_.small_allreduce_bytes);
      }
    } catch (const StoreError& e) {  // the store went away mid-rendezvous: say whose death that usually is
      throw CommError(ddp::detail::str(who(), ": connecting the tcp mesh: the store failed (", e.what(),
                                       "); when the ranks host the store (ddprun, env://, mpirun), it lived in rank 0, "
                                       "which has probably died."));
    }
    wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    thread_ = std::thread([this] { progress_loop(); });
    DDP_LOG_DEBUG(who(), ": tcp mesh ready, listening on ", listen_ip_, " (store prefix ", prefix_, "; shared memory ",
                  shm_ ? "on" : "off", ")");
  }

  std::string who() const { return ddp::detail::str("ddp[rank ", rank_, '/', size_, ']'); }

  void check_cpu(const Buffer& b) const {
    if (b.memory != MemoryKind::Cpu)
      throw ValueError(ddp::detail::str(who(), ": the tcp backend reaches CPU memory only, but got a CUDA buffer; "
                                               "copy it to the host or use --backend nccl."));
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
      throw ValueError(ddp::detail::str(who(), ": ", op, " needs ", big, ".size() == size() * ", small,
                                        ".size() = ", size_, " * ", small_n, " = ", small_n * static_cast<std::size_t>(size_),
                                        ", but ", big, " has ", big_n, " elements"));
  }
  std::vector<std::size_t> blocks(std::size_t per_rank) const {
    std::vector<std::size_t> offs(static_cast<std::size_t>(size_) + 1);
    for (std::size_t i = 0; i < offs.size(); ++i) offs[i] = i * per_rank;
    return offs;
  }

  Work submit(Fingerprint fp, std::size_t bytes, std::chrono::milliseconds timeout, bool strict, int peer, Body body,
              tcp::Transfer xfer = {}) {
    std::unique_lock lock(mu_);
    if (fp.kind == OpKind::Send) fp.seq = ++send_seq_[peer];
    else if (fp.kind == OpKind::Recv) fp.seq = ++recv_seq_[peer];
    else fp.seq = ++seq_;
    std::string label = ddp::detail::str(who(), ": ", fp.label());
    if (peer >= 0) label += ddp::detail::str(fp.kind == OpKind::Send ? " to rank " : " from rank ", peer);
    Task t{std::make_shared<detail::WorkState>(std::move(label)), fp, timeout.count() > 0 ? timeout : opts_.timeout,
           strict, peer, std::move(body), xfer};
    Work work(t.state);
    // Never inline send/recv: an irecv must return before the matching send is issued.
    if (!fp.is_p2p() && queue_.empty() && !busy_ && (size_ == 1 || bytes <= opts_.inline_max_bytes)) {
      busy_ = true;
      lock.unlock();
      execute(t);
      lock.lock();
      busy_ = false;
      lock.unlock();
      cv_.notify_all();
      return work;
    }
    const bool p2p = t.fp.is_p2p();
    queue_.push_back(std::move(t));
    lock.unlock();
    cv_.notify_all();
    if (p2p && wake_) {  // a running send/recv batch picks it up at once
      const std::uint64_t one = 1;
      (void)!::write(wake_.get(), &one, sizeof one);
    }
    return work;
  }

  void progress_loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty() && !busy_); });
      if (queue_.empty()) return;
      Task t = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      if (t.fp.is_p2p()) run_p2p(std::move(t));
      else execute(t);
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  // How send/recv run: consecutive send/recv ops (up to the next collective) run as one batch in one poll
  // loop, and ops issued while the batch runs join it (the eventfd wakes the loop). So a rank may post an
  // irecv before its own send, as in MPI: "irecv from left; send to right" around a ring completes. Per
  // (peer, direction) ops still run one after another, in issue order, as the byte stream requires.
  void run_p2p(Task first) {
    std::vector<Task> live;
    auto admit = [&](Task t) {
      t.deadline = tcp::Clock::now() + t.timeout;
      t.xfer.fp = nullptr;
      live.push_back(std::move(t));
      mesh_.start(live.back().xfer, tcp::OpContext{.fp = live.back().fp, .deadline = {}, .strict_hangup = true});
    };
    admit(std::move(first));
    while (!live.empty()) {
      {
        std::lock_guard lock(mu_);
        while (!queue_.empty() && queue_.front().fp.is_p2p()) {
          admit(std::move(queue_.front()));
          queue_.pop_front();
        }
        if (failed_) {
          for (auto& t : live)
            t.state->complete(std::make_exception_ptr(CommError(ddp::detail::str(
                t.state->label, " was not run: this communicator failed earlier: ", first_error_))));
          return;
        }
      }
      // The first op of each (peer, direction) is active; Transfer::fp points at its own fingerprint.
      std::vector<std::size_t> active;
      std::vector<tcp::Transfer> xs;
      auto deadline = tcp::Clock::time_point::max();
      for (std::size_t i = 0; i < live.size(); ++i) {
        bool blocked = false;
        for (std::size_t j : active)
          blocked = blocked || (live[j].xfer.peer == live[i].xfer.peer && live[j].xfer.is_send == live[i].xfer.is_send);
        if (blocked) continue;
        active.push_back(i);
        xs.push_back(live[i].xfer);
        xs.back().fp = &live[i].fp;
        deadline = std::min(deadline, live[i].deadline);
      }
      tcp::OpContext ctx{.fp = live[active.front()].fp, .deadline = deadline, .strict_hangup = true};
      try {
        mesh_.run_until_any(xs, ctx, wake_.get());
      } catch (const tcp::PeerFailure& f) {
        std::size_t culprit = active.front();
        for (std::size_t k = 0; k < active.size(); ++k)
          if (xs[k].peer == f.peer && !xs[k].finished()) culprit = active[k];
        const auto err = fail(live[culprit], describe(live[culprit], f), f.kind == tcp::PeerFailure::Kind::Timeout);
        for (auto& t : live) t.state->complete(err);
        return;
      }
      for (std::size_t k = active.size(); k-- > 0;) {  // back to front, so erasing keeps indices valid
        live[active[k]].xfer = xs[k];
        if (xs[k].finished()) {
          live[active[k]].state->complete();
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(active[k]));
        }
      }
    }
  }

  void execute(Task& t) {
    {
      std::lock_guard lock(mu_);
      if (failed_) {
        t.state->complete(std::make_exception_ptr(CommError(ddp::detail::str(
            t.state->label, " was not run: this communicator failed earlier: ", first_error_))));
        return;
      }
    }
    if (!t.fp.is_p2p()) current_seq_ = t.fp.seq;
    if (shm_ && !t.fp.is_p2p()) shm_->announce(t.fp);
    tcp::OpContext ctx{.fp = t.fp, .deadline = tcp::Clock::now() + t.timeout, .strict_hangup = t.strict};
    try {
      t.body(ctx);
      t.state->complete();
    } catch (const tcp::PeerFailure& f) {
      store::ScopedTimeoutCap cap(report_budget(t));  // describe() reads the peers' messages from the store
      t.state->complete(fail(t, describe(t, f), f.kind == tcp::PeerFailure::Kind::Timeout));
    } catch (const TimeoutError& e) {
      t.state->complete(fail(t, ddp::detail::str(t.state->label, " failed: ", e.what()), true));
    } catch (const std::exception& e) {
      t.state->complete(fail(t, ddp::detail::str(t.state->label, " failed: ", e.what()), false));
    }
  }

  // The user's message for a transfer failure.
  std::string describe(const Task& t, const tcp::PeerFailure& f) {
    const std::string& label = t.state->label;
    switch (f.kind) {
      case tcp::PeerFailure::Kind::Mismatch:
        return ddp::detail::str(label, " does not match rank ", f.peer, ", which ran ", f.theirs.full_label(),
                                " at this point. Every rank must call the same collectives in the same order with "
                                "the same dtype, count, root and op.");
      case tcp::PeerFailure::Kind::Protocol:
        return ddp::detail::str(label, " failed: rank ", f.peer, " sent bytes that are not a ddp frame (", f.detail,
                                "); is another program connected?");
      case tcp::PeerFailure::Kind::Timeout:
        return ddp::detail::str(label, " timed out after ", t.timeout.count(), " ms while ", f.detail,
                                ". Raise --timeout-ms (DDP_TIMEOUT_MS) if the op is just slow.");
      case tcp::PeerFailure::Kind::Closed: break;
    }
    // Prefer a peer that left no message (the root cause: it died) over one that failed because of it.
    std::string reported;
    for (int p : f.closed) {
      std::string msg = peer_message(p);
      if (msg.empty() && store_lost_ && f.closed.size() > 1)  // no messages to tell the dead from the failed
        return ddp::detail::str(label, " failed: ranks ", ddp::detail::join(f.closed, ", "),
                                " closed their connections and the store is unreachable, so which of them died "
                                "first is unknown [", f.detail, "]");
      if (msg.empty())
        return ddp::detail::str(label, " failed: rank ", p, " closed its connection (process died?) [", f.detail, "]");
      if (reported.empty()) reported = ddp::detail::str(label, " failed: rank ", p, " reported: ", msg);
    }
    return reported;
  }

  std::string peer_message(int p) {
    if (store_lost_) return {};
    try {
      const std::string key = ddp::detail::str(prefix_, "error/", p);
      if (store_.check(key)) return store_.get_string(key);
    } catch (const std::exception&) {  // the store may have died with its host rank
      store_lost_ = true;
    }
    return {};
  }

  // Marks the communicator failed, publishes the message, closes the sockets (telling every peer), and
  // for timeouts appends what the other ranks were doing. Returns the exception for the Work.
  // Every store call that reports a failure is capped at this (store::ScopedTimeoutCap): the store's host
  // may be frozen or cut off, and waiting out the full store timeout there would make a rank exit after
  // twice its timeout. T/4 within [0.1 s, 3 s]: the same as the grace for the peers' reports below.
  static std::chrono::milliseconds report_budget(const Task& t) {
    return std::clamp(t.timeout / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(3000));
  }

  std::exception_ptr fail(const Task& t, std::string msg, bool timed_out) {
    store::ScopedTimeoutCap cap(report_budget(t));
    {
      std::lock_guard lock(mu_);
      if (!failed_) {
        failed_ = true;
        first_error_ = msg;
      }
    }
    if (!store_lost_) try {
      store_.set(ddp::detail::str(prefix_, "error/", rank_), msg);
      store_.set(ddp::detail::str(prefix_, "state/", rank_), ddp::detail::str(current_seq_, '\t', t.fp.full_label()));
      // PyTorch's SET has no reply: without a round trip the server may not have applied it yet when the
      // peers see our sockets close and look for the message. A CHECK on the same connection is answered only
      // after the SETs before it, so once it returns the message is visible to every rank.
      (void)store_.check(ddp::detail::str(prefix_, "error/", rank_));
    } catch (const std::exception& e) {
      DDP_LOG_WARN("could not publish the failure in the store: ", e.what());
      store_lost_ = true;
    }
    mesh_.close_all();
    if (timed_out && !t.fp.is_p2p()) msg += timeout_report(t);
    if (timed_out) return std::make_exception_ptr(TimeoutError(msg));
    return std::make_exception_ptr(CommError(msg));
  }

  // " Rank 2 never reached all_reduce #5 (...); rank 1 ran broadcast #5 (...) there." from the other ranks'
  // state keys, waiting a short grace period for ranks that fail because we closed.
  std::string timeout_report(const Task& t) {
    if (store_lost_) return " The store is unreachable, so the other ranks' positions are unknown.";
    std::vector<std::string> keys;
    for (int k = 0; k < size_; ++k)
      if (k != rank_) keys.push_back(ddp::detail::str(prefix_, "state/", k));
    const auto grace = report_budget(t);
    try {
      store_.wait(keys, grace);
    } catch (const std::exception&) {  // some never report: that is the finding
    }
    std::vector<std::string> never, different;
    for (int k = 0, i = 0; k < size_; ++k) {
      if (k == rank_) continue;
      const std::string& key = keys[static_cast<std::size_t>(i++)];
      std::string state;
      try {
        if (!store_lost_ && store_.check(key)) state = store_.get_string(key);
      } catch (const std::exception&) {
        store_lost_ = true;  // its host exited: do not wait out the store timeout once per rank
      }
      if (state.empty()) {
        never.push_back(ddp::detail::str(k, " (no report: busy outside ddp, stuck or dead)"));
        continue;
      }
      const auto tab = state.find('\t');
      const std::uint64_t seq = std::stoull(state.substr(0, tab));
      const std::string what = state.substr(tab + 1);
      if (seq < t.fp.seq) never.push_back(ddp::detail::str(k, " (last in ", what, ")"));
      else if (seq == t.fp.seq && what != t.fp.full_label()) different.push_back(ddp::detail::str(k, " ran ", what));
    }
    std::string out;
    if (!never.empty())
      out += ddp::detail::str(" Ranks that never reached ", op_name(t.fp.kind), " #", t.fp.seq, ": ",
                              ddp::detail::join(never, ", "), '.');
    if (!different.empty()) out += ddp::detail::str(" At #", t.fp.seq, " rank ", ddp::detail::join(different, "; rank "), '.');
    if (out.empty()) out = ddp::detail::str(" Every other rank reached #", t.fp.seq, " too.");
    return out;
  }

  int rank_, size_;
  store::Store& store_;
  CommOptions opts_;
  std::string prefix_;
  std::string listen_ip_;
  tcp::Mesh mesh_;
  std::unique_ptr<tcp::ShmCollectives> shm_;  // all ranks on one host (CommOptions::shm): the shm path
  Fd wake_;                    // eventfd: new send/recv ops wake a running batch
  tcp::Scratch scratch_;            // used only by the thread running the current op
  std::uint64_t current_seq_ = 0;   // last collective started (ditto)
  // A failure report found the store unreachable (its host rank died?): later reports skip it instead of
  // waiting out the store timeout on every key (ditto).
  bool store_lost_ = false;
  int groups_ = 0;                  // new_group calls so far

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;  // an op is running (progress thread or inline)
  bool stop_ = false;
  bool failed_ = false;
  std::string first_error_;
  std::uint64_t seq_ = 0;
  std::vector<std::uint64_t> send_seq_, recv_seq_;
  std::thread thread_;
};

}  // namespace ddp::comm
