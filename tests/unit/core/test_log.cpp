// core: log levels, rank prefixes, and the bad-value error for DDP_LOG_LEVEL.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/core/log.hpp>
#include <string>
#include <vector>

namespace {
std::vector<std::string>& captured() {
  static std::vector<std::string> lines;
  return lines;
}
void capture(std::string_view line) { captured().emplace_back(line); }

struct CaptureLog {
  CaptureLog() {
    captured().clear();
    ddp::log::set_sink(&capture);
  }
  ~CaptureLog() {
    ddp::log::set_sink(nullptr);
    ddp::log::set_level(ddp::log::Level::Info);
    ddp::log::set_rank(-1, 0);
  }
};
}  // namespace

TEST_SUITE("core") {
  TEST_CASE("levels parse case-insensitively and bad ones name the variable and the choices") {
    using ddp::log::Level;
    CHECK(ddp::log::parse_level("WARN") == Level::Warn);
    CHECK(ddp::log::parse_level("warning") == Level::Warn);
    CHECK(ddp::log::parse_level("off") == Level::Off);
    CHECK_THROWS_WITH_AS(ddp::log::parse_level("loud"),
                         "ddp: DDP_LOG_LEVEL='loud' is not a log level; use one of trace, debug, info, warn, error, off.",
                         ddp::ConfigError);
    CHECK_THROWS_AS(ddp::log::init("verbose"), ddp::ConfigError);
  }

  TEST_CASE("lines below the level are dropped; the rank prefix appears once set") {
    CaptureLog guard;
    ddp::log::set_level(ddp::log::Level::Warn);
    DDP_LOG_INFO("hidden");
    DDP_LOG_WARN("shown ", 1);
    ddp::log::set_rank(2, 4);
    DDP_LOG_ERROR("bad ", "thing");
    REQUIRE(captured().size() == 2);
    CHECK(captured()[0] == "ddp: WARN: shown 1\n");
    CHECK(captured()[1] == "ddp[rank 2/4] ERROR: bad thing\n");
    ddp::log::set_level(ddp::log::Level::Off);
    DDP_LOG_ERROR("nothing");
    CHECK(captured().size() == 2);
  }
}
