// Clock: the one clock ddp measures time and deadlines with.
// SPDX-License-Identifier: MIT
//
//   const auto deadline = ddp::Clock::now() + opts.timeout;   // timeouts, step times, trace spans
// Monotonic (steady_clock): wall-clock adjustments (NTP, a changed system time) never shorten a
// timeout nor make a duration negative. Where a wall time is written out (trace files), it is
// derived from one system_clock reading taken next to a Clock reading.
#pragma once

#include <chrono>

namespace ddp {

using Clock = std::chrono::steady_clock;

}  // namespace ddp
