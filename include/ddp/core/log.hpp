// Rank-prefixed logging with levels, to stderr, one whole line per call (lines from threads never
// interleave).
// SPDX-License-Identifier: MIT
//
//   ddp::log::set_rank(2, 4);
//   DDP_LOG_INFO("store ready on ", host, ':', port);   ->  "ddp[rank 2/4] INFO: store ready on
//     h:29500"
//
// The level comes from DDP_LOG_LEVEL (trace|debug|info|warn|error|off, default info). Programs call
// log::init() early so that a bad value is a ConfigError at start-up; if they do not, the first log
// call reads the variable and, if it is invalid, says so in a warning line instead of throwing,
// because logging must never throw from a destructor or an error path.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::log {

enum class Level : int { Trace = 0, Debug = 1, Info = 2, Warn = 3, Error = 4, Off = 5 };

inline constexpr std::string_view kLevelNames[] = {"trace", "debug", "info",
                                                   "warn",  "error", "off"};

inline std::string_view level_name(Level l) noexcept { return kLevelNames[static_cast<int>(l)]; }

// Parses "warn", "WARN", "warning"; anything else is nullopt.
inline std::optional<Level> try_parse_level(std::string_view s) {
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (lower == "warning") lower = "warn";
  for (int i = 0; i <= static_cast<int>(Level::Off); ++i)
    if (lower == kLevelNames[i]) return static_cast<Level>(i);
  return std::nullopt;
}

// Throws ConfigError naming the variable and the valid choices.
inline Level parse_level(std::string_view s, std::string_view source = "DDP_LOG_LEVEL") {
  if (auto l = try_parse_level(s)) return *l;
  throw ConfigError(
      detail::str("ddp: ", source, "=", detail::quoted(s),
                  " is not a log level; use one of trace, debug, info, warn, error, off."));
}

namespace detail {
using Sink = void (*)(std::string_view line);  // receives one whole line, '\n' included
struct State {
  std::atomic<int> level{-1};       // -1: not initialised yet
  std::atomic<Sink> sink{nullptr};  // nullptr: stderr
  std::atomic<int> rank{-1};        // -1: rank unknown (before launch detection)
  std::atomic<int> world{0};
  std::mutex out;
};
inline State& state() {
  static State s;
  return s;
}
inline void write_line(std::string_view prefix_level, std::string_view msg) {
  auto& s = state();
  std::string line;
  int rank = s.rank.load(std::memory_order_relaxed);
  if (rank >= 0)
    line = ddp::detail::str("ddp[rank ", rank, '/', s.world.load(std::memory_order_relaxed), "] ",
                            prefix_level, msg, '\n');
  else
    line = ddp::detail::str("ddp: ", prefix_level, msg, '\n');
  std::lock_guard<std::mutex> lock(s.out);
  if (Sink sink = s.sink.load()) {
    sink(line);
    return;
  }
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}
}  // namespace detail

// Sets the level from `value` (or DDP_LOG_LEVEL when empty); throws ConfigError on a bad value.
inline void init(std::optional<std::string_view> value = std::nullopt) {
  Level l = Level::Info;
  if (value) {
    l = parse_level(*value, "--log-level");
  } else if (const char* env = std::getenv("DDP_LOG_LEVEL"); env && *env) {
    l = parse_level(env);
  }
  detail::state().level.store(static_cast<int>(l));
}

inline void set_level(Level l) noexcept { detail::state().level.store(static_cast<int>(l)); }

inline Level level() noexcept {
  auto& s = detail::state();
  int l = s.level.load(std::memory_order_relaxed);
  if (l >= 0) return static_cast<Level>(l);
  Level parsed = Level::Info;
  const char* env = std::getenv("DDP_LOG_LEVEL");
  bool bad = false;
  if (env && *env) {
    if (auto p = try_parse_level(env))
      parsed = *p;
    else
      bad = true;
  }
  int expected = -1;
  if (s.level.compare_exchange_strong(expected, static_cast<int>(parsed)) && bad)
    detail::write_line(
        "WARN: ",
        ddp::detail::str("DDP_LOG_LEVEL=", ddp::detail::quoted(env),
                         " is not a log level (trace|debug|info|warn|error|off); using info"));
  return static_cast<Level>(s.level.load());
}

// Every line after this carries "ddp[rank r/world]".
inline void set_rank(int rank, int world_size) noexcept {
  detail::state().world.store(world_size);
  detail::state().rank.store(rank);
}

// Redirects every line to `sink` (nullptr restores stderr). Calls are serialised by the logger.
inline void set_sink(detail::Sink sink) noexcept { detail::state().sink.store(sink); }

inline bool enabled(Level l) noexcept {
  return l != Level::Off && static_cast<int>(l) >= static_cast<int>(level());
}

template <class... Args>
void write(Level l, Args&&... args) noexcept {
  if (!enabled(l)) return;
  static constexpr std::string_view kTags[] = {
      "TRACE: ", "DEBUG: ", "INFO: ", "WARN: ", "ERROR: ", ""};
  try {
    detail::write_line(kTags[static_cast<int>(l)], ddp::detail::str(std::forward<Args>(args)...));
    // out of memory while formatting: drop the line rather than throw from a log call
  } catch (...) {
  }
}

}  // namespace ddp::log

#define DDP_LOG_TRACE(...) ::ddp::log::write(::ddp::log::Level::Trace, __VA_ARGS__)
#define DDP_LOG_DEBUG(...) ::ddp::log::write(::ddp::log::Level::Debug, __VA_ARGS__)
#define DDP_LOG_INFO(...) ::ddp::log::write(::ddp::log::Level::Info, __VA_ARGS__)
#define DDP_LOG_WARN(...) ::ddp::log::write(::ddp::log::Level::Warn, __VA_ARGS__)
#define DDP_LOG_ERROR(...) ::ddp::log::write(::ddp::log::Level::Error, __VA_ARGS__)
