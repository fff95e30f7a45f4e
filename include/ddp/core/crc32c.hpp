// CRC32C (Castagnoli): the checksum of TFRecord framing (train/tensorboard.hpp), iSCSI and ext4.
// SPDX-License-Identifier: MIT
//
//   ddp::crc32c("123456789") == 0xE3069283            // the standard check value
//   ddp::crc32c_update(ddp::crc32c(a), b) == ddp::crc32c(a + b)
//   ddp::masked_crc32c(bytes)                          // TFRecord's stored form (see below)
// Reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF; a 256-entry table built
// at compile time, one byte per step (about 0.5 GB/s: enough for event files, not meant for bulk
// data).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace ddp {

namespace detail {

inline constexpr std::array<std::uint32_t, 256> kCrc32cTable = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}();

}  // namespace detail

// Continues `crc` (the value crc32c returned for the bytes before) over `bytes`; crc32c_update(0,
// b) == crc32c(b).
inline std::uint32_t crc32c_update(std::uint32_t crc,
                                   std::span<const std::uint8_t> bytes) noexcept {
  std::uint32_t c = ~crc;
  for (const std::uint8_t b : bytes) c = detail::kCrc32cTable[(c ^ b) & 0xFFu] ^ (c >> 8);
  return ~c;
}
inline std::uint32_t crc32c(std::span<const std::uint8_t> bytes) noexcept {
  return crc32c_update(0, bytes);
}
inline std::uint32_t crc32c(std::string_view s) noexcept {
  return crc32c({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
}

// TFRecord stores CRCs masked (rotate right by 15, add a constant) because a CRC of data that
// itself contains CRCs is weak; tensorflow/core/lib/hash/crc32c.h Mask().
inline std::uint32_t mask_crc32c(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}
inline std::uint32_t masked_crc32c(std::span<const std::uint8_t> bytes) noexcept {
  return mask_crc32c(crc32c(bytes));
}

}  // namespace ddp
