// ddp version numbers; CMake reads them from here, so this file is the single source.
// SPDX-License-Identifier: MIT
#pragma once

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 1
#define DDP_VERSION_PATCH 0

namespace ddp {

inline constexpr int kVersionMajor = DDP_VERSION_MAJOR;
inline constexpr int kVersionMinor = DDP_VERSION_MINOR;
inline constexpr int kVersionPatch = DDP_VERSION_PATCH;

// "MAJOR.MINOR.PATCH", e.g. "0.1.0".
inline constexpr const char* version_string() noexcept { return "0.1.0"; }

}  // namespace ddp
