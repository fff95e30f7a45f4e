// The env tests' comparison of two LaunchInfo (doctest).
// SPDX-License-Identifier: MIT
#pragma once

#include <doctest/doctest.h>

#include <ddp/env/describe.hpp>

namespace ddp_test {

// got equals want field by field (compared as JSON, so a failure prints both).
inline void check_info(const ddp::env::LaunchInfo& got, const ddp::env::LaunchInfo& want) {
  CHECK(ddp::env::to_json(got) == ddp::env::to_json(want));
}

}  // namespace ddp_test
