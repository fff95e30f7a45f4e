// ddprun's command line: LaunchOptions and the parser that fills it (torchrun's spellings
// accepted).
// SPDX-License-Identifier: MIT
//
//   ddprun [--nproc-per-node N] [--nnodes M --node-rank R --master-addr A --master-port P]
//     [--standalone]
//          [--max-restarts K] [--run-id ID] [--monitor-interval S] [--grace-period S] PROGRAM
//            [ARGS...]
//
// How it works: the flags before the first word that does not start with '-' belong to ddprun; that
// word is the program and everything after it is passed to the program untouched (torchrun does the
// same with argparse's REMAINDER). Each flag is one row of kFlags, which also produces the --help
// text, so the help cannot drift from the parser. Both spellings work (--nproc-per-node and
// --nproc_per_node), and a value may follow as the next word or after '=':
//   {"--nproc_per_node=2", "--standalone", "./probe", "--rank", "5"}
//     -> nproc_per_node = 2, standalone = true, program = {"./probe", "--rank", "5"}
#pragma once

#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::launch {

// torchrun's default for static rendezvous
inline constexpr std::uint16_t kDefaultMasterPort = 29500;
inline constexpr std::string_view kDefaultMasterAddr = "127.0.0.1";

struct LaunchOptions {
  int nproc_per_node = 1;  // workers started on this node
  int nnodes = 1;
  int node_rank = 0;  // 0 hosts the store
  std::string master_addr{kDefaultMasterAddr};
  std::uint16_t master_port = kDefaultMasterPort;
  bool standalone = false;  // one node, store on a free port of 127.0.0.1
  int max_restarts = 0;     // restarts of the whole worker group after a failure
  // TORCHELASTIC_RUN_ID; --standalone draws a random one
  std::string run_id = "none";
  bool run_id_given = false;
  std::chrono::milliseconds monitor_interval{100};  // longest sleep of the supervisor's loop
  // SIGTERM -> SIGKILL delay when stopping workers
  std::chrono::milliseconds grace_period{5000};
  bool help = false;  // --help: print usage_text() and run nothing
  // torchrun flags we accept and ignore (--no-python, --tee ...)
  std::vector<std::string> ignored;
  std::vector<std::string> program;  // PROGRAM ARGS...
};

namespace detail {

enum class FlagKind { Int, Port, Seconds, String, Bool, Ignored, IgnoredValue };

struct FlagSpec {
  std::string_view name;  // canonical spelling, dashes: "nproc-per-node"
  FlagKind kind;
  std::string_view value;  // placeholder in the help text
  std::string_view help;
};

inline constexpr std::array<FlagSpec, 15> kFlags{{
    {"nproc-per-node", FlagKind::Int, "N", "workers to start on this node (default 1)"},
    {"nnodes", FlagKind::Int, "M", "number of nodes (default 1)"},
    {"node-rank", FlagKind::Int, "R",
     "index of this node, 0..M-1; node 0 hosts the store (default 0)"},
    {"master-addr", FlagKind::String, "A",
     "address of node 0 (default 127.0.0.1; required when M > 1)"},
    {"master-port", FlagKind::Port, "P", "port of the store on node 0 (default 29500)"},
    {"standalone", FlagKind::Bool, "", "single node; host the store on a free port of 127.0.0.1"},
    {"max-restarts", FlagKind::Int, "K",
     "restart all workers up to K times after a failure (default 0)"},
    {"run-id", FlagKind::String, "ID",
     "TORCHELASTIC_RUN_ID for the workers (default none; random with --standalone)"},
    {"monitor-interval", FlagKind::Seconds, "S",
     "longest pause of the supervisor loop, seconds (default 0.1)"},
    {"grace-period", FlagKind::Seconds, "S",
     "seconds between SIGTERM and SIGKILL when stopping workers (default 5)"},
    {"no-python", FlagKind::Ignored, "",
     "accepted for torchrun compatibility; ddprun always executes PROGRAM"},
    {"redirects", FlagKind::IgnoredValue, "X",
     "accepted and ignored (output is always rank-prefixed)"},
    {"tee", FlagKind::IgnoredValue, "X", "accepted and ignored (output is always rank-prefixed)"},
    {"log-dir", FlagKind::IgnoredValue, "DIR", "accepted and ignored"},
    {"help", FlagKind::Bool, "", "print this help"},
}};

inline std::string valid_flags() {
  std::vector<std::string> names;
  for (const auto& f : kFlags) names.push_back(ddp::detail::str("--", f.name));
  return ddp::detail::join(names, ", ");
}

// "--nproc_per_node" -> "nproc-per-node"; torchrun's short aliases -r/-t map to redirects/tee.
inline std::string canonical_flag(std::string_view word) {
  if (word == "-r") return "redirects";
  if (word == "-t") return "tee";
  std::string name(word.substr(word.starts_with("--") ? 2 : 1));
  for (char& c : name)
    if (c == '_') c = '-';
  return name;
}

inline int parse_int_flag(std::string_view flag, std::string_view text, int min_value) {
  int v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || text.empty())
    throw ConfigError(ddp::detail::str("ddp: ddprun: --", flag, "=", ddp::detail::quoted(text),
                                       " is not an integer."));
  if (v < min_value)
    throw ConfigError(ddp::detail::str("ddp: ddprun: --", flag, "=", v,
                                       " is out of range; it must be at least ", min_value, "."));
  return v;
}

inline std::uint16_t parse_port_flag(std::string_view flag, std::string_view text) {
  int v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || text.empty() || v < 1 || v > 65535)
    throw ConfigError(
        ddp::detail::str("ddp: ddprun: --", flag, "=", ddp::detail::quoted(text),
                         " is not a TCP port (1-65535); use --standalone to pick a free one."));
  return static_cast<std::uint16_t>(v);
}

// Seconds as in torchrun ("5", "0.5"), kept as whole milliseconds.
inline std::chrono::milliseconds parse_seconds_flag(std::string_view flag, std::string_view text,
                                                    double min_value) {
  double v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || text.empty() || !std::isfinite(v) || v < min_value ||
      v > 1e6)
    throw ConfigError(ddp::detail::str("ddp: ddprun: --", flag, "=", ddp::detail::quoted(text),
                                       " is not a number of seconds (", min_value,
                                       " to 1e6, e.g. 0.5)."));
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(v * 1000.0)));
}

}  // namespace detail

// The --help text, generated from kFlags.
inline std::string usage_text() {
  std::string out =
      "usage: ddprun [flags] PROGRAM [ARGS...]\n"
      "Starts N copies of PROGRAM with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, "
      "MASTER_ADDR, ...),\n"
      "hosts the rendezvous store on node 0, prefixes each output line with its rank, and restarts "
      "or stops\n"
      "all workers when one fails. Flags may be spelled with '-' or '_' and take values as '--f V' "
      "or '--f=V'.\n";
  for (const auto& f : detail::kFlags) {
    std::string left = ddp::detail::str("  --", f.name, f.value.empty() ? "" : " ", f.value);
    if (left.size() < 26) left.resize(26, ' ');
    out += ddp::detail::str(left, ' ', f.help, '\n');
  }
  return out;
}

// Parses ddprun's arguments (argv without argv[0]). Throws ConfigError naming the flag for a bad
// flag or value, a missing program, or contradictory flags. Never prints and never exits.
inline LaunchOptions parse_launch_args(std::span<const std::string> args) {
  LaunchOptions o;
  bool port_given = false, addr_given = false;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "--") {
      ++i;
      break;
    }
    if (!word.starts_with("-") || word == "-") break;  // the program
    std::string_view body(word);
    std::optional<std::string> inline_value;
    if (auto eq = body.find('='); eq != std::string_view::npos) {
      inline_value = std::string(body.substr(eq + 1));
      body = body.substr(0, eq);
    }
    const std::string name = detail::canonical_flag(body);
    const detail::FlagSpec* spec = nullptr;
    for (const auto& f : detail::kFlags)
      if (f.name == name) spec = &f;
    if (spec == nullptr || (!body.starts_with("--") && body != "-r" && body != "-t"))
      throw ConfigError(ddp::detail::str("ddp: ddprun: unknown flag ", ddp::detail::quoted(body),
                                         ". Valid flags: ", detail::valid_flags(),
                                         ". Flags go before PROGRAM; run ddprun --help."));
    const bool takes_value =
        spec->kind != detail::FlagKind::Bool && spec->kind != detail::FlagKind::Ignored;
    std::string value;
    if (takes_value) {
      if (inline_value) {
        value = *inline_value;
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        throw ConfigError(ddp::detail::str("ddp: ddprun: --", name, " needs a value (--", name, ' ',
                                           spec->value, ")."));
      }
    } else if (inline_value) {
      throw ConfigError(ddp::detail::str("ddp: ddprun: --", name, " takes no value (got ",
                                         ddp::detail::quoted(*inline_value), ")."));
    }
    if (name == "nproc-per-node")
      o.nproc_per_node = detail::parse_int_flag(name, value, 1);
    else if (name == "nnodes")
      o.nnodes = detail::parse_int_flag(name, value, 1);
    else if (name == "node-rank")
      o.node_rank = detail::parse_int_flag(name, value, 0);
    else if (name == "master-addr")
      o.master_addr = value, addr_given = true;
    else if (name == "master-port")
      o.master_port = detail::parse_port_flag(name, value), port_given = true;
    else if (name == "standalone")
      o.standalone = true;
    else if (name == "max-restarts")
      o.max_restarts = detail::parse_int_flag(name, value, 0);
    else if (name == "run-id")
      o.run_id = value, o.run_id_given = true;
    else if (name == "monitor-interval")
      o.monitor_interval = detail::parse_seconds_flag(name, value, 0.001);
    else if (name == "grace-period")
      o.grace_period = detail::parse_seconds_flag(name, value, 0.0);
    else if (name == "help")
      o.help = true;
    else
      o.ignored.push_back(std::string(body));
  }
  for (; i < args.size(); ++i) o.program.push_back(args[i]);
  if (o.help) return o;

  if (o.program.empty())
    throw ConfigError(
        "ddp: ddprun: no PROGRAM given. Usage: ddprun [flags] PROGRAM [ARGS...]; run ddprun "
        "--help.");
  if (o.master_addr.empty())
    throw ConfigError(
        "ddp: ddprun: --master-addr is empty; give the address of node 0 (e.g. --master-addr "
        "10.0.0.1).");
  if (o.node_rank >= o.nnodes)
    throw ConfigError(ddp::detail::str("ddp: ddprun: --node-rank=", o.node_rank,
                                       " must be less than --nnodes=", o.nnodes,
                                       "; nodes are numbered 0..", o.nnodes - 1, "."));
  if (o.nnodes > 1 && !addr_given)
    throw ConfigError(
        ddp::detail::str("ddp: ddprun: --nnodes=", o.nnodes,
                         " needs --master-addr, the address of node 0 that every node can reach "
                         "(ddprun does not guess one for several nodes)."));
  if (o.standalone && o.nnodes > 1)
    throw ConfigError(
        ddp::detail::str("ddp: ddprun: --standalone runs a single node but --nnodes=", o.nnodes,
                         "; drop --standalone and give --master-addr/--master-port."));
  if (o.standalone && (port_given || addr_given))
    throw ConfigError(
        "ddp: ddprun: --standalone picks its own address and free port; drop "
        "--master-addr/--master-port "
        "or drop --standalone.");
  return o;
}

}  // namespace ddp::launch
