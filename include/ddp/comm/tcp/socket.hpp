// Sockets for the tcp backend: an owning Fd, choosing the local address to listen on, listen/accept/
// connect with deadlines, and exact reads/writes for the connection handshake.
// SPDX-License-Identifier: MIT
//
// Address selection (issue 4): --socket-ifname / DDP_SOCKET_IFNAME names an interface, which must exist
// (the error lists the ones that do); otherwise we take the local address the kernel would use to reach
// master_addr: connect() a UDP socket to it and read getsockname(). No packet is sent. This is the
// loopback address only when master_addr itself is local, so a multi-node job never silently listens
// on 127.0.0.1.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/fd.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::tcp {

using Clock = std::chrono::steady_clock;

using Fd = ddp::Fd;

namespace detail {

inline std::string errno_text(int e) { return ddp::detail::str(std::strerror(e), " (errno ", e, ")"); }

inline int ms_until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000 ? 1'000'000 : static_cast<int>(left);
}

// All IPv4 addresses per interface, for choosing and for error messages: "lo=127.0.0.1, eth0=10.0.0.2".
inline std::string list_interfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "(getifaddrs failed)";
  std::string out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    out += ddp::detail::str(out.empty() ? "" : ", ", a->ifa_name, '=', buf);
  }
  ::freeifaddrs(list);
  return out.empty() ? "(none with IPv4)" : out;
}

inline bool is_loopback(const std::string& ip) { return ip.rfind("127.", 0) == 0; }

// Resolves host (name or dotted quad) to an IPv4 address; throws ConfigError naming `what`.
inline in_addr resolve_ipv4(const std::string& host, std::string_view what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || !res)
    throw ConfigError(ddp::detail::str("ddp: cannot resolve ", what, " ", ddp::detail::quoted(host), ": ",
                                       ::gai_strerror(rc), ". Check MASTER_ADDR (--master-addr)."));
  in_addr a = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

inline std::string ip_text(in_addr a) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

}  // namespace detail

// The IPv4 address this rank listens on (see the file comment).
inline std::string choose_listen_address(const std::string& ifname, const std::string& master_addr) {
  if (!ifname.empty()) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0)
      throw CommError(ddp::detail::str("ddp: getifaddrs failed: ", detail::errno_text(errno)));
    std::string found;
    for (ifaddrs* a = list; a; a = a->ifa_next)
      if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && ifname == a->ifa_name) {
        found = detail::ip_text(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr);
        break;
      }
    ::freeifaddrs(list);
    if (found.empty())
      throw ConfigError(ddp::detail::str("ddp: DDP_SOCKET_IFNAME/--socket-ifname=", ddp::detail::quoted(ifname),
                                         " is not an interface with an IPv4 address here; interfaces: ",
                                         detail::list_interfaces(), "."));
    return found;
  }
  if (master_addr.empty())
    throw ConfigError("ddp: the tcp backend needs the master address to pick the interface to listen on, but "
                      "MASTER_ADDR (--master-addr) is empty; set it, or name the interface with "
                      "DDP_SOCKET_IFNAME (--socket-ifname).");
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // any port: connect() on UDP only picks a route
  to.sin_addr = detail::resolve_ipv4(master_addr, "MASTER_ADDR");
  Fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (!s || ::connect(s.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0)
    throw ConfigError(ddp::detail::str("ddp: no route from this host to MASTER_ADDR=", master_addr, " (",
                                       detail::errno_text(errno), "); interfaces: ", detail::list_interfaces(),
                                       ". Name one with DDP_SOCKET_IFNAME (--socket-ifname)."));
  return detail::ip_text(local.sin_addr);
}

inline void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Larger kernel buffers let a ring step stream with fewer wake-ups (the kernel may cap the values).
inline void set_buffer_sizes(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

// Listens on ip:0; returns the socket and the port the kernel chose.
inline std::pair<Fd, std::uint16_t> listen_any_port(const std::string& ip, int backlog) {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr = detail::resolve_ipv4(ip, "listen address");
  socklen_t len = sizeof addr;
  if (!s || ::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(s.get(), backlog) != 0 || ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw CommError(ddp::detail::str("ddp: cannot listen on ", ip, ":0: ", detail::errno_text(errno),
                                     ". Pick another interface with DDP_SOCKET_IFNAME (--socket-ifname)."));
  return {std::move(s), ntohs(addr.sin_port)};
}

// Accepts one connection before the deadline; an empty Fd when it passed.
inline Fd accept_until(int listen_fd, Clock::time_point deadline) {
  for (;;) {
    pollfd p{.fd = listen_fd, .events = POLLIN, .revents = 0};
    int rc = ::poll(&p, 1, detail::ms_until(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return Fd();
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return Fd(fd);
    if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN)
      throw CommError(ddp::detail::str("ddp: accept failed: ", detail::errno_text(errno)));
  }
}

// Connects to ip:port, retrying refused connections until the deadline (the peer may be slow to listen).
inline Fd connect_until(const std::string& ip, std::uint16_t port, Clock::time_point deadline) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr = detail::resolve_ipv4(ip, "peer address");
  int last = 0;
  auto backoff = std::chrono::milliseconds(1);
  while (Clock::now() < deadline) {
    Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return s;
    last = errno;
    if (last != ECONNREFUSED && last != EINTR && last != ETIMEDOUT && last != EAGAIN) break;
    std::this_thread::sleep_for(backoff);  // retry with backoff, bounded by the deadline
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
  throw CommError(ddp::detail::str("ddp: cannot connect to ", ip, ':', port, ": ",
                                   last ? detail::errno_text(last) : std::string("timed out"),
                                   ". A firewall or the wrong interface? Set DDP_SOCKET_IFNAME (--socket-ifname)."));
}

// Blocking exact I/O for the handshake on a blocking socket, bounded by SO_RCVTIMEO/SO_SNDTIMEO.
inline void set_io_timeout(int fd, std::chrono::milliseconds t) {
  timeval tv{.tv_sec = static_cast<time_t>(t.count() / 1000), .tv_usec = static_cast<suseconds_t>(t.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}
inline bool write_all(int fd, const void* p, std::size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}
inline bool read_all(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

}  // namespace ddp::comm::tcp
