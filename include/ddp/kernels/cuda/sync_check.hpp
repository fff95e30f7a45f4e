// DDP_CUDA_SYNC_CHECK: the debug mode that checks every kernel launch where it happens.
// SPDX-License-Identifier: MIT
//
// A fault inside a kernel (an illegal address, a device-side assert) is reported by CUDA at the
// next call that waits for the GPU, often many launches and several layers later, so the error
// names the wrong op. With DDP_CUDA_SYNC_CHECK=1 every launch helper (kernels/cuda/launch.cuh:
// check_launch, sync_check_after) also waits for the launching stream and throws a CudaError naming
// the kernel and the stream:
//   DDP_CUDA_SYNC_CHECK=1 ./resnet --device cuda ...
//   ddp: kernel implicit_gemm_kernel on stream 0x5581c3a0 failed: cudaErrorIllegalAddress (an
//     illegal memory
//   access was encountered); found by DDP_CUDA_SYNC_CHECK=1, which waits for the stream after every
//     launch
// It serialises the host with the GPU (slow: for debugging only). Valid values: 1 (on), 0 (off);
// unset or empty: off. Anything else is a ConfigError at the first launch, naming the variable and
// the values (core/log.hpp reads DDP_LOG_LEVEL the same way). The variable is read once per
// process. Plain C++ (no CUDA headers), so the parsing is tested on any machine.
#pragma once

#include <cstdlib>
#include <optional>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::kernels::cuda {

inline constexpr std::string_view kSyncCheckVar = "DDP_CUDA_SYNC_CHECK";

// The mode for the variable's value (nullopt or "": unset).
inline bool parse_sync_check(std::optional<std::string_view> value) {
  if (!value || value->empty() || *value == "0") return false;
  if (*value == "1") return true;
  throw ConfigError(ddp::detail::str(
      "ddp: ", kSyncCheckVar, "=", ddp::detail::quoted(*value),
      " is not valid; use 1 (after every CUDA kernel launch, wait for its stream and "
      "name the kernel that failed; slow, for debugging) or 0 (off, the default)"));
}

// This process's mode: DDP_CUDA_SYNC_CHECK read and parsed on the first call (thread-safe); a bad
// value throws the ConfigError above at every call.
inline bool sync_check_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv(kSyncCheckVar.data());
    return parse_sync_check(v ? std::optional<std::string_view>(v) : std::nullopt);
  }();
  return enabled;
}

}  // namespace ddp::kernels::cuda
