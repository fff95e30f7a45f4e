// The one socket layer of the library, below the store (store/socket.hpp) and the tcp backend
// (comm/tcp/mesh.hpp, listen_address.hpp): errno text, deadlines, name resolution (IPv4 and IPv6),
// listen / accept / connect bounded by deadlines, and exact reads and writes.
// SPDX-License-Identifier: MIT
//
// Errors: connection set-up (resolve, listen, accept, connect) throws net::SocketError with the
// system's text, "ddp: cannot listen on [::1]:29500: Address already in use (errno 98)"; callers
// rethrow it as their layer's error (StoreError, CommError, ConfigError) with the likely cause and
// the fixing flag. Exact I/O returns an IoStatus: the store and the mesh word "closed" differently.
// Deadlines are absolute steady_clock points; one already past still makes one attempt (connect) or
// returns at once (poll, accept, I/O).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/core/clock.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/fd.hpp"
#include "ddp/core/str.hpp"

namespace ddp::net {

// "Connection refused (errno 111)".
inline std::string errno_text(int err) {
  return ddp::detail::str(std::strerror(err), " (errno ", err, ")");
}

// "10.0.0.1:29500"; IPv6 literals are bracketed so that the port stays readable: "[::1]:29500".
inline std::string endpoint(std::string_view host, std::uint16_t port) {
  if (host.find(':') != std::string_view::npos) return ddp::detail::str('[', host, "]:", port);
  return ddp::detail::str(host, ':', port);
}

// ms left until `deadline` for poll(): rounded up (no wake just before the deadline), clamped to
// [0, INT_MAX]; Clock::time_point::max() gives INT_MAX.
inline int ms_until(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, std::numeric_limits<int>::max()));
}

// The time left as a timeout for APIs that take one (store waits): at least 1 ms.
inline std::chrono::milliseconds time_left(Clock::time_point deadline) {
  return std::chrono::milliseconds(std::max(1, ms_until(deadline)));
}

// code(): the errno (0 for name resolution); detail(): the system's text alone.
class SocketError : public Error {
 public:
  SocketError(const std::string& what, int code, std::string detail)
      : Error(what), code_(code), detail_(std::move(detail)) {}
  int code() const noexcept { return code_; }
  const std::string& detail() const noexcept { return detail_; }

 private:
  int code_;
  std::string detail_;
};

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT; hang-ups and errors count as ready) or
// the deadline passes (false). Interruptions are retried.
inline bool poll_until(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int rc = ::poll(&p, 1, ms_until(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR)
      throw SocketError(ddp::detail::str("ddp: poll failed: ", errno_text(errno)), errno,
                        errno_text(errno));
  }
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const noexcept { ::freeaddrinfo(a); }
};
using AddrList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// Every address `host` (a name, or a numeric IPv4 or IPv6 address) resolves to, in the resolver's
// order. passive: addresses to bind to. Throws SocketError (code 0, detail the resolver's text).
inline AddrList resolve(const std::string& host, std::uint16_t port, bool passive = false,
                        int socktype = SOCK_STREAM) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc =
          ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
      rc != 0 || !res)
    throw SocketError(
        ddp::detail::str("ddp: cannot resolve ", endpoint(host, port), ": ", ::gai_strerror(rc)), 0,
        ::gai_strerror(rc));
  return AddrList(res);
}

// Numeric host and port: {"10.0.0.1", 29500}, {"::1", 29500}.
inline std::pair<std::string, std::uint16_t> address_of(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  return {buf, port};
}

// The port a socket is bound to (after listen on port 0).
inline std::uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw SocketError(ddp::detail::str("ddp: getsockname failed: ", errno_text(errno)), errno,
                      errno_text(errno));
  return address_of(reinterpret_cast<const sockaddr*>(&ss)).second;
}

inline void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) != 0)
    throw SocketError(ddp::detail::str("ddp: fcntl(O_NONBLOCK) failed: ", errno_text(errno)), errno,
                      errno_text(errno));
}

// Small exchanges (store round trips, frame headers) would wait up to 40 ms for Nagle.
inline void set_nodelay(int fd) noexcept {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Bulk transfers stream with fewer wake-ups (the kernel may cap the values).
inline void set_buffer_sizes(int fd, int bytes) noexcept {
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

// Listens on host:port (port 0: the kernel picks, see local_port; host "": every IPv4 interface),
// trying each resolved address. SO_REUSEADDR lets a restarted job rebind a port in TIME_WAIT; a
// live listener still fails with EADDRINUSE. Throws SocketError naming host:port (last errno).
inline Fd listen(const std::string& host, std::uint16_t port, int backlog) {
  const std::string h = host.empty() ? std::string("0.0.0.0") : host;
  AddrList addrs;
  try {
    addrs = resolve(h, port, true);
  } catch (const SocketError& e) {
    throw SocketError(
        ddp::detail::str("ddp: cannot listen on ", endpoint(h, port), ": ", e.detail()), 0,
        e.detail());
  }
  int last = 0;
  for (const addrinfo* a = addrs.get(); a; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s) {
      last = errno;
      continue;
    }
    int one = 1;
    (void)::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.get(), backlog) == 0)
      return s;
    last = errno;
  }
  throw SocketError(
      ddp::detail::str("ddp: cannot listen on ", endpoint(h, port), ": ", errno_text(last)), last,
      errno_text(last));
}

// A blocking, close-on-exec connection, or an empty Fd after the deadline. Interruptions and
// handshakes the client aborted are retried; other errors throw SocketError.
inline Fd accept(int listen_fd, Clock::time_point deadline) {
  for (;;) {
    if (!poll_until(listen_fd, POLLIN, deadline)) return Fd();
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return Fd(fd);
    if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN && errno != EWOULDBLOCK)
      throw SocketError(ddp::detail::str("ddp: accept failed: ", errno_text(errno)), errno,
                        errno_text(errno));
  }
}

// Which connect() failures are retried until the deadline.
enum class Retry : std::uint8_t {
  // Every failure, name resolution included: the server may start after its clients and DNS may not
  // know a container's name yet (store clients).
  UntilDeadline,
  // Only refused and timed-out attempts: the peer published its address after it started listening,
  // so "unreachable" means a wrong interface and fails at once (the tcp backend's mesh).
  WhileRefused,
};

namespace detail {

// One non-blocking connect() bounded by `deadline`; 0 or the errno.
inline int connect_once(const Fd& s, const addrinfo* a, Clock::time_point deadline) {
  set_nonblocking(s.get(), true);
  if (::connect(s.get(), a->ai_addr, a->ai_addrlen) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  if (!poll_until(s.get(), POLLOUT, deadline)) return ETIMEDOUT;
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

inline bool retried(Retry retry, int err) {
  return retry == Retry::UntilDeadline || err == ECONNREFUSED || err == ETIMEDOUT || err == EINTR ||
         err == EAGAIN;
}

}  // namespace detail

// Retries per `retry` with backoff (10 ms doubling to 1 s) until the deadline; each attempt waits
// at most 5 s (a lost SYN is retried). Returns a blocking socket. Throws SocketError with the last
// failure ("Connection refused (errno 111)", the resolver's text, or "timed out").
inline Fd connect(const std::string& host, std::uint16_t port, Clock::time_point deadline,
                  Retry retry) {
  std::chrono::milliseconds backoff{10};
  int last = 0;
  std::string last_what = "timed out";
  for (;;) {
    bool give_up = false;
    try {
      const AddrList addrs = resolve(host, port);
      for (const addrinfo* a = addrs.get(); a; a = a->ai_next) {
        Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        const int err = s ? detail::connect_once(
                                s, a, std::min(deadline, Clock::now() + std::chrono::seconds(5)))
                          : errno;
        if (err == 0) {
          set_nonblocking(s.get(), false);
          return s;
        }
        last = err;
        last_what = errno_text(err);
        give_up = give_up || !detail::retried(retry, err);
      }
    } catch (const SocketError& e) {  // name resolution
      last = e.code();
      last_what = e.detail();
      give_up = retry != Retry::UntilDeadline;
    }
    const auto now = Clock::now();
    if (give_up || now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds{1000});
  }
  throw SocketError(
      ddp::detail::str("ddp: cannot connect to ", endpoint(host, port), ": ", last_what), last,
      last_what);
}

// How an exact read or write ended.
struct IoStatus {
  enum class Kind : std::uint8_t { Done, TimedOut, Closed, Failed };
  Kind kind = Kind::Done;
  int err = 0;  // Failed: the errno

  explicit operator bool() const noexcept { return kind == Kind::Done; }
  // "timed out", "end of stream", "Connection reset by peer (errno 104)".
  std::string text() const {
    switch (kind) {
      case Kind::Done: return "done";
      case Kind::TimedOut: return "timed out";
      case Kind::Closed: return "end of stream";
      case Kind::Failed: break;
    }
    return errno_text(err);
  }
};

// Blocking or non-blocking fd: readiness comes from poll.
inline IoStatus read_exact(int fd, void* data, std::size_t n, Clock::time_point deadline) {
  auto* p = static_cast<std::byte*>(data);
  std::size_t done = 0;
  while (done < n) {
    if (!poll_until(fd, POLLIN, deadline)) return {.kind = IoStatus::Kind::TimedOut};
    const ssize_t r = ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (r > 0)
      done += static_cast<std::size_t>(r);
    else if (r == 0)
      return {.kind = IoStatus::Kind::Closed};
    else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
      return {.kind = IoStatus::Kind::Failed, .err = errno};
  }
  return {};
}

// Writes exactly n bytes before the deadline; never raises SIGPIPE.
inline IoStatus write_all(int fd, const void* data, std::size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const std::byte*>(data);
  std::size_t done = 0;
  while (done < n) {
    if (!poll_until(fd, POLLOUT, deadline)) return {.kind = IoStatus::Kind::TimedOut};
    const ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0)
      done += static_cast<std::size_t>(w);
    else if (w < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
      return {.kind = IoStatus::Kind::Failed, .err = errno};
  }
  return {};
}

// The local address the kernel would use to reach `to`: a connect()ed UDP socket's getsockname();
// no packet is sent. IPv4 or IPv6, as `to`. Throws SocketError.
inline std::string local_address_towards(const addrinfo* to) {
  Fd s(::socket(to->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (!s || ::connect(s.get(), to->ai_addr, to->ai_addrlen) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0)
    throw SocketError(ddp::detail::str("ddp: no route to ", address_of(to->ai_addr).first, ": ",
                                       errno_text(errno)),
                      errno, errno_text(errno));
  return address_of(reinterpret_cast<const sockaddr*>(&local)).first;
}

// Every interface's addresses of one family (AF_INET, AF_INET6), in the kernel's order:
// {{"lo", "127.0.0.1"}, {"eth0", "10.0.0.2"}}. Throws SocketError when getifaddrs fails.
inline std::vector<std::pair<std::string, std::string>> interface_addresses(int family) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    throw SocketError(ddp::detail::str("ddp: getifaddrs failed: ", errno_text(errno)), errno,
                      errno_text(errno));
  std::vector<std::pair<std::string, std::string>> out;
  for (const ifaddrs* a = list; a; a = a->ifa_next)
    if (a->ifa_addr && a->ifa_addr->sa_family == family)
      out.emplace_back(a->ifa_name, address_of(a->ifa_addr).first);
  ::freeifaddrs(list);
  return out;
}

}  // namespace ddp::net
