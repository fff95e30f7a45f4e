// Env: an injected, immutable snapshot of environment variables, with strict typed readers whose
// errors name the variable, the launcher it was read for, and the fix.
// SPDX-License-Identifier: MIT
//
// Launcher policies never call getenv(): production code passes Env::process(), tests build one
// from a table, so no test ever needs setenv and tests can run in parallel.
//
//   auto env = ddp::env::Env::from({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
//   env.int_var("RANK", "torchrun");        // 3
//   env.int_var("LOCAL_RANK", "torchrun");  // ConfigError: "ddp: launched by torchrun but
//       LOCAL_RANK is not set. torchrun always exports it; if you start workers yourself,
//       export LOCAL_RANK or pass --local-rank."
//
// An empty value counts as unset (`export MASTER_ADDR=` leaves the variable present but says
// nothing). Env is a value type (a copy copies the map), safe to read from several threads.
#pragma once

#include <unistd.h>  // environ (glibc declares it under _GNU_SOURCE, which g++ and clang++ define)

#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::env {

namespace detail {

// The flag spelt like a torch-style variable, or "" if none: flag_for("LOCAL_WORLD_SIZE") ==
// "--local-world-size". Launcher-specific names (OMPI_COMM_WORLD_RANK, ...) have none; the flags
// override the field whatever the launcher.
inline std::string flag_for(std::string_view name) {
  static constexpr std::string_view kWithFlag[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  for (std::string_view v : kWithFlag) {
    if (v != name) continue;
    std::string flag = "--";
    for (char c : name) flag += c == '_' ? '-' : static_cast<char>(c - 'A' + 'a');
    return flag;
  }
  return {};
}

// Parses a whole decimal integer ("-2", "17"); nullopt for "", "3x", " 3", "0x10" or overflow.
inline std::optional<long long> parse_int(std::string_view s) {
  long long v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc{} || ptr != end) return std::nullopt;
  return v;
}

}  // namespace detail

class Env {
 public:
  using Map = std::map<std::string, std::string, std::less<>>;

  Env() = default;
  explicit Env(Map vars) : vars_(std::move(vars)) {}

  // A snapshot of this process's environment, taken now; later setenv calls do not change it.
  static Env process() {
    Map vars;
    for (char** e = ::environ; e != nullptr && *e != nullptr; ++e) {
      std::string_view entry(*e);
      auto eq = entry.find('=');
      if (eq == std::string_view::npos) continue;
      vars.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
    }
    return Env(std::move(vars));
  }

  // For tests and for programs that build an environment (example above).
  static Env from(std::initializer_list<std::pair<const std::string, std::string>> vars) {
    return Env(Map(vars.begin(), vars.end()));
  }

  // A copy with `name` set to `value` (removed when nullopt); handy for table-driven tests.
  Env with(std::string_view name, std::optional<std::string_view> value) const {
    Env copy = *this;
    if (value)
      copy.vars_.insert_or_assign(std::string(name), std::string(*value));
    else if (auto it = copy.vars_.find(name); it != copy.vars_.end())
      copy.vars_.erase(it);
    return copy;
  }

  bool has(std::string_view name) const {
    auto it = vars_.find(name);
    return it != vars_.end() && !it->second.empty();
  }

  std::optional<std::string> get(std::string_view name) const {
    auto it = vars_.find(name);
    if (it == vars_.end() || it->second.empty()) return std::nullopt;
    return it->second;
  }

  // A variable the launcher must have set; ConfigError naming it, the launcher and the fix.
  std::string var(std::string_view name, std::string_view launcher) const {
    if (auto v = get(name)) return *v;
    std::string flag = detail::flag_for(name);
    throw ConfigError(ddp::detail::str("ddp: launched by ", launcher, " but ", name,
                                       " is not set. ", launcher,
                                       " always exports it; if you start workers yourself, export ",
                                       name, flag.empty() ? "" : " or pass ", flag, "."));
  }

  // A required 32-bit integer: missing -> var()'s error; "3x" -> "... is not an integer."
  int int_var(std::string_view name, std::string_view launcher) const {
    return to_int(name, var(name, launcher), launcher);
  }

  // An optional integer: nullopt when unset, but a value that is present must parse.
  std::optional<int> int_get(std::string_view name, std::string_view launcher) const {
    if (auto v = get(name)) return to_int(name, *v, launcher);
    return std::nullopt;
  }

  // A required TCP port, 1..65535.
  std::uint16_t port_var(std::string_view name, std::string_view launcher) const {
    return to_port(name, var(name, launcher), launcher);
  }

  std::optional<std::uint16_t> port_get(std::string_view name, std::string_view launcher) const {
    if (auto v = get(name)) return to_port(name, *v, launcher);
    return std::nullopt;
  }

  const Map& vars() const noexcept { return vars_; }

 private:
  static int to_int(std::string_view name, std::string_view value, std::string_view launcher) {
    auto v = detail::parse_int(value);
    std::string_view digits = value;
    if (digits.starts_with('-')) digits.remove_prefix(1);
    const bool integer_form =
        !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
    if (!v && !integer_form)
      throw ConfigError(ddp::detail::str("ddp: ", name, "=", ddp::detail::quoted(value), " (from ",
                                         launcher, ") is not an integer."));
    if (!v || *v < INT32_MIN || *v > INT32_MAX)  // !v here: digits past 64 bits
      throw ConfigError(ddp::detail::str("ddp: ", name, "=", ddp::detail::quoted(value), " (from ",
                                         launcher, ") is out of range: it must fit in 32 bits (",
                                         INT32_MIN, " to ", INT32_MAX, ")."));
    return static_cast<int>(*v);
  }

  static std::uint16_t to_port(std::string_view name, std::string_view value,
                               std::string_view launcher) {
    auto v = detail::parse_int(value);
    if (!v || *v < 1 || *v > 65535)
      throw ConfigError(ddp::detail::str("ddp: ", name, "=", ddp::detail::quoted(value), " (from ",
                                         launcher,
                                         ") is not a TCP port; use a number from 1 to 65535."));
    return static_cast<std::uint16_t>(*v);
  }

  Map vars_;
};

}  // namespace ddp::env
