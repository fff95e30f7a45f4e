// Test cases that cannot run on this machine (no GPU, ...) return early after note_skipped(); the shared
// main (doctest_main.cpp) then exits 77, which ctest reports as skipped, but only when nothing failed: the
// other cases of the same executable (host-only checks beside GPU ones) still run, and still fail the test.
// SPDX-License-Identifier: MIT
#pragma once

#include <atomic>
#include <cstdio>

namespace ddp::test {

inline std::atomic<int>& skipped_cases() {
  static std::atomic<int> n{0};
  return n;
}

// Records one skipped case; the first one prints why (once per executable).
inline void note_skipped(const char* why) {
  if (skipped_cases().fetch_add(1) == 0) {
    std::printf("SKIP: %s\n", why);
    std::fflush(stdout);
  }
}

}  // namespace ddp::test
