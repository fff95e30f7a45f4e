// parse_args: cxxopts::Options::parse whose errors name the flag (cxxopts says "Argument 'abc'
// failed to parse" and stops there, leaving the user to guess which of twenty flags it was).
// SPDX-License-Identifier: MIT
//
//   const auto args = ddp::train::parse_args(options, argc, argv);
//   // ./resnet --batch_size abc  ->  ConfigError "ddp: --batch_size: 'abc' is not a value of its
//     type (cxxopts:
//   //                                  Argument 'abc' failed to parse); --help lists the flags and
//     their defaults"
// Every other cxxopts error (an unknown flag, a missing value) already names its option; it becomes
// a ConfigError with "ddp: " in front, so the programs' error path is one exception type. The
// "--help lists ..." hint is added only where `options` has a --help
// (train::init_process_group(argc, argv, options) adds one).
#pragma once

#include <cctype>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <cxxopts.hpp>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::train {

namespace detail {

// The argument cxxopts quotes in "Argument ‘abc’ failed to parse" (UTF-8 quotes, or ASCII ones
// where cxxopts was built without them), or "" when the text has another form.
inline std::string quoted_argument(std::string_view what) {
  for (const auto& [open, close] :
       {std::pair<std::string_view, std::string_view>{"\u2018", "\u2019"},
        std::pair<std::string_view, std::string_view>{"'", "'"}}) {
    const std::size_t a = what.find(open);
    if (a == std::string_view::npos) continue;
    const std::size_t b = what.find(close, a + open.size());
    if (b != std::string_view::npos)
      return std::string(what.substr(a + open.size(), b - a - open.size()));
  }
  return {};
}

// The flag of argv whose value `value` cxxopts cannot parse: each "--name=value", "--name value" or
// "-n value" is parsed alone, and the first that fails is the one ("--name abc --batch_size abc"
// names --batch_size when only it takes a number); "" when none fails alone.
inline std::string flag_with_bad_value(cxxopts::Options& options, int argc, const char* const* argv,
                                       std::string_view value) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (!a.starts_with("-")) continue;
    std::string flag;
    const char* alone[3] = {argv[0], argv[i], nullptr};
    int n = 2;
    if (const std::size_t eq = a.find('='); eq != std::string_view::npos) {
      if (a.substr(eq + 1) != value) continue;
      flag = a.substr(0, eq);
    } else if (i + 1 < argc && std::string_view(argv[i + 1]) == value) {
      flag = a;
      alone[2] = argv[i + 1];
      n = 3;
    } else {
      continue;
    }
    try {
      (void)options.parse(n, alone);
    } catch (const cxxopts::exceptions::incorrect_argument_type&) {
      return flag;
    } catch (const cxxopts::exceptions::exception&) {  // not this one
    }
  }
  return {};
}

// Whether `options` has the option of long name `name` ("help"), or, for a one-letter `name`, of
// that short name.
inline bool has_option(const cxxopts::Options& options, std::string_view name) {
  // generic: only the branch of this cxxopts' type is instantiated
  const auto named = [&](const auto& o) {
    if (name.size() == 1 && o.s == name) return true;
    // cxxopts < 3.1: one long name
    if constexpr (std::is_same_v<std::decay_t<decltype(o.l)>, std::string>) {
      return o.l == name;
    } else {
      for (const std::string& l : o.l)
        if (l == name) return true;
      return false;
    }
  };
  for (const std::string& group : options.groups())
    for (const cxxopts::HelpOptionDetails& o : options.group_help(group).options)
      if (named(o)) return true;
  return false;
}

}  // namespace detail

// A switch's value: true/1/on/yes or false/0/off/no (any case); anything else is a ConfigError
// naming `flag`.
inline bool parse_flag_bool(std::string_view flag, std::string_view value) {
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "true" || v == "1" || v == "on" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "off" || v == "no") return false;
  throw ConfigError(ddp::detail::str(
      "ddp: ", flag, " takes true or false (also 1/0, on/off, yes/no), got '", value, "'"));
}

inline cxxopts::ParseResult parse_args(cxxopts::Options& options, int argc,
                                       const char* const* argv) {
  try {
    return options.parse(argc, argv);
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    const bool help = detail::has_option(options, "help");
    const std::string value = detail::quoted_argument(e.what());
    const std::string flag =
        value.empty() ? std::string() : detail::flag_with_bad_value(options, argc, argv, value);
    if (flag.empty())
      throw ConfigError(
          ddp::detail::str("ddp: ", e.what(), help ? "; --help lists the flags" : ""));
    throw ConfigError(ddp::detail::str("ddp: ", flag, ": ", ddp::detail::quoted(value),
                                       " is not a value of its type (cxxopts: ", e.what(), ")",
                                       help ? "; --help lists the flags and their defaults" : ""));
  } catch (const cxxopts::exceptions::exception& e) {
    throw ConfigError(ddp::detail::str(
        "ddp: ", e.what(), detail::has_option(options, "help") ? "; --help lists the flags" : ""));
  }
}

}  // namespace ddp::train
