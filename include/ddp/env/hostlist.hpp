// Slurm's compressed host lists ("node[01-03,07],gpu5") and task counts ("2(x3),1"), expanded.
// SPDX-License-Identifier: MIT
//
// How a host list expands: split at the commas outside brackets; each item is literal text with
// zero or more bracket groups, and expands to the cartesian product of its groups, left to right. A
// group is a comma-separated list of numbers or ranges lo-hi; numbers are zero-padded to the width
// of lo as written.
//   "node[01-03,07],gpu5"   -> node01 node02 node03 node07 gpu5
//   "rack[1-2]-n[8-9]"      -> rack1-n8 rack1-n9 rack2-n8 rack2-n9
//   "n[9-11]"               -> n9 n10 n11          (width 1: no padding)
//   "n[098-100]"            -> n098 n099 n100
// How a task count list expands: comma-separated counts, each optionally repeated with "(xN)":
//   "2(x3),1"               -> 2 2 2 1
// Malformed input is a ConfigError naming the variable and the launcher; expansion stops at
// kMaxHosts entries or kMaxHostListBytes characters in all, so that a corrupt value cannot exhaust
// memory (a 4 KiB value like "<4000 chars>[0-999999]" would otherwise expand to 4 GB).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/env/env.hpp"

namespace ddp::env {

inline constexpr std::size_t kMaxHosts = std::size_t{1} << 20;
// characters of all hosts together
inline constexpr std::size_t kMaxHostListBytes = std::size_t{16} << 20;

namespace detail {

[[noreturn]] inline void bad_list(std::string_view var, std::string_view value,
                                  std::string_view launcher, std::string_view what,
                                  std::string_view expected, std::string_view fix) {
  throw ConfigError(ddp::detail::str("ddp: ", var, '=', ddp::detail::quoted(value), " (from ",
                                     launcher, ") is not ", expected, ": ", what, ". ", fix));
}

// Splits at commas outside brackets: "a[1,2],b" -> "a[1,2]", "b".
inline std::vector<std::string_view> split_top_level(std::string_view s) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') ++depth;
    if (s[i] == ']') --depth;
    if (s[i] == ',' && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

inline bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace detail

// Expands a Slurm host list. `var` and `launcher` only label errors.
inline std::vector<std::string> expand_hostlist(std::string_view value,
                                                std::string_view var = "SLURM_JOB_NODELIST",
                                                std::string_view launcher = "Slurm srun") {
  constexpr std::string_view kWhat = "a Slurm host list";
  auto fail = [&](std::string_view what) {
    detail::bad_list(var, value, launcher, what, kWhat,
                     "Export MASTER_ADDR=<host of rank 0> to bypass it.");
  };
  std::vector<std::string> hosts;
  std::size_t bytes = 0;  // characters in `hosts`; bytes + partial_bytes stays <= kMaxHostListBytes
  auto too_large = [&] { fail("it expands to too many hosts"); };
  if (value.empty()) fail("it is empty");
  for (std::string_view item : detail::split_top_level(value)) {
    if (item.empty()) fail("it has an empty entry");
    std::vector<std::string> partial{""};  // expansions of the item's prefix parsed so far
    std::size_t partial_bytes = 0;         // their characters
    std::size_t i = 0;
    while (i < item.size()) {
      std::size_t open = item.find_first_of("[]", i);
      if (open != std::string_view::npos && item[open] == ']') fail("']' without '['");
      std::string_view literal =
          item.substr(i, open == std::string_view::npos ? item.npos : open - i);
      if (literal.size() * partial.size() > kMaxHostListBytes - bytes - partial_bytes) too_large();
      for (auto& p : partial) p += literal;
      partial_bytes += literal.size() * partial.size();
      if (open == std::string_view::npos) break;
      std::size_t close = item.find(']', open);
      if (close == std::string_view::npos) fail("'[' without ']'");
      std::string_view group = item.substr(open + 1, close - open - 1);
      if (group.find('[') != std::string_view::npos) fail("nested '['");
      std::vector<std::string> numbers;
      std::size_t numbers_bytes = 0;
      std::size_t start = 0;
      while (start <= group.size()) {
        std::size_t comma = group.find(',', start);
        std::string_view range =
            group.substr(start, comma == std::string_view::npos ? group.npos : comma - start);
        std::size_t dash = range.find('-');
        std::string_view lo = range.substr(0, dash);
        std::string_view hi = dash == std::string_view::npos ? lo : range.substr(dash + 1);
        if (!detail::all_digits(lo) || !detail::all_digits(hi))
          fail(ddp::detail::str("range ", ddp::detail::quoted(range), " is not N or N-M"));
        auto a = detail::parse_int(lo), b = detail::parse_int(hi);
        if (!a || !b || *a > *b)
          fail(ddp::detail::str("range ", ddp::detail::quoted(range), " is empty or too large"));
        // Bounded before expanding anything: the hosts this group will make (every prefix times
        // every number of every range so far) must fit kMaxHosts and kMaxHostListBytes; width
        // bounds each number.
        const auto count = static_cast<std::size_t>(*b - *a);  // numbers in the range, minus one
        const std::size_t width = std::max(lo.size(), hi.size());
        const std::size_t n_after = numbers.size() + count + 1;
        if (count >= kMaxHosts || partial.size() * n_after > kMaxHosts - hosts.size() ||
            partial_bytes * n_after + (numbers_bytes + (count + 1) * width) * partial.size() >
                kMaxHostListBytes - bytes)
          too_large();
        for (long long n = *a; n <= *b; ++n) {
          std::string digits = std::to_string(n);
          if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
          numbers_bytes += digits.size();
          numbers.push_back(std::move(digits));
        }
        if (comma == std::string_view::npos) break;
        start = comma + 1;
      }
      if (partial.size() * numbers.size() > kMaxHosts - hosts.size()) too_large();
      // Every prefix once per number plus every number once per prefix (both factors bounded
      // above).
      const std::size_t next_bytes =
          partial_bytes * numbers.size() + numbers_bytes * partial.size();
      if (next_bytes > kMaxHostListBytes - bytes) too_large();
      std::vector<std::string> next;
      next.reserve(partial.size() * numbers.size());
      for (const auto& p : partial)
        for (const auto& n : numbers) next.push_back(p + n);
      partial = std::move(next);
      partial_bytes = next_bytes;
      i = close + 1;
    }
    if (partial.size() > kMaxHosts - hosts.size()) too_large();
    for (auto& p : partial) hosts.push_back(std::move(p));
    bytes += partial_bytes;
  }
  return hosts;
}

// Expands a Slurm task count list ("2(x3),1" -> {2, 2, 2, 1}).
inline std::vector<int> expand_tasks_per_node(std::string_view value,
                                              std::string_view var = "SLURM_STEP_TASKS_PER_NODE",
                                              std::string_view launcher = "Slurm srun") {
  constexpr std::string_view kWhat = "a Slurm task count list like '2(x3),1'";
  auto fail = [&](std::string_view what) {
    detail::bad_list(var, value, launcher, what, kWhat, "srun sets it; do not set it by hand.");
  };
  std::vector<int> counts;
  if (value.empty()) fail("it is empty");
  for (std::string_view item : detail::split_top_level(value)) {
    std::string_view count = item, repeat = "1";
    if (auto paren = item.find('('); paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')')
        fail(ddp::detail::str("entry ", ddp::detail::quoted(item), " is not N or N(xK)"));
      count = item.substr(0, paren);
      repeat = item.substr(paren + 2, item.size() - paren - 3);
    }
    long long c = 0, r = 0;
    if (detail::all_digits(count) && detail::all_digits(repeat)) {
      c = detail::parse_int(count).value_or(0);
      r = detail::parse_int(repeat).value_or(0);
    }
    if (c < 1 || c > 1'000'000 || r < 1)
      fail(ddp::detail::str("entry ", ddp::detail::quoted(item),
                            " is not N or N(xK) with N, K >= 1"));
    if (static_cast<std::size_t>(r) > kMaxHosts - counts.size()) fail("it lists too many nodes");
    counts.insert(counts.end(), static_cast<std::size_t>(r), static_cast<int>(c));
  }
  return counts;
}

}  // namespace ddp::env
