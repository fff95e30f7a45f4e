// core: log levels, rank prefixes, and the bad-value error for DDP_LOG_LEVEL.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/core/log.hpp>
#include <string>
#include <vector>

#include "support/log_capture.hpp"

using ddp::test::LogCapture;

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
    LogCapture guard;
    ddp::log::set_level(ddp::log::Level::Warn);
    DDP_LOG_INFO("hidden");
    DDP_LOG_WARN("shown ", 1);
    ddp::log::set_rank(2, 4);
    DDP_LOG_ERROR("bad ", "thing");
    REQUIRE(guard.lines().size() == 2);
    CHECK(guard.lines()[0] == "ddp: WARN: shown 1\n");
    CHECK(guard.lines()[1] == "ddp[rank 2/4] ERROR: bad thing\n");
    ddp::log::set_level(ddp::log::Level::Off);
    DDP_LOG_ERROR("nothing");
    CHECK(guard.lines().size() == 2);
  }
}
