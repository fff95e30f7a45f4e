// DDP_CHECK_INPUTS: the debug mode that catches an input freed before its module's backward, on
// both devices.
// SPDX-License-Identifier: MIT
//
// Modules keep a VIEW of their input from forward to backward (nn/module.hpp). An input destroyed
// in between is a use after free that no error reports: its memory goes back to the caching pool,
// the next tensor of the same size class takes it, and backward reads that tensor instead (a Linear
// whose batch was freed gave sum |grad| about 1e31). AddressSanitizer finds it only where the reads
// are instrumented (not inside OpenBLAS, not on the GPU). With DDP_CHECK_INPUTS=1, Module::forward
// stamps the pool block holding its input (CachingPool::stamp: the block and the serial number of
// the allocation that handed it out), and Module::backward throws ValueError naming the module if
// that block was freed, or freed and handed out again, since. Addresses the pool did not hand out
// (a caller's own buffer in a view; every host address under DDP_CPU_CACHING=0) are not checked.
// Cost when on: two map lookups under the pool's lock per module call. Off (the default): one test
// of a cached bool, and an input freed early is undefined behaviour as before (garbage gradients).
//   DDP_CHECK_INPUTS=1 ./resnet ...
#pragma once

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::nn {

inline constexpr std::string_view kCheckInputsVar = "DDP_CHECK_INPUTS";

// The mode for the variable's value (nullopt or "": unset).
inline bool parse_check_inputs(std::optional<std::string_view> value) {
  if (!value || value->empty() || *value == "0") return false;
  if (*value == "1") return true;
  throw ConfigError(ddp::detail::str(
      "ddp: ", kCheckInputsVar, "=", ddp::detail::quoted(*value),
      " is not valid; use 1 (backward checks that each module's forward input was not "
      "freed in between; for debugging) or 0 (off, the default)"));
}

namespace detail {
// DDP_CHECK_INPUTS read and parsed on the first call (thread-safe); a bad value throws at every
// call.
inline std::atomic<bool>& check_inputs_flag() {
  static std::atomic<bool> flag = [] {
    const char* v = std::getenv(kCheckInputsVar.data());
    return parse_check_inputs(v ? std::optional<std::string_view>(v) : std::nullopt);
  }();
  return flag;
}
}  // namespace detail

// This process's mode.
inline bool check_inputs_enabled() {
  return detail::check_inputs_flag().load(std::memory_order_relaxed);
}
// Overrides DDP_CHECK_INPUTS for the rest of the process (a program's own debug flag, the tests).
// Switch it between steps: a backward checks only inputs that its forward stamped.
inline void set_check_inputs(bool on) {
  detail::check_inputs_flag().store(on, std::memory_order_relaxed);
}

}  // namespace ddp::nn
