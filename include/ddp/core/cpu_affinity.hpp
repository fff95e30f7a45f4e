// CPU lists ("0-3,6", as taskset -c and Linux's cpuset files write them) and pinning a thread to
// one: for the communication progress threads (CommOptions::progress_cpus, --comm-cpus /
// DDP_COMM_CPUS; Horovod's HOROVOD_THREAD_AFFINITY), so that communication can run on a core that
// training threads leave free.
// SPDX-License-Identifier: MIT
//
//   parse_cpu_list("1", "--comm-cpus")       -> {1}
//   parse_cpu_list("0-2,5", "--comm-cpus")   -> {0, 1, 2, 5}
//   parse_cpu_list("2-1", "--comm-cpus")     -> ConfigError "ddp: --comm-cpus '2-1': range 2-1 runs
//     backwards; ..."
//   pin_thread(t, {1}, "--comm-cpus")        -> t runs on CPU 1 only; ConfigError naming
//     --comm-cpus and the
//                                               CPUs this process may use when the kernel refuses
#pragma once

#include <pthread.h>
#include <sched.h>

#include <charconv>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp {

// The CPUs of a list such as "0-3,6" in ascending order, each once; empty text: none. ConfigError
// naming `what` (the flag or variable) on anything else.
inline std::vector<int> parse_cpu_list(std::string_view text, std::string_view what) {
  auto bad = [&](const std::string& why) {
    return ConfigError(
        ddp::detail::str("ddp: ", what, " '", text, "': ", why,
                         "; write CPU numbers and ranges separated by commas, e.g. 1 or 0-3,6"));
  };
  auto number = [&](std::string_view s) {
    int v = -1;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0 || v >= CPU_SETSIZE)
      throw bad(ddp::detail::str("'", s, "' is not a CPU number (0..", CPU_SETSIZE - 1, ")"));
    return v;
  };
  std::set<int> cpus;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    const std::size_t dash = item.find('-');
    const int lo = number(item.substr(0, dash));
    const int hi = dash == std::string_view::npos ? lo : number(item.substr(dash + 1));
    if (hi < lo) throw bad(ddp::detail::str("range ", lo, "-", hi, " runs backwards"));
    for (int c = lo; c <= hi; ++c) cpus.insert(c);
    pos = comma + 1;
    if (comma + 1 == text.size()) throw bad("it ends with a comma");
  }
  return {cpus.begin(), cpus.end()};
}

// The CPUs this process may run on (sched_getaffinity), as a list for messages: "0-1" is written
// "0,1".
inline std::string allowed_cpus_text() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return "unknown";
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return ddp::detail::join(cpus, ",");
}

// Restricts `t` to `cpus` (nothing to do when empty). ConfigError naming `what` when the kernel
// refuses (a CPU that does not exist or is outside this process's cpuset).
inline void pin_thread(std::thread& t, const std::vector<int>& cpus, std::string_view what) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (const int rc = ::pthread_setaffinity_np(t.native_handle(), sizeof set, &set); rc != 0)
    throw ConfigError(
        ddp::detail::str("ddp: ", what, " ", ddp::detail::join(cpus, ","),
                         ": the kernel refused to pin the communication thread there (",
                         std::strerror(rc), "); this process may use CPUs ", allowed_cpus_text()));
}

}  // namespace ddp
