// train::parse_args: a value cxxopts cannot parse is reported with the flag that carried it, in each of the
// spellings (--name=value, --name value, -n value); other cxxopts errors become ConfigErrors.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <ddp/core/error.hpp>
#include <ddp/train/parse_args.hpp>

namespace {

cxxopts::Options parse_args_test_options() {
  cxxopts::Options o("prog", "test");
  o.add_options()("batch_size", "per rank", cxxopts::value<long>()->default_value("16"))(
      "clip-grad-norm", "max norm", cxxopts::value<double>()->default_value("0"))(
      "n,steps", "steps", cxxopts::value<int>()->default_value("1"))("name", "a string", cxxopts::value<std::string>());
  return o;
}

std::string parse_args_error(std::vector<const char*> argv, bool with_help = false) {
  argv.insert(argv.begin(), "prog");
  cxxopts::Options o = parse_args_test_options();
  if (with_help) o.add_options()("h,help", "this help");
  try {
    (void)ddp::train::parse_args(o, static_cast<int>(argv.size()), argv.data());
  } catch (const ddp::ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("parse_args names the flag whose value does not parse") {
    CHECK(parse_args_error({"--batch_size", "abc"}).starts_with("ddp: --batch_size: 'abc' is not a value of its type"));
    CHECK(parse_args_error({"--steps=3", "--clip-grad-norm=1e"}).starts_with("ddp: --clip-grad-norm: '1e' "));
    CHECK(parse_args_error({"-n", "x7"}).starts_with("ddp: -n: 'x7' is not a value of its type"));
    // The same text as another flag's good value does not confuse it: the flag that cannot take it is named.
    CHECK(parse_args_error({"--name", "abc", "--batch_size=abc"}).starts_with("ddp: --batch_size: 'abc' "));
    const std::string e = parse_args_error({"--batch_size", "2.5"}, true);
    CHECK(e.find("--help lists the flags and their defaults") != std::string::npos);
    CHECK(e.find("failed to parse") != std::string::npos);  // cxxopts' own words are kept
  }

  TEST_CASE("parse_args points to --help only where the program has one") {
    CHECK(parse_args_error({"--no-such-flag"}, true).ends_with("; --help lists the flags"));
    CHECK(parse_args_error({"--no-such-flag"}).find("--help") == std::string::npos);
    CHECK(parse_args_error({"--batch_size", "2.5"}).find("--help") == std::string::npos);
    CHECK(parse_args_error({"--batch_size", "2.5"}).ends_with(")"));
  }

  TEST_CASE("parse_args: good input parses, other cxxopts errors become ConfigError") {
    std::vector<const char*> argv = {"prog", "--batch_size=8", "-n", "3"};
    cxxopts::Options o = parse_args_test_options();
    const auto args = ddp::train::parse_args(o, static_cast<int>(argv.size()), argv.data());
    CHECK(args["batch_size"].as<long>() == 8);
    CHECK(args["steps"].as<int>() == 3);
    CHECK(parse_args_error({"--no-such-flag"}).find("no-such-flag") != std::string::npos);
    CHECK(parse_args_error({"--batch_size"}).rfind("ddp: ", 0) == 0);  // missing value
  }

  TEST_CASE("quoted_argument reads cxxopts' quotes, UTF-8 or ASCII") {
    CHECK(ddp::train::detail::quoted_argument("Argument \u2018abc\u2019 failed to parse") == "abc");
    CHECK(ddp::train::detail::quoted_argument("Argument 'x y' failed to parse") == "x y");
    CHECK(ddp::train::detail::quoted_argument("no quotes") == "");
  }
}
