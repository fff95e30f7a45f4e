// core: the error hierarchy and the DDP_CHECK macros.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/core/check.hpp>
#include <ddp/core/error.hpp>
#include <string>
#include <vector>

TEST_SUITE("core") {
  TEST_CASE("every error kind is a ddp::Error and a std::runtime_error") {
    CHECK_THROWS_AS(throw ddp::ConfigError("x"), ddp::Error);
    CHECK_THROWS_AS(throw ddp::ValueError("x"), ddp::Error);
    CHECK_THROWS_AS(throw ddp::IoError("x"), ddp::Error);
    CHECK_THROWS_AS(throw ddp::StoreError("x"), ddp::Error);
    CHECK_THROWS_AS(throw ddp::CommError("x"), ddp::Error);
    CHECK_THROWS_AS(throw ddp::TimeoutError("x"), ddp::Error);
    CHECK_THROWS_AS(throw ddp::CudaError("x"), std::runtime_error);
    CHECK_THROWS_WITH(throw ddp::ConfigError("ddp: bad RANK"), "ddp: bad RANK");
  }

  TEST_CASE("DDP_CHECK_EQ prints both values and the caller's message") {
    int a = 3, b = 4;
    CHECK_THROWS_WITH_AS(DDP_CHECK_EQ(a, b, "shapes must match"),
                         doctest::Contains("ddp: check failed: a == b (3 vs 4. shapes must match) at "), ddp::Error);
    CHECK_NOTHROW(DDP_CHECK_EQ(a, 3));
    CHECK_THROWS_WITH(DDP_CHECK_LT(b, a), doctest::Contains("b < a (4 vs 3)"));
    CHECK_THROWS_WITH(DDP_CHECK_GE(a, b), doctest::Contains("a >= b (3 vs 4)"));
    CHECK_THROWS_WITH(DDP_CHECK_NE(a, 3), doctest::Contains("a != 3 (3 vs 3)"));
    CHECK_NOTHROW(DDP_CHECK_LE(a, b));
    CHECK_NOTHROW(DDP_CHECK_GT(b, a));
  }

  TEST_CASE("DDP_CHECK and DDP_CHECK_AS name the condition, the message and the file") {
    CHECK_THROWS_WITH(DDP_CHECK(1 + 1 == 3, "math is ", "broken"),
                      doctest::Contains("ddp: check failed: 1 + 1 == 3 (math is broken) at "));
    CHECK_THROWS_WITH(DDP_CHECK(false), doctest::Contains("test_error.cpp:"));
    CHECK_THROWS_AS(DDP_CHECK_AS(ddp::ValueError, false, "batch is empty"), ddp::ValueError);
    CHECK_NOTHROW(DDP_CHECK(true));
  }

  TEST_CASE("str and join format messages") {
    CHECK(ddp::detail::str("rank ", 3, '/', 4) == "rank 3/4");
    CHECK(ddp::detail::join(std::vector<int>{1, 2, 3}, ", ") == "1, 2, 3");
    CHECK(ddp::detail::join(std::vector<std::string>{}, ", ").empty());
    CHECK(ddp::detail::quoted("3x") == "'3x'");
  }
}
