// TCP sockets for the store: an RAII fd, listen, connect with retry and backoff, and deadline-bounded I/O.
// SPDX-License-Identifier: MIT
//
// Every error names host:port and the system's own text (strerror), plus the likely cause:
//   ddp: cannot listen on 0.0.0.0:29500: Address already in use (errno 98). ...
// All I/O takes an absolute deadline; a read or write that cannot finish by then throws TimeoutError,
// a closed peer or a socket error throws StoreError. Blocking fds are driven through poll(), so a
// deadline is honoured even when the peer sends nothing.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/fd.hpp"
#include "ddp/core/str.hpp"

namespace ddp::store {

using Clock = std::chrono::steady_clock;

namespace net {

inline std::string errno_text(int err) { return ddp::detail::str(std::strerror(err), " (errno ", err, ")"); }

inline std::string endpoint(const std::string& host, std::uint16_t port) {
  // IPv6 literals are bracketed so the port stays readable: [::1]:29500.
  if (host.find(':') != std::string::npos) return ddp::detail::str('[', host, "]:", port);
  return ddp::detail::str(host, ':', port);
}

// Milliseconds left until deadline, clamped to [0, INT_MAX] for poll().
inline int ms_until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left + 1, 0, 2'000'000'000));
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const noexcept { freeaddrinfo(a); }
};

inline std::unique_ptr<addrinfo, AddrInfoDeleter> resolve(const std::string& host, std::uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0)
    throw StoreError(ddp::detail::str("ddp: cannot resolve store host ", endpoint(host, port), ": ",
                                      gai_strerror(rc), ". Check MASTER_ADDR (--master-addr)."));
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(res);
}

}  // namespace net

// Owns one socket fd (a ddp::Fd); closes it on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) noexcept : fd_(fd) {}

  int fd() const noexcept { return fd_.get(); }
  bool valid() const noexcept { return fd_.valid(); }
  void reset() noexcept { fd_.reset(); }

  // Port the socket is bound to (after listen on port 0).
  std::uint16_t local_port() const {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getsockname(fd(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
      throw StoreError(ddp::detail::str("ddp: getsockname failed: ", net::errno_text(errno)));
    if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  }

  void set_nonblocking(bool on) {
    int flags = fcntl(fd(), F_GETFL, 0);
    if (flags < 0 || fcntl(fd(), F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) != 0)
      throw StoreError(ddp::detail::str("ddp: fcntl(O_NONBLOCK) failed: ", net::errno_text(errno)));
  }
  // Store messages are small request/response pairs: Nagle would add up to 40 ms per round trip.
  void set_nodelay() noexcept {
    int one = 1;
    (void)setsockopt(fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }

 private:
  Fd fd_;
};

// Listens on host:port (port 0 picks a free port; host "" or "0.0.0.0" means every IPv4 interface).
// SO_REUSEADDR lets a restarted job rebind a port still in TIME_WAIT; a live listener still fails with
// EADDRINUSE, and the message says what probably holds the port.
inline Socket listen_tcp(const std::string& host, std::uint16_t port, int backlog = 1024) {
  auto addrs = net::resolve(host.empty() ? "0.0.0.0" : host, port, true);
  int last_err = 0;
  for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      last_err = errno;
      continue;
    }
    int one = 1;
    (void)setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.fd(), backlog) != 0) {
      last_err = errno;
      continue;
    }
    return s;
  }
  std::string where = net::endpoint(host.empty() ? "0.0.0.0" : host, port);
  if (last_err == EADDRINUSE)
    throw StoreError(ddp::detail::str(
        "ddp: cannot listen on ", where, ": ", net::errno_text(last_err),
        ". Another process holds the port: most likely torchrun's agent store (under torchrun with "
        "TORCHELASTIC_USE_AGENT_STORE=True the agent already serves MASTER_PORT and every rank must be a "
        "client) or a previous run that has not exited. Pick a free port with --master-port (MASTER_PORT) "
        "or DDP_STORE_PORT, or stop the old process."));
  throw StoreError(ddp::detail::str("ddp: cannot listen on ", where, ": ", net::errno_text(last_err),
                                    ". Check that the address belongs to this machine (MASTER_ADDR, --master-addr)."));
}

// Connects to host:port, retrying refused/unreachable attempts with exponential backoff (10 ms doubling
// to 1 s) until deadline, because rank 0's server may start after the clients. Throws TimeoutError with
// the last errno when the deadline passes.
inline Socket connect_tcp(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  std::chrono::milliseconds backoff{10};
  int last_err = 0;
  std::string last_what = "no attempt";
  for (;;) {
    try {
      auto addrs = net::resolve(host, port, false);
      for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
        Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!s.valid()) {
          last_err = errno;
          continue;
        }
        // Non-blocking connect bounded by the deadline, then back to blocking for simple I/O.
        s.set_nonblocking(true);
        int rc = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          pollfd p{s.fd(), POLLOUT, 0};
          int pr = ::poll(&p, 1, std::min(net::ms_until(deadline), 5000));
          int err = 0;
          socklen_t len = sizeof(err);
          if (pr == 1 && getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
            rc = 0;
          else
            errno = pr == 0 ? ETIMEDOUT : (err ? err : errno);
        }
        if (rc == 0) {
          s.set_nonblocking(false);
          s.set_nodelay();
          return s;
        }
        last_err = errno;
      }
      last_what = net::errno_text(last_err);
    } catch (const StoreError& e) {  // DNS may not know the host yet (containers starting): retry too
      last_what = e.what();
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds{1000});
  }
  throw TimeoutError(ddp::detail::str("ddp: could not connect to the store at ", net::endpoint(host, port),
                                      " before the timeout; last error: ", last_what,
                                      ". Rank 0 may not have started or the address is unreachable; check "
                                      "MASTER_ADDR/MASTER_PORT and raise --timeout-ms (DDP_TIMEOUT_MS) if startup is slow."));
}

// Waits for fd to become ready for `events` until deadline; false on timeout.
inline bool poll_until(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, net::ms_until(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) throw StoreError(ddp::detail::str("ddp: poll failed: ", net::errno_text(errno)));
  }
}

// Reads exactly out.size() bytes. `where` names the peer in errors ("10.0.0.1:29500").
inline void read_exact(const Socket& s, std::span<std::uint8_t> out, Clock::time_point deadline,
                       const std::string& where) {
  std::size_t done = 0;
  while (done < out.size()) {
    if (!poll_until(s.fd(), POLLIN, deadline))
      throw TimeoutError(ddp::detail::str("ddp: store read from ", where, " timed out"));
    ssize_t n = ::recv(s.fd(), out.data() + done, out.size() - done, 0);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n == 0) {
      throw StoreError(ddp::detail::str("ddp: the store at ", where,
                                        " closed the connection (the process hosting it, usually rank 0 or "
                                        "torchrun's agent, may have exited or rejected a request)"));
    } else if (errno != EINTR && errno != EAGAIN) {
      throw StoreError(ddp::detail::str("ddp: read from the store at ", where, " failed: ", net::errno_text(errno)));
    }
  }
}

inline void write_all(const Socket& s, std::span<const std::uint8_t> data, Clock::time_point deadline,
                      const std::string& where) {
  std::size_t done = 0;
  while (done < data.size()) {
    if (!poll_until(s.fd(), POLLOUT, deadline))
      throw TimeoutError(ddp::detail::str("ddp: store write to ", where, " timed out"));
    ssize_t n = ::send(s.fd(), data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
      throw StoreError(ddp::detail::str("ddp: write to the store at ", where, " failed: ", net::errno_text(errno),
                                        " (the store process may have exited)"));
    }
  }
}

}  // namespace ddp::store
