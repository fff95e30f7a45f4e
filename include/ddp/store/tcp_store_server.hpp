// TcpStoreServer: a key-value server that speaks PyTorch's TCPStore protocol (1.x and 2.x) to any
// number of clients.
// SPDX-License-Identifier: MIT
//
//   ddp::store::TcpStoreServer server("0.0.0.0", 0);       // port 0: the OS picks a free port
//   std::uint16_t port = server.port();                     // hand it to the workers (MASTER_PORT)
//   // ... the destructor stops the server thread and closes every connection.
//
// One background thread polls the listening socket, a self-pipe (for stop) and every client, all
// non-blocking. Bytes are appended to a per-client input buffer and wire::parse_request() takes
// complete requests; half a frame waits there, so a slow or stuck client never delays the others
// (PyTorch 1.13's server does a blocking recv per request and stalls everyone). Responses go to a
// per-client output buffer, written as the socket accepts them.
//   - Protocol generation per connection, from its first request (wire::detect_protocol): a 2.x
//     client opens with VALIDATE, a 1.x client never sends it.
//   - WAIT (and GET / MULTI_GET of a missing key) parks the connection with its remaining keys;
//     every later mutation of a key crosses it off; when none remain the answer is sent and the
//     buffered requests are processed. While parked, only CANCEL_WAIT is acted on.
//   - A malformed or oversized request closes only that connection (logged at WARN).
//   - Each poll round serves at most 1024 requests / 1 MiB per client, and a client with more than
//     max_backlog_bytes of unread answers is not read from until it drains.
// Example: A sends WAIT(["/x"]) and parks with remaining {"/x"}; B sends SET("/x","1"): A's
// remaining becomes {} and A receives 00 (STOP_WAITING).
#pragma once

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ddp/core/log.hpp"
#include "ddp/store/socket.hpp"
#include "ddp/store/wire.hpp"

namespace ddp::store {

struct TcpStoreServerOptions {
  wire::Limits limits{};  // per-request caps; larger requests close the connection
  bool accept_v1 = true;  // serve PyTorch 1.x clients
  bool accept_v2 = true;  // serve PyTorch 2.x clients (VALIDATE first)
  // Unsent response bytes after which a client is no longer read from (bounds server memory).
  std::size_t max_backlog_bytes = 16u << 20;
};

class TcpStoreServer {
 public:
  // Binds host:port (port 0 = a free port) and starts serving. Throws StoreError naming host:port
  // (and what probably holds it when the port is in use).
  TcpStoreServer(std::string host, std::uint16_t port, TcpStoreServerOptions opts = {})
      : host_(std::move(host)), opts_(opts), listener_(listen_tcp(host_, port)) {
    port_ = net::local_port(listener_.get());
    net::set_nonblocking(listener_.get(), true);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
      throw StoreError(ddp::detail::str("ddp: store server pipe failed: ", net::errno_text(errno)));
    wake_read_ = Fd(fds[0]);
    wake_write_ = Fd(fds[1]);
    thread_ = std::thread([this] { run(); });
    DDP_LOG_DEBUG("store server listening on ", net::endpoint(host_, port_));
  }
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // Stops the loop, joins the thread, closes every client connection.
  ~TcpStoreServer() {
    stop_.store(true);
    char b = 1;
    (void)!::write(wake_write_.get(), &b, 1);
    if (thread_.joinable()) thread_.join();
  }

  std::uint16_t port() const noexcept { return port_; }
  const std::string& host() const { return host_; }
  // Connections currently open (for tests and diagnostics).
  std::size_t num_clients() const noexcept { return num_clients_.load(); }

 private:
  struct Conn {
    Fd sock;
    std::string peer;
    std::optional<wire::Protocol> proto;
    Bytes in;
    std::size_t in_pos = 0;   // bytes of `in` already consumed
    std::size_t in_need = 1;  // re-parse once in.size() - in_pos reaches this
    Bytes out;
    std::size_t out_pos = 0;
    // Parked on WAIT/GET/MULTI_GET: keys not yet seen, and the request to answer when none remain.
    std::set<std::string> remaining;
    std::optional<wire::Request> parked;
    bool more = false;  // stopped at the per-round request budget with complete requests left
    bool eof = false;   // the peer closed its side; finish what it sent, then close
    bool closing = false;
  };

  // A flooding client delays the others by one bounded round, not by its whole backlog.
  static constexpr int kRequestsPerRound = 1024;
  static constexpr std::size_t kReadPerRound = 1u << 20;
  static std::size_t backlog(const Conn& c) noexcept { return c.out.size() - c.out_pos; }

  void run() {
    std::vector<pollfd> fds;
    while (!stop_.load()) {
      fds.clear();
      fds.push_back({listener_.get(), POLLIN, 0});
      fds.push_back({wake_read_.get(), POLLIN, 0});
      bool busy = false;
      for (auto& c : conns_) {
        // Not read from while max_backlog_bytes of its answers wait.
        short ev = !c->eof && backlog(*c) < opts_.max_backlog_bytes ? POLLIN : 0;
        if (c->out_pos < c->out.size()) ev |= POLLOUT;
        fds.push_back({c->sock.get(), ev, 0});
        busy = busy || c->more;
      }
      int rc = ::poll(fds.data(), fds.size(), busy ? 0 : -1);
      if (rc < 0) {
        if (errno == EINTR) continue;
        DDP_LOG_ERROR("store server on ", net::endpoint(host_, port_),
                      ": poll failed: ", net::errno_text(errno));
        break;
      }
      if (fds[1].revents) break;
      if (fds[0].revents & POLLIN) accept_all();
      // conns_ may grow in accept_all; only the first fds.size()-2 existed when polling.
      for (std::size_t i = 2; i < fds.size(); ++i) {
        Conn& c = *conns_[i - 2];
        if (!c.eof && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) on_readable(c);
        if (!c.closing && (fds[i].revents & POLLOUT)) flush(c);
      }
      for (auto& cp : conns_) {
        Conn& c = *cp;
        // Continue clients that hit the round budget or were paused by the backlog cap.
        if (!c.closing && !c.parked && c.in_pos < c.in.size() &&
            (c.more || backlog(c) < opts_.max_backlog_bytes))
          process(c);
        if (c.eof && !c.closing && !c.more && backlog(c) == 0)
          drop(c,
               c.in_pos == c.in.size() || c.parked ? "" : "peer closed in the middle of a request");
      }
      std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->closing; });
      num_clients_.store(conns_.size());
    }
    conns_.clear();
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      // EAGAIN: no more pending; other errors (EMFILE...) retried on the next poll
      if (fd < 0) return;
      auto c = std::make_unique<Conn>();
      c->sock = Fd(fd);
      net::set_nodelay(fd);
      const auto [host, port] = net::address_of(reinterpret_cast<const sockaddr*>(&ss));
      c->peer = net::endpoint(host, port);
      conns_.push_back(std::move(c));
    }
  }

  void drop(Conn& c, std::string_view reason) {
    if (c.closing) return;
    if (!reason.empty())
      DDP_LOG_WARN("store server ", net::endpoint(host_, port_), ": closing connection from ",
                   c.peer, ": ", reason);
    c.closing = true;
    c.more = false;
    c.remaining.clear();
    c.parked.reset();
  }

  void on_readable(Conn& c) {
    std::uint8_t buf[64 * 1024];
    std::size_t total = 0;
    while (total < kReadPerRound) {
      ssize_t n = ::recv(c.sock.get(), buf, sizeof(buf), 0);
      if (n > 0) {
        c.in.insert(c.in.end(), buf, buf + n);
        total += static_cast<std::size_t>(n);
        if (static_cast<std::size_t>(n) < sizeof(buf)) break;
        continue;
      }
      if (n == 0) {  // orderly close: what it sent is still answered (run() closes when done)
        c.eof = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return drop(c, net::errno_text(errno));
    }
    process(c);
  }

  // Complete requests in c.in, up to the round budget; stops while c is parked.
  void process(Conn& c) {
    c.more = false;
    int budget = kRequestsPerRound;
    while (!c.closing && c.in_pos < c.in.size() && c.in.size() - c.in_pos >= c.in_need &&
           backlog(c) < opts_.max_backlog_bytes) {
      auto rest = std::span<const std::uint8_t>(c.in).subspan(c.in_pos);
      if (!c.proto) {
        c.proto = wire::detect_protocol(rest);
        if (!c.proto) break;  // fewer than 5 bytes starting with 0: wait for more
        if ((*c.proto == wire::Protocol::V1 && !opts_.accept_v1) ||
            (*c.proto == wire::Protocol::V2 && !opts_.accept_v2))
          return drop(c, ddp::detail::str("client speaks ", wire::protocol_name(*c.proto),
                                          ", disabled on this server"));
      }
      if (budget-- == 0) {
        c.more = true;
        break;
      }
      auto r = wire::parse_request(rest, *c.proto, opts_.limits);
      if (r.status == wire::ParseStatus::Error)
        return drop(c, ddp::detail::str("malformed request: ", r.error));
      if (r.status == wire::ParseStatus::NeedMore) {
        c.in_need = r.need;
        break;
      }
      // answer the parked request first
      if (c.parked && r.request.op != wire::Op::CancelWait) break;
      c.in_pos += r.consumed;
      c.in_need = 1;
      execute(c, std::move(r.request));
    }
    // Drop consumed bytes when all are consumed, or lazily once they are most of the buffer, so a
    // stream of tiny requests costs O(bytes), not O(bytes^2) in memmove.
    if (c.in_pos == c.in.size()) {
      c.in.clear();
      c.in_pos = 0;
    } else if (c.in_pos >= (64u << 10) && 2 * c.in_pos >= c.in.size()) {
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_pos));
      c.in_pos = 0;
    }
    flush(c);
  }

  void execute(Conn& c, wire::Request rq) {
    using wire::Op;
    wire::Writer w;
    switch (rq.op) {
      case Op::Validate: break;  // the magic was checked by the parser
      case Op::Ping: w.le(rq.nonce); break;
      case Op::Set: set_key(rq.keys[0], std::move(rq.values[0])); break;
      case Op::MultiSet:
        for (std::size_t i = 0; i < rq.keys.size(); ++i)
          set_key(rq.keys[i], std::move(rq.values[i]));
        break;
      case Op::Append: {
        Bytes v = data_.count(rq.keys[0]) ? data_[rq.keys[0]] : Bytes{};
        v.insert(v.end(), rq.values[0].begin(), rq.values[0].end());
        set_key(rq.keys[0], std::move(v));
        break;
      }
      case Op::CompareSet: {
        // PyTorch: absent + empty expected -> store desired; absent otherwise -> echo expected.
        auto it = data_.find(rq.keys[0]);
        if (it == data_.end()) {
          if (rq.values[0].empty()) {
            w.blob(rq.values[1]);
            set_key(rq.keys[0], std::move(rq.values[1]));
          } else {
            w.blob(rq.values[0]);
          }
        } else {
          if (it->second == rq.values[0]) it->second = std::move(rq.values[1]);
          w.blob(it->second);
          notify(rq.keys[0]);
        }
        break;
      }
      case Op::Add: {
        std::int64_t v = 0;
        if (auto it = data_.find(rq.keys[0]); it != data_.end()) {
          const char* b = reinterpret_cast<const char*>(it->second.data());
          auto [p, ec] = std::from_chars(b, b + it->second.size(), v);
          if (ec != std::errc() || p != b + it->second.size())
            return drop(c, ddp::detail::str("ADD on key ", ddp::detail::quoted(rq.keys[0]),
                                            " whose value is not an integer"));
        }
        // Wrap like PyTorch's int64 arithmetic would on overflow, without UB.
        v = static_cast<std::int64_t>(static_cast<std::uint64_t>(v) +
                                      static_cast<std::uint64_t>(rq.delta));
        w.le(v);
        set_key(rq.keys[0], to_bytes(std::to_string(v)));
        break;
      }
      case Op::Get:
      case Op::Wait:
      case Op::MultiGet: {
        std::set<std::string> missing;
        for (const auto& k : rq.keys)
          if (!present(k)) missing.insert(k);
        if (!missing.empty()) {
          c.remaining = std::move(missing);
          c.parked = std::move(rq);
          return;
        }
        answer_parked(c, rq, w);
        break;
      }
      case Op::Check:
        w.u8(std::ranges::all_of(rq.keys, [&](const std::string& k) { return present(k); })
                 ? wire::kCheckReady
                 : wire::kCheckNotReady);
        break;
      case Op::GetNumKeys: w.le<std::int64_t>(static_cast<std::int64_t>(data_.size())); break;
      case Op::DeleteKey:
        w.le<std::int64_t>(static_cast<std::int64_t>(data_.erase(rq.keys[0])));
        break;
      case Op::CancelWait:
        c.remaining.clear();
        c.parked.reset();
        w.u8(wire::kWaitCanceled);
        break;
      case Op::QueuePush:
        queues_[rq.keys[0]].push_back(std::move(rq.values[0]));
        notify(rq.keys[0]);
        break;
      case Op::QueuePop: {
        auto& q = queues_[rq.keys[0]];
        w.le<std::int64_t>(static_cast<std::int64_t>(q.size()));
        if (!q.empty()) {
          w.blob(q.front());
          q.pop_front();
        }
        break;
      }
      case Op::QueueLen: {
        auto it = queues_.find(rq.keys[0]);
        w.le<std::int64_t>(it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size()));
        break;
      }
      case Op::WatchKey:
        return drop(
            c,
            "WATCH_KEY (PyTorch 1.x watch_key callbacks) is not supported by the ddp store server");
    }
    auto& b = w.bytes();
    c.out.insert(c.out.end(), b.begin(), b.end());
  }

  // The response of a WAIT/GET/MULTI_GET whose keys all exist.
  void answer_parked(Conn&, const wire::Request& rq, wire::Writer& w) {
    if (rq.op == wire::Op::Wait) {
      w.u8(wire::kStopWaiting);
      return;
    }
    for (const auto& k : rq.keys) {
      auto it = data_.find(k);
      w.blob(it == data_.end() ? Bytes{} : it->second);  // a key only in a queue reads as empty
    }
  }

  bool present(const std::string& k) const {
    if (data_.count(k)) return true;
    auto q = queues_.find(k);
    return q != queues_.end() && !q->second.empty();
  }

  void set_key(const std::string& k, Bytes v) {
    data_[k] = std::move(v);
    notify(k);
  }

  // Crosses k off every parked connection; those with nothing left get their answer and resume.
  void notify(const std::string& k) {
    for (auto& cp : conns_) {
      Conn& c = *cp;
      if (!c.parked || !c.remaining.erase(k) || !c.remaining.empty()) continue;
      wire::Request rq = std::move(*c.parked);
      c.parked.reset();
      wire::Writer w;
      answer_parked(c, rq, w);
      auto& b = w.bytes();
      c.out.insert(c.out.end(), b.begin(), b.end());
      resume_.push_back(&c);
    }
    // a resumed connection's requests may notify again: handled by the outer loop
    if (resuming_) return;
    resuming_ = true;
    while (!resume_.empty()) {
      Conn* c = resume_.front();
      resume_.pop_front();
      process(*c);
    }
    resuming_ = false;
  }

  void flush(Conn& c) {
    while (!c.closing && c.out_pos < c.out.size()) {
      ssize_t n =
          ::send(c.sock.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_pos += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;  // poll for POLLOUT
      } else {
        return drop(c, ddp::detail::str("send failed: ", net::errno_text(errno)));
      }
    }
    if (c.out_pos == c.out.size()) {
      c.out.clear();
      c.out_pos = 0;
    }
  }

  std::string host_;
  TcpStoreServerOptions opts_;
  Fd listener_;
  std::uint16_t port_ = 0;
  Fd wake_read_, wake_write_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> num_clients_{0};
  // Owned by the server thread only.
  std::vector<std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::deque<Bytes>> queues_;
  std::deque<Conn*> resume_;
  bool resuming_ = false;
  std::thread thread_;  // last: started after every member above exists
};

}  // namespace ddp::store
