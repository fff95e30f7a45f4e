// TcpCommunicator: the CPU backend over a full mesh of TCP sockets (docs/decisions/0004, 0009).
// SPDX-License-Identifier: MIT
//
// This file holds the API and each op's algorithm; the rest lives beside it:
//   mesh.hpp              sockets to every peer, framed transfers (fingerprint in every header)
//   algorithms.hpp        ring, recursive doubling, binomial trees, pairwise all-to-all
//   ../shm/*.hpp          all-reduce, broadcast, all-gather, barrier through shared memory when
//                         every rank runs on one host (CommOptions::shm); the sockets stay open
//                         to detect dead peers (shm_watch.hpp) and carry the other ops
//   op_queue.hpp          numbering, the progress thread, small ops inline on the caller's thread
//   p2p.hpp               send/recv batched in one poll loop (irecv before the own send completes)
//   failure_protocol.hpp  how a failure spreads through the store and the sockets; its messages
// Communicator (comm/checks.hpp) has checked the arguments before any of this runs.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/reduce.hpp"
#include "ddp/comm/tcp/algorithms.hpp"
#include "ddp/comm/tcp/failure_protocol.hpp"
#include "ddp/comm/tcp/listen_address.hpp"
#include "ddp/comm/tcp/mesh.hpp"
#include "ddp/comm/tcp/op_queue.hpp"
#include "ddp/comm/tcp/p2p.hpp"
#include "ddp/comm/tcp/shm_watch.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/env/launch_info.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm {

class TcpCommunicator final : public Communicator {
 public:
  // Builds the mesh for `info` (rank, world_size, master_addr); blocks until every rank has
  // connected or opts.timeout passes (TimeoutError). `store` must outlive the communicator.
  TcpCommunicator(const env::LaunchInfo& info, store::Store& store, const CommOptions& opts = {})
      : TcpCommunicator(info.rank, info.world_size, store, opts, "",
                        info.world_size > 1
                            ? tcp::choose_listen_address(opts.socket_ifname, info.master_addr)
                            : std::string("127.0.0.1")) {}

  ~TcpCommunicator() override {
    if (!failure_.failed() && size_ > 1) {
      // Bounded, never throws: peers must not see our sockets close while they still need us.
      // Lenient (strict = false): a peer past it may close before we see its last frame.
      try {
        OpCall call{.fp = {.kind = OpKind::Barrier, .dtype = DType::U8, .op = ReduceOp::Max},
                    .timeout = opts_.shutdown_timeout};
        queue_
            .submit(
                call, 0, [this](const tcp::OpContext& ctx) { barrier_body(ctx); }, false)
            .wait();
      } catch (const std::exception& e) {
        DDP_LOG_WARN("shutdown barrier of the tcp communicator failed: ", e.what());
      }
    }
    queue_.stop();
    mesh_.close_all();
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view backend() const noexcept override { return "tcp"; }
  MemoryKind memory() const noexcept override { return MemoryKind::Cpu; }
  const std::string& listen_address() const noexcept { return listen_ip_; }
  // True when collectives go through shared memory (every rank on this host, CommOptions::shm).
  bool uses_shm() const noexcept { return shm_ != nullptr; }

 protected:
  Work send_impl(const OpCall& c) override { return queue_.submit(c, c.in.bytes(), {}); }
  Work recv_impl(const OpCall& c) override { return queue_.submit(c, c.in.bytes(), {}); }
  Work broadcast_impl(const OpCall& c) override {
    return queue_.submit(
        c, c.in.bytes(), [this, b = c.in, root = c.fp.root](const tcp::OpContext& ctx) {
          if (shm_)
            return shm_->broadcast(watch(ctx), b.bytes_ptr(), b.bytes(), static_cast<int>(root));
          tcp::binomial_broadcast(mesh_, ctx, b.bytes_ptr(), b.bytes(), static_cast<int>(root));
        });
  }
  Work all_reduce_impl(const OpCall& c) override {
    return queue_.submit(c, c.in.bytes(), [this, b = c.in](const tcp::OpContext& ctx) {
      if (size_ == 1) return;  // Avg over one rank is the identity
      if (shm_) return shm_->all_reduce(watch(ctx), b.bytes_ptr(), b.count);
      if (b.bytes() <= opts_.small_allreduce_bytes)
        tcp::recursive_doubling_all_reduce(mesh_, ctx, b.bytes_ptr(), b.count, scratch_);
      else
        tcp::ring_all_reduce(mesh_, ctx, b.bytes_ptr(), b.count, scratch_);
    });
  }
  Work reduce_impl(const OpCall& c) override {
    return queue_.submit(
        c, c.in.bytes(),
        [this, b = c.in, root = static_cast<int>(c.fp.root)](const tcp::OpContext& ctx) {
          if (size_ == 1) return;
          std::byte* acc = b.bytes_ptr();
          if (rank_ != root) {  // keep the caller's buffer intact on non-roots
            acc = tcp::Scratch::sized(scratch_.acc, b.bytes());
            tcp::copy_bytes(acc, b.bytes_ptr(), b.bytes());
          }
          tcp::binomial_reduce(mesh_, ctx, acc, b.count, root, scratch_);
        });
  }
  Work all_gather_impl(const OpCall& c) override {
    return queue_.submit(
        c, c.out.bytes(), [this, in = c.in, out = c.out](const tcp::OpContext& ctx) {
          if (shm_)
            return shm_->all_gather(watch(ctx), in.bytes_ptr(), out.bytes_ptr(), in.bytes());
          // empty buffers may be null, which memmove does not accept even for 0 bytes
          if (in.bytes() != 0)
            std::memmove(out.bytes_ptr() + static_cast<std::size_t>(rank_) * in.bytes(),
                         in.bytes_ptr(), in.bytes());
          tcp::ring_all_gather(mesh_, ctx, out.bytes_ptr(), blocks(in.count), -1);
        });
  }
  Work reduce_scatter_impl(const OpCall& c) override {
    return queue_.submit(
        c, c.in.bytes(), [this, in = c.in, out = c.out](const tcp::OpContext& ctx) {
          std::byte* acc = tcp::Scratch::sized(scratch_.acc, in.bytes());
          tcp::copy_bytes(acc, in.bytes_ptr(), in.bytes());
          tcp::ring_reduce_scatter(mesh_, ctx, acc, blocks(out.count), -1, scratch_);
          tcp::copy_bytes(out.bytes_ptr(), acc + static_cast<std::size_t>(rank_) * out.bytes(),
                          out.bytes());
          if (ctx.fp.op == ReduceOp::Avg) divide_by(out.data, out.count, out.dtype, size_);
        });
  }
  Work all_to_all_impl(const OpCall& c) override {
    return queue_.submit(c, c.in.bytes(),
                         [this, in = c.in, out = c.out](const tcp::OpContext& ctx) {
                           tcp::pairwise_all_to_all(mesh_, ctx, in.bytes_ptr(), out.bytes_ptr(),
                                                    in.bytes() / static_cast<std::size_t>(size_));
                         });
  }
  Work barrier_impl(const OpCall& c) override {
    return queue_.submit(c, 0, [this](const tcp::OpContext& ctx) { barrier_body(ctx); });
  }

  // Members build their mesh under the parent's keys; the group's id numbers new_group calls, which
  // every rank makes in the same order, members or not.
  std::unique_ptr<Communicator> new_group_impl(const std::vector<int>& ranks, int index) override {
    const int id = ++groups_;
    if (index < 0) return nullptr;
    return std::unique_ptr<Communicator>(
        new TcpCommunicator(index, static_cast<int>(ranks.size()), store_, opts_,
                            ddp::detail::str(prefix_, "group", id, '/'), listen_ip_));
  }

 private:
  TcpCommunicator(int rank, int size, store::Store& store, const CommOptions& opts,
                  std::string group_prefix, std::string listen_ip)
      : rank_(check_setup(rank, size, opts)),
        size_(size),
        store_(store),
        opts_(opts),
        listen_ip_(std::move(listen_ip)),
        prefix_(store_prefix(store, rank, size, std::move(group_prefix))),
        mesh_(rank, size),
        failure_(store, prefix_, rank, size, mesh_),
        queue_(rank, size, opts.timeout, opts.inline_max_bytes) {
    try {
      mesh_.connect(store_, prefix_, listen_ip_, Clock::now() + opts_.timeout);
      // collective: every rank takes part, even with shm off
      if (size_ > 1 && size_ <= shm::kMaxRanks) {
        auto seg = shm::Segment::create(
            shm::store_all_gather(store_, prefix_, rank_, size_, Clock::now() + opts_.timeout),
            rank_, size_, opts_.shm, shm::Collectives::segment_bytes(size_), "TCP");
        if (seg)
          shm_ = std::make_unique<shm::Collectives>(std::move(seg), rank_, size_,
                                                    opts_.small_allreduce_bytes);
      }
    } catch (const StoreError& e) {
      throw store_failed(rank, size, e);
    }
    queue_.start([this](tcp::Task& t) { run_collective(t); },
                 [this](tcp::Task t) {
                   tcp::run_p2p_batch(std::move(t), queue_, mesh_, failure_, position_);
                 },
                 opts_.progress_cpus);
    DDP_LOG_DEBUG(who(rank_, size_), ": tcp mesh ready, listening on ", listen_ip_,
                  " (store prefix ", prefix_, "; shared memory ", shm_ ? "on" : "off", ")");
  }

  // The store went away mid-rendezvous: say whose death that usually is.
  static CommError store_failed(int rank, int size, const StoreError& e) {
    return CommError(ddp::detail::str(
        who(rank, size), ": connecting the tcp mesh: the store failed (", e.what(),
        "); when the ranks host the store (ddprun, env://, mpirun), it lived in rank 0, "
        "which has probably died."));
  }
  static std::string store_prefix(store::Store& store, int rank, int size,
                                  std::string group_prefix) {
    if (!group_prefix.empty()) return group_prefix;
    try {
      return attempt_prefix(store, "tcp", size);
    } catch (const StoreError& e) {
      throw store_failed(rank, size, e);
    }
  }

  // Runs one collective, inline or on the progress thread, and completes its Work.
  void run_collective(tcp::Task& t) {
    if (auto e = failure_.not_run(t.state->label)) return t.state->complete(e);
    position_ = t.fp.seq;
    if (shm_) shm_->announce(t.fp);
    const tcp::OpContext ctx{
        .fp = t.fp, .deadline = Clock::now() + t.timeout, .strict_hangup = t.strict};
    try {
      t.body(ctx);
      t.state->complete();
    } catch (const tcp::PeerFailure& f) {
      t.state->complete(failure_.fail(t, failure_.describe(t, f),
                                      f.kind == tcp::PeerFailure::Kind::Timeout, position_));
    } catch (const TimeoutError& e) {
      t.state->complete(failure_.fail(t, ddp::detail::str(t.state->label, " failed: ", e.what()),
                                      true, position_));
    } catch (const std::exception& e) {
      t.state->complete(failure_.fail(t, ddp::detail::str(t.state->label, " failed: ", e.what()),
                                      false, position_));
    }
  }

  // What a shm op watches its peers through (only while it runs, on the thread running ops).
  tcp::ShmWatch watch(const tcp::OpContext& ctx) { return tcp::ShmWatch(mesh_, ctx, shm_wake_); }

  // A one-byte max all-reduce (the fingerprint checks that every rank is at the same barrier).
  void barrier_body(const tcp::OpContext& ctx) {
    if (size_ == 1) return;
    if (shm_) return shm_->barrier_op(watch(ctx));
    std::uint8_t one = 1;
    tcp::recursive_doubling_all_reduce(mesh_, ctx, reinterpret_cast<std::byte*>(&one), 1, scratch_);
  }

  // Element offsets of size() equal blocks of per_rank elements: 0, k, 2k, ..., size() * k.
  std::vector<std::size_t> blocks(std::size_t per_rank) const {
    std::vector<std::size_t> offs(static_cast<std::size_t>(size_) + 1);
    for (std::size_t i = 0; i < offs.size(); ++i) offs[i] = i * per_rank;
    return offs;
  }

  const int rank_, size_;
  store::Store& store_;
  const CommOptions opts_;
  const std::string listen_ip_;
  // this communicator's store keys: "ddp/tcp/<attempt>/" or the parent's + "group<id>/"
  const std::string prefix_;
  tcp::Mesh mesh_;
  tcp::FailureProtocol failure_;
  std::unique_ptr<shm::Collectives> shm_;  // all ranks on one host (CommOptions::shm): the shm path
  Fd shm_wake_ = tcp::ShmWatch::make_wake();  // the shm ops' liveness probe (tcp/shm_watch.hpp)
  tcp::Scratch scratch_;                      // used only by the thread running the current op
  // the last collective started (ditto), for failure reports
  std::uint64_t position_ = 0;
  int groups_ = 0;  // new_group calls so far
  // last: its thread stops before the members it uses go
  tcp::OpQueue queue_;
};

}  // namespace ddp::comm
