// The shared doctest main for every test executable: doctest's own, plus exit code 77 (ctest: skipped)
// when every case that ran passed but some had to skip (support/skip.hpp), so that a machine without a GPU
// never counts a GPU test as passed.
// SPDX-License-Identifier: MIT
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "support/skip.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || rc != 0) return rc;
  if (const int n = ddp::test::skipped_cases().load(); n > 0) {
    std::printf("%d test case(s) skipped (see SKIP above); the others passed: exit 77 (skipped)\n", n);
    return 77;
  }
  return 0;
}
