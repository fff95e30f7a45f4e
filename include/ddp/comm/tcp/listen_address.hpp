// choose_listen_address: the local address a rank of the tcp backend listens on for its mesh.
// SPDX-License-Identifier: MIT
//
// How it is chosen: --socket-ifname / DDP_SOCKET_IFNAME names an interface, which must exist with
// an IPv4 address (the error lists the ones that do); otherwise we take the local address the
// kernel would use to reach master_addr, IPv4 or IPv6 as master_addr resolves
// (net::local_address_towards: a UDP connect, no packet sent). That is a loopback address only when
// master_addr itself is local, so a multi-node job never silently listens on 127.0.0.1.
#pragma once

#include <sys/socket.h>

#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/net.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::tcp {

namespace detail {

// Every interface's IPv4 address, for error messages: "lo=127.0.0.1, eth0=10.0.0.2".
inline std::string list_interfaces() {
  std::string out;
  try {
    for (const auto& [name, ip] : net::interface_addresses(AF_INET))
      out += ddp::detail::str(out.empty() ? "" : ", ", name, '=', ip);
  } catch (const net::SocketError&) {
    return "(getifaddrs failed)";
  }
  return out.empty() ? "(none with IPv4)" : out;
}

}  // namespace detail

// The address this rank listens on (see the file comment). Throws ConfigError naming the flag that
// fixes it.
inline std::string choose_listen_address(const std::string& ifname,
                                         const std::string& master_addr) {
  if (!ifname.empty()) {
    try {
      for (const auto& [name, ip] : net::interface_addresses(AF_INET))
        if (name == ifname) return ip;
    } catch (const net::SocketError& e) {
      throw CommError(e.what());
    }
    throw ConfigError(ddp::detail::str(
        "ddp: DDP_SOCKET_IFNAME/--socket-ifname=", ddp::detail::quoted(ifname),
        " is not an interface with an IPv4 address here; interfaces: ", detail::list_interfaces(),
        "."));
  }
  if (master_addr.empty())
    throw ConfigError(
        "ddp: the tcp backend needs the master address to pick the interface to listen on, but "
        "MASTER_ADDR (--master-addr) is empty; set it, or name the interface with "
        "DDP_SOCKET_IFNAME (--socket-ifname).");
  net::AddrList to;
  try {
    // any port: a UDP connect only picks a route
    to = net::resolve(master_addr, 9, false, SOCK_DGRAM);
  } catch (const net::SocketError& e) {
    throw ConfigError(ddp::detail::str("ddp: cannot resolve MASTER_ADDR ",
                                       ddp::detail::quoted(master_addr), ": ", e.detail(),
                                       ". Check MASTER_ADDR (--master-addr)."));
  }
  try {
    return net::local_address_towards(to.get());
  } catch (const net::SocketError& e) {
    throw ConfigError(ddp::detail::str("ddp: no route from this host to MASTER_ADDR=", master_addr,
                                       " (", e.detail(),
                                       "); interfaces: ", detail::list_interfaces(),
                                       ". Name one with DDP_SOCKET_IFNAME (--socket-ifname)."));
  }
}

}  // namespace ddp::comm::tcp
