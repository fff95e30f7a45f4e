// LaunchFlags: the launch settings given on the command line, taken out of argv before the program
// parses its own flags (cxxopts then never sees them).
// SPDX-License-Identifier: MIT
//
// Every launch variable has a flag with the same spelling, in `--x=v` or `--x v` form:
//   RANK --rank   WORLD_SIZE --world-size   LOCAL_RANK --local-rank   LOCAL_WORLD_SIZE
//     --local-world-size
//   MASTER_ADDR --master-addr   MASTER_PORT --master-port
// plus the legacy `--local_rank=N` / `--local_rank N` that torch.distributed.launch passes without
// --use_env.
//
//   std::vector<std::string> args{"./prog", "--local_rank=1", "--backend=gloo"};
//   LaunchFlags f = extract_launch_flags(args);   // f.local_rank == 1; args == {"./prog",
//     "--backend=gloo"}
//
// args[0] (the program name) is kept and never read as a flag; "--" ends the scan and everything
// after it is left alone. A flag without a value, a value that does not parse, or the same flag
// given twice with different values is a ConfigError naming the flag. Range checks (rank < world
// size, ...) happen in detect(), which also cross-checks --local-rank against LOCAL_RANK.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/env/env.hpp"

namespace ddp::env {

struct LaunchFlags {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  std::optional<std::string> master_addr;
  std::optional<std::uint16_t> master_port;
  std::string local_rank_flag = "--local-rank";  // the spelling that set local_rank, for messages

  bool empty() const {
    return !rank && !world_size && !local_rank && !local_world_size && !master_addr && !master_port;
  }
};

namespace detail {

enum class FlagField { Rank, WorldSize, LocalRank, LocalWorldSize, MasterAddr, MasterPort };

struct FlagSpec {
  std::string_view flag;
  FlagField field;
};

inline constexpr std::array<FlagSpec, 7> kLaunchFlags = {
    {{"--rank", FlagField::Rank},
     {"--world-size", FlagField::WorldSize},
     {"--local-rank", FlagField::LocalRank},
     {"--local_rank", FlagField::LocalRank},
     {"--local-world-size", FlagField::LocalWorldSize},
     {"--master-addr", FlagField::MasterAddr},
     {"--master-port", FlagField::MasterPort}}};

template <class T>
void set_once(std::optional<T>& slot, T value, std::string_view flag) {
  if (slot && *slot != value)
    throw ConfigError(ddp::detail::str("ddp: ", flag, " was given twice with different values (",
                                       *slot, " and ", value, "); pass it once."));
  slot = std::move(value);
}

inline int flag_int(std::string_view flag, std::string_view value) {
  auto v = parse_int(value);
  if (!v || *v < INT32_MIN || *v > INT32_MAX)
    throw ConfigError(
        ddp::detail::str("ddp: ", flag, '=', ddp::detail::quoted(value), " is not an integer."));
  return static_cast<int>(*v);
}

inline std::uint16_t flag_port(std::string_view flag, std::string_view value) {
  auto v = parse_int(value);
  if (!v || *v < 1 || *v > 65535)
    throw ConfigError(ddp::detail::str("ddp: ", flag, '=', ddp::detail::quoted(value),
                                       " is not a TCP port; use a number from 1 to 65535."));
  return static_cast<std::uint16_t>(*v);
}

inline void apply_flag(LaunchFlags& f, const FlagSpec& spec, std::string_view value) {
  switch (spec.field) {
    case FlagField::Rank: set_once(f.rank, flag_int(spec.flag, value), spec.flag); break;
    case FlagField::WorldSize: set_once(f.world_size, flag_int(spec.flag, value), spec.flag); break;
    case FlagField::LocalRank:
      set_once(f.local_rank, flag_int(spec.flag, value), spec.flag);
      f.local_rank_flag = std::string(spec.flag);
      break;
    case FlagField::LocalWorldSize:
      set_once(f.local_world_size, flag_int(spec.flag, value), spec.flag);
      break;
    case FlagField::MasterAddr:
      if (value.empty())
        throw ConfigError(ddp::detail::str("ddp: ", spec.flag,
                                           " is empty; pass the host of rank 0, e.g. ", spec.flag,
                                           "=10.0.0.1."));
      set_once(f.master_addr, std::string(value), spec.flag);
      break;
    case FlagField::MasterPort:
      set_once(f.master_port, flag_port(spec.flag, value), spec.flag);
      break;
  }
}

}  // namespace detail

// Removes the launch flags from `args` (args[0] kept) and returns their values. Throws ConfigError.
inline LaunchFlags extract_launch_flags(std::vector<std::string>& args) {
  LaunchFlags flags;
  std::vector<std::string> kept;
  kept.reserve(args.size());
  std::size_t i = 0;
  if (!args.empty()) kept.push_back(std::move(args[i++]));
  for (; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg == "--") break;
    const detail::FlagSpec* spec = nullptr;
    std::optional<std::string_view> value;
    for (const auto& s : detail::kLaunchFlags) {
      if (arg == s.flag) {
        spec = &s;
      } else if (arg.size() > s.flag.size() && arg.starts_with(s.flag) &&
                 arg[s.flag.size()] == '=') {
        spec = &s;
        value = arg.substr(s.flag.size() + 1);
      }
      if (spec) break;
    }
    if (!spec) {
      kept.push_back(std::move(args[i]));
      continue;
    }
    if (!value) {  // `--x v` form: the value is the next argument, which must not look like a flag
      if (i + 1 >= args.size() || std::string_view(args[i + 1]).starts_with("--"))
        throw ConfigError(ddp::detail::str("ddp: ", spec->flag, " needs a value, e.g. ", spec->flag,
                                           "=",
                                           spec->field == detail::FlagField::MasterAddr ? "10.0.0.1"
                                           : spec->field == detail::FlagField::MasterPort ? "29500"
                                                                                          : "0",
                                           "."));
      value = args[++i];
    }
    detail::apply_flag(flags, *spec, *value);
  }
  for (; i < args.size(); ++i) kept.push_back(std::move(args[i]));
  args = std::move(kept);
  return flags;
}

// The same on a C argv: removes the launch flags in place and updates argc (argv[argc] stays
// nullptr), so that the result can go straight to cxxopts::Options::parse(argc, argv).
inline LaunchFlags extract_launch_flags(int& argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  LaunchFlags flags = extract_launch_flags(args);
  // `args` is an order-preserving subsequence of argv, so compacting the pointers in place is
  // enough.
  int out = 0;
  for (int in = 0; in < argc && out < static_cast<int>(args.size()); ++in)
    if (args[static_cast<std::size_t>(out)] == argv[in]) argv[out++] = argv[in];
  argc = out;
  argv[argc] = nullptr;
  return flags;
}

}  // namespace ddp::env
