// Mesh: the tcp backend's full mesh of sockets (one per peer), built through the store, and the
// transfer engine that moves framed messages over it full-duplex with failure detection.
// SPDX-License-Identifier: MIT
//
// connect: rank r listens on <ip>:0 and publishes "ip:port" at <prefix>addr/<r>, then (1) connects
// to every higher rank and sends a hello {magic, rank, size, prefix hash}, (2) accepts one
// connection from every lower rank and checks its hello, (3) acks each, (4) reads the acks of the
// ranks it connected to. Step 1 never waits for a peer (the kernel completes connections in the
// listen backlog), so no two ranks wait on each other.
// Example, 3 ranks: 0 connects to 1 and 2, 1 connects to 2 and accepts 0, 2 accepts 0 and 1.
//
// run: every message is a 40-byte FrameHeader (the op's fingerprint: kind, dtype, reduce op,
// root/tag, count, sequence number; payload size), then the payload. Sends and receives on
// distinct peers advance together over non-blocking sockets and poll(), so a ring step sending
// 64 MiB right while receiving 64 MiB from the left never deadlocks on full socket buffers. A
// header that differs from the receive's fingerprint is a Mismatch naming the peer's op. Data can
// be reduced into Transfer::reduce_dst while the rest still arrives (overlaps the network).
//
// Failure detection: every peer socket, not only the op's, is polled for POLLRDHUP/POLLHUP/POLLERR
// during every op, so a peer that dies or fails (a failing rank closes its sockets to tell the
// others) fails the op at once instead of after the timeout.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/checks.hpp"
#include "ddp/comm/reduce.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/fd.hpp"
#include "ddp/core/net.hpp"
#include "ddp/core/wait_report.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm::tcp {

inline constexpr std::uint32_t kFrameMagic = 0xDD9C0111u;
inline constexpr std::uint32_t kHelloMagic = 0xDD9C4E11u;
// reduce received data in pieces this large
inline constexpr std::size_t kReduceGrainBytes = 128 * 1024;
// staging buffer of a reducing receive
inline constexpr std::size_t kStageBytes = 1024 * 1024;
// SO_SNDBUF/SO_RCVBUF of mesh sockets
inline constexpr int kSocketBufferBytes = 4 << 20;

// On-wire frame header; ranks run on the same architecture (native byte order).
struct FrameHeader {
  std::uint32_t magic = kFrameMagic;
  std::uint8_t kind = 0, dtype = 0, op = 0, pad = 0;
  std::uint64_t seq = 0;
  std::int64_t root = -1;
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;  // payload bytes after this header
};
static_assert(sizeof(FrameHeader) == 40);

// What a receive expects on the wire: a Recv matches a Send.
inline FrameHeader wire_header(const Fingerprint& f, std::uint64_t bytes) {
  const OpKind k = f.kind == OpKind::Recv ? OpKind::Send : f.kind;
  return {.magic = kFrameMagic,
          .kind = static_cast<std::uint8_t>(k),
          .dtype = static_cast<std::uint8_t>(f.dtype),
          .op = static_cast<std::uint8_t>(f.op),
          .pad = 0,
          .seq = f.seq,
          .root = f.root,
          .count = f.count,
          .bytes = bytes};
}
inline Fingerprint fingerprint_of(const FrameHeader& h) {
  return {.kind = static_cast<OpKind>(h.kind),
          .dtype = static_cast<DType>(h.dtype),
          .op = static_cast<ReduceOp>(h.op),
          .root = h.root,
          .count = h.count,
          .seq = h.seq};
}

// Why a transfer failed; TcpCommunicator turns it into the user's message.
struct PeerFailure : std::exception {
  enum class Kind { Closed, Mismatch, Timeout, Protocol };
  Kind kind = Kind::Closed;
  int peer = -1;  // the peer concerned; for Timeout the first one still pending
  // Closed: every peer seen closing at that moment (the caller picks the root cause)
  std::vector<int> closed;
  Fingerprint theirs;  // Mismatch: what the peer ran
  std::string detail;  // Closed/Protocol: the socket error; Timeout: what was pending
  const char* what() const noexcept override { return detail.c_str(); }
};

// One send or receive of a run(). At most one send and one receive per peer in a run.
struct Transfer {
  int peer = -1;
  bool is_send = false;
  std::byte* data = nullptr;  // send: payload; receive: where the payload lands
  std::size_t bytes = 0;
  std::byte* reduce_dst = nullptr;  // receive only: combine the payload into this as it arrives
  // With reduce_dst, > 0: `data` is a circular staging buffer of this many bytes (a multiple of
  // kReduceGrainBytes), not room for the whole payload: keeps a large receive in cache.
  std::size_t stage_bytes = 0;
  // the op's own fingerprint when run_until_any batches several ops
  const Fingerprint* fp = nullptr;
  // Progress, owned by the engine.
  std::size_t done = 0;     // bytes of header + payload moved so far
  std::size_t reduced = 0;  // payload bytes already combined into reduce_dst
  FrameHeader header{};

  bool finished() const noexcept {
    return done == sizeof(FrameHeader) + bytes && (!reduce_dst || reduced == bytes);
  }
};

struct OpContext {
  Fingerprint fp;
  Clock::time_point deadline{};
  bool strict_hangup = true;  // false for the shutdown barrier: peers that finished may close early
};

class Mesh {
 public:
  Mesh(int rank, int size)
      : rank_(rank),
        size_(size),
        fds_(static_cast<std::size_t>(size)),
        hung_up_(static_cast<std::size_t>(size), false) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  // Keys live under `prefix`. Throws CommError/TimeoutError.
  void connect(store::Store& store, const std::string& prefix, const std::string& listen_ip,
               Clock::time_point deadline) {
    if (size_ == 1) return;
    try {
      connect_all(store, prefix, listen_ip, deadline);
      // "ddp: cannot connect to 10.0.0.2:41234: No route to host (errno 113)"
    } catch (const net::SocketError& e) {
      std::string_view what = e.what();
      if (what.starts_with("ddp: ")) what.remove_prefix(5);
      throw CommError(ddp::detail::str(
          who(), ": connecting the tcp mesh: ", what,
          ". A firewall or the wrong interface? Set DDP_SOCKET_IFNAME (--socket-ifname)."));
    }
    for (int p = 0; p < size_; ++p)
      if (fds_[p]) {
        net::set_nodelay(fds_[p].get());
        net::set_buffer_sizes(fds_[p].get(), kSocketBufferBytes);
        net::set_nonblocking(fds_[p].get(), true);
      }
  }

  // Until completion, the op's deadline, or a peer failure (throws PeerFailure).
  void run(std::span<Transfer> xs, const OpContext& ctx) {
    for (auto& x : xs) start(x, ctx);
    for (;;) {
      bool all = true;
      for (auto& x : xs)
        if (!x.finished()) {
          x.is_send ? advance_send(x) : advance_recv(x, ctx);
          all = all && x.finished();
        }
      if (all) return;
      wait_ready(xs, ctx);
    }
  }

  // Resets a transfer's progress and builds its header (run() does; run_until_any() callers once).
  void start(Transfer& x, const OpContext& ctx) {
    x.done = x.reduced = 0;
    if (x.is_send) x.header = wire_header(x.fp ? *x.fp : ctx.fp, x.bytes);
  }

  // Advances started transfers (each with its own Transfer::fp) until one finishes or `wake_fd` (an
  // eventfd) is readable, so newly issued batched send/recv ops can join.
  void run_until_any(std::span<Transfer> xs, const OpContext& ctx, int wake_fd) {
    for (;;) {
      bool any = false;
      for (auto& x : xs)
        if (!x.finished()) {
          x.is_send ? advance_send(x) : advance_recv(x, ctx);
          any = any || x.finished();
        }
      if (any || wait_ready(xs, ctx, wake_fd)) return;
    }
  }

  // Adds every other closed peer to `closed`, waiting at most `wait` for the first close (zero: no
  // wait). Why: when rank 0 dies and rank 3 fails because of it, a reader of rank 3 can see rank
  // 3's close first (a dying process's sockets close one by one), and with rank 0's store gone
  // rank 3 left no message; naming only rank 3 would blame a survivor. FailureProtocol::describe
  // then prefers a peer that left no message.
  void add_hung_up_peers(std::vector<int>& closed, std::chrono::milliseconds wait = {}) const {
    std::vector<pollfd> pfds;
    std::vector<int> peers;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !fds_[p] || std::find(closed.begin(), closed.end(), p) != closed.end())
        continue;
      pfds.push_back({.fd = fds_[p].get(), .events = POLLRDHUP, .revents = 0});
      peers.push_back(p);
    }
    const auto deadline = Clock::now() + wait;
    int rc = 0;
    while (!pfds.empty() && (rc = ::poll(pfds.data(), pfds.size(), net::ms_until(deadline))) < 0 &&
           errno == EINTR) {
    }
    if (rc <= 0) return;
    for (std::size_t i = 0; i < pfds.size(); ++i)
      if (pfds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) closed.push_back(peers[i]);
  }

  // Peers see the close at once: how a failing rank tells them.
  void close_all() noexcept {
    for (auto& f : fds_)
      if (f) {
        ::shutdown(f.get(), SHUT_RDWR);
        f.reset();
      }
  }

 private:
  std::string who() const { return comm::who(rank_, size_); }

  struct Hello {
    std::uint32_t magic;
    std::int32_t rank, size, pad;
    std::uint64_t tag;
  };

  void connect_all(store::Store& store, const std::string& prefix, const std::string& listen_ip,
                   Clock::time_point deadline) {
    Fd listener = net::listen(listen_ip, 0, size_);
    store.set(prefix + "addr/" + std::to_string(rank_),
              ddp::detail::str(listen_ip, ':', net::local_port(listener.get())));
    const std::uint64_t tag = std::hash<std::string>{}(prefix);
    auto fail = [&](int peer, std::string_view what, const net::IoStatus& st) {
      throw CommError(ddp::detail::str(
          who(), ": connecting the tcp mesh: ", what, " with rank ", peer, " failed (", st.text(),
          "). Are all ranks running the same program and group calls?"));
    };
    for (int j = rank_ + 1; j < size_; ++j) {  // (1) connect up
      std::string addr;
      try {
        const WaitReport report(store::capped_timeout(store.timeout()),
                                ddp::detail::str("rank ", j, " to join"), "; is it started?");
        addr = store.get_string(prefix + "addr/" + std::to_string(j));
      } catch (const TimeoutError& e) {  // name the rank that never joined, not only the store key
        throw TimeoutError(ddp::detail::str(
            who(), ": connecting the tcp mesh: rank ", j,
            " never published its address (it died, is stuck or never started): ", e.what()));
        // its host exited first (rank 0, perhaps timed out on rank j as well)
      } catch (const StoreError& e) {
        throw CommError(ddp::detail::str(
            who(), ": connecting the tcp mesh: waiting for rank ", j,
            "'s address, the store failed (its host, rank 0 when the ranks host the "
            "store, exited): ",
            e.what()));
      }
      // "10.0.0.2:41234" or "fd00::2:41234": the port follows the last colon
      const auto colon = addr.rfind(':');
      Fd s = net::connect(addr.substr(0, colon),
                          static_cast<std::uint16_t>(std::stoi(addr.substr(colon + 1))), deadline,
                          net::Retry::WhileRefused);
      const Hello h{kHelloMagic, rank_, size_, 0, tag};
      if (auto st = net::write_all(s.get(), &h, sizeof h, deadline); !st)
        fail(j, "sending the hello", st);
      fds_[j] = std::move(s);
    }
    auto lower_missing = [&] {
      std::vector<int> missing;
      for (int i = 0; i < rank_; ++i)
        if (!fds_[i]) missing.push_back(i);
      return missing;
    };
    auto to_connect = [&](const std::vector<int>& missing) {
      return ddp::detail::str(missing.size() == 1 ? "rank " : "ranks ",
                              ddp::detail::join(missing, ", "), " to connect");
    };
    std::optional<WaitReport> report;
    if (rank_ > 0)
      report.emplace(net::time_left(deadline), to_connect(lower_missing()), "; is it started?");
    for (int n = 0; n < rank_; ++n) {  // (2) accept from below
      if (n > 0) report->set_who(to_connect(lower_missing()));
      Fd s = net::accept(listener.get(), deadline);
      if (!s) {
        const std::vector<int> missing = lower_missing();
        throw TimeoutError(ddp::detail::str(
            who(), ": connecting the tcp mesh: only ", n, " of the ", rank_,
            " lower ranks connected before the timeout; rank(s) ", ddp::detail::join(missing, ", "),
            " never connected (died or stuck?); "
            "raise --timeout-ms (DDP_TIMEOUT_MS) if startup is slow."));
      }
      Hello h{};
      if (auto st = net::read_exact(s.get(), &h, sizeof h, deadline); !st)
        fail(-1, "reading a hello", st);
      if (h.magic != kHelloMagic || h.size != size_ || h.tag != tag || h.rank < 0 ||
          h.rank >= rank_ || fds_[h.rank])
        throw CommError(ddp::detail::str(
            who(), ": unexpected hello (rank ", h.rank, ", size ", h.size,
            ") while building the tcp mesh; another job may be using the same store "
            "prefix."));
      fds_[h.rank] = std::move(s);
    }
    for (int i = 0; i < rank_; ++i) {  // (3) ack
      const Hello h{kHelloMagic, rank_, size_, 0, tag};
      if (auto st = net::write_all(fds_[i].get(), &h, sizeof h, deadline); !st)
        fail(i, "sending the ack", st);
    }
    for (int j = rank_ + 1; j < size_; ++j) {  // (4) read acks
      Hello h{};
      const auto st = net::read_exact(fds_[j].get(), &h, sizeof h, deadline);
      if (!st) fail(j, "reading the ack", st);
      if (h.magic != kHelloMagic || h.rank != j)
        fail(j, "reading the ack", {.kind = net::IoStatus::Kind::Failed, .err = EPROTO});
    }
  }

  [[noreturn]] void closed(int peer, int err, std::vector<int> all = {}) const {
    PeerFailure f;
    f.kind = PeerFailure::Kind::Closed;
    f.peer = peer;
    f.closed = all.empty() ? std::vector<int>{peer} : std::move(all);
    add_hung_up_peers(f.closed);
    f.detail = err ? net::errno_text(err) : std::string("end of stream");
    throw f;
  }

  void advance_send(Transfer& x) {
    constexpr std::size_t H = sizeof(FrameHeader);
    const std::size_t total = H + x.bytes;
    while (x.done < total) {
      iovec iov[2];
      int n = 0;
      if (x.done < H) iov[n++] = {reinterpret_cast<char*>(&x.header) + x.done, H - x.done};
      const std::size_t off = x.done > H ? x.done - H : 0;
      if (x.bytes > off) iov[n++] = {x.data + off, x.bytes - off};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<std::size_t>(n);
      ssize_t w = ::sendmsg(fds_[x.peer].get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        x.done += static_cast<std::size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      closed(x.peer, w < 0 ? errno : 0);
    }
  }

  void advance_recv(Transfer& x, const OpContext& ctx) {
    constexpr std::size_t H = sizeof(FrameHeader);
    const std::size_t total = H + x.bytes;
    const std::size_t S = x.stage_bytes;
    while (x.done < total) {
      iovec iov[2];
      int n = 0;
      if (x.done < H) iov[n++] = {reinterpret_cast<char*>(&x.header) + x.done, H - x.done};
      const std::size_t off = x.done > H ? x.done - H : 0;
      if (S == 0) {
        if (x.bytes > off) iov[n++] = {x.data + off, x.bytes - off};
      } else {  // up to the end of the staging buffer, and never over bytes not yet reduced
        const std::size_t end = std::min({x.bytes, x.reduced + S, (off / S + 1) * S});
        if (end > off) iov[n++] = {x.data + off % S, end - off};
      }
      if (n == 0) break;  // staging buffer full: reduce below, then come back
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<std::size_t>(n);
      ssize_t r = ::recvmsg(fds_[x.peer].get(), &m, MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (r <= 0) closed(x.peer, r < 0 ? errno : 0);
      const bool had_header = x.done >= H;
      x.done += static_cast<std::size_t>(r);
      if (!had_header && x.done >= H) check_header(x, ctx);
      if (x.reduce_dst) reduce_ready(x, ctx, false);
    }
    if (x.reduce_dst) reduce_ready(x, ctx, true);
  }

  // Received, not yet reduced bytes into reduce_dst: a grain at a time, or all with `flush`.
  void reduce_ready(Transfer& x, const OpContext& ctx, bool flush) {
    constexpr std::size_t H = sizeof(FrameHeader);
    if (x.done <= H) return;
    const std::size_t esize = dtype_size(ctx.fp.dtype);
    const std::size_t avail = (x.done - H) / esize * esize;
    if (avail == x.reduced || (!flush && avail - x.reduced < kReduceGrainBytes)) return;
    while (x.reduced < avail) {  // in pieces that do not cross the end of the staging buffer
      const std::size_t S = x.stage_bytes;
      const std::size_t end = S ? std::min(avail, (x.reduced / S + 1) * S) : avail;
      const std::size_t n = (end - x.reduced) / esize;
      if (n == 0) break;  // an element straddles the wrap: impossible when S is a multiple of esize
      reduce_into(x.reduce_dst + x.reduced, x.data + (S ? x.reduced % S : x.reduced), n,
                  ctx.fp.dtype, ctx.fp.op);
      x.reduced += n * esize;
    }
  }

  void check_header(const Transfer& x, const OpContext& ctx) const {
    const FrameHeader want = wire_header(x.fp ? *x.fp : ctx.fp, x.bytes);
    const FrameHeader& got = x.header;
    if (got.magic != kFrameMagic) {
      PeerFailure f;
      f.kind = PeerFailure::Kind::Protocol;
      f.peer = x.peer;
      f.detail = ddp::detail::str("bad frame magic 0x", std::hex, got.magic);
      throw f;
    }
    const bool reduces = (x.fp ? *x.fp : ctx.fp).has_reduce_op();
    if (got.kind != want.kind || got.dtype != want.dtype || got.seq != want.seq ||
        got.root != want.root || got.count != want.count || (reduces && got.op != want.op) ||
        got.bytes != want.bytes) {
      PeerFailure f;
      f.kind = PeerFailure::Kind::Mismatch;
      f.peer = x.peer;
      f.theirs = fingerprint_of(got);
      throw f;
    }
  }

  // Polls unfinished transfers' sockets and every peer for hang-ups. Returns true when woken
  // through wake_fd (drained), false when a socket is ready.
  bool wait_ready(std::span<Transfer> xs, const OpContext& ctx, int wake_fd = -1) {
    pfds_.clear();
    peer_of_.clear();
    if (wake_fd >= 0) {
      pfds_.push_back({.fd = wake_fd, .events = POLLIN, .revents = 0});
      peer_of_.push_back(-1);
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !fds_[p]) continue;
      short ev = 0;
      bool active = false;
      for (const auto& x : xs)
        if (x.peer == p && !x.finished()) {
          ev = static_cast<short>(ev | (x.is_send ? POLLOUT : POLLIN));
          active = true;
        }
      if (!active && hung_up_[p]) continue;  // lenient mode: a finished peer already closed
      pfds_.push_back(
          {.fd = fds_[p].get(), .events = static_cast<short>(ev | POLLRDHUP), .revents = 0});
      peer_of_.push_back(p);
    }
    const int rc = ::poll(pfds_.data(), pfds_.size(), net::ms_until(ctx.deadline));
    if (rc < 0 && errno == EINTR) return false;
    if (rc == 0 && Clock::now() >= ctx.deadline) timeout(xs);
    bool woken = false;
    if (wake_fd >= 0 && (pfds_[0].revents & POLLIN)) {
      std::uint64_t v;
      woken = ::read(wake_fd, &v, sizeof v) > 0;
    }
    std::vector<int> gone;
    int first_err = 0;
    for (std::size_t i = 0; i < pfds_.size(); ++i) {
      const short re = pfds_[i].revents;
      const int p = peer_of_[i];
      if (p < 0 || !(re & (POLLRDHUP | POLLHUP | POLLERR))) continue;
      bool reading = false;
      for (const auto& x : xs) reading = reading || (x.peer == p && !x.is_send && !x.finished());
      // drain what the peer sent before closing; EOF ends it
      if (reading && !(re & POLLERR)) continue;
      if (!ctx.strict_hangup && !reading) {
        hung_up_[p] = true;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fds_[p].get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (gone.empty()) first_err = err;
      gone.push_back(p);
    }
    if (!gone.empty()) {
      const int first = gone.front();  // read before the vector is moved into the argument
      closed(first, first_err, std::move(gone));
    }
    return woken;
  }

  [[noreturn]] void timeout(std::span<Transfer> xs) const {
    PeerFailure f;
    f.kind = PeerFailure::Kind::Timeout;
    std::vector<std::string> pending;
    for (const auto& x : xs)
      if (!x.finished()) {
        if (f.peer < 0) f.peer = x.peer;
        const std::size_t got = x.done > sizeof(FrameHeader) ? x.done - sizeof(FrameHeader) : 0;
        pending.push_back(ddp::detail::str(x.is_send ? "sending to rank " : "receiving from rank ",
                                           x.peer, " (", got, " of ", x.bytes, " bytes)"));
      }
    f.detail = ddp::detail::join(pending, ", ");
    throw f;
  }

  int rank_, size_;
  std::vector<Fd> fds_;
  std::vector<bool> hung_up_;
  std::vector<pollfd> pfds_;
  std::vector<int> peer_of_;
};

}  // namespace ddp::comm::tcp
