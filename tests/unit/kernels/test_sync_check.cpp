// kernels: DDP_CUDA_SYNC_CHECK, the debug mode that waits for the stream after every CUDA kernel launch
// (kernels/cuda/sync_check.hpp): the values it takes and the error for any other, on the host (the
// launch-side behaviour runs on a GPU in tests/gpu/smoke/test_cuda_sync_check.cu).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <string_view>

#include <ddp/core/error.hpp>
#include <ddp/kernels/cuda/sync_check.hpp>

using ddp::kernels::cuda::parse_sync_check;

TEST_SUITE("kernels") {
  TEST_CASE("DDP_CUDA_SYNC_CHECK: 1 turns it on; 0, empty or unset leave it off") {
    CHECK(parse_sync_check("1"));
    CHECK_FALSE(parse_sync_check("0"));
    CHECK_FALSE(parse_sync_check(""));
    CHECK_FALSE(parse_sync_check(std::nullopt));
  }

  TEST_CASE("DDP_CUDA_SYNC_CHECK: any other value is a ConfigError naming the variable and the valid values") {
    for (const std::string_view bad : {"yes", "true", "on", "2", " 1", "1 ", "01"}) {
      CAPTURE(bad);
      const std::string want = "ddp: DDP_CUDA_SYNC_CHECK='" + std::string(bad) + "' is not valid; use 1";
      CHECK_THROWS_WITH_AS(parse_sync_check(bad), doctest::Contains(want.c_str()), ddp::ConfigError);
    }
    CHECK_THROWS_WITH_AS(parse_sync_check("yes"),
                         "ddp: DDP_CUDA_SYNC_CHECK='yes' is not valid; use 1 (after every CUDA kernel launch, wait for "
                         "its stream and name the kernel that failed; slow, for debugging) or 0 (off, the default)",
                         ddp::ConfigError);
  }
}
