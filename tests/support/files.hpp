// Whole-file reads and writes for tests: a file as text or as bytes, and bytes or text written over a file.
// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ddp::test {

// The file's contents ("" when it cannot be opened).
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The file's contents as bytes (empty when it cannot be opened).
inline std::vector<std::uint8_t> slurp_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Replaces the file's contents with `bytes`.
inline void spit(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Replaces the file's contents with the bytes of `text`.
inline void spit_text(const std::string& path, const std::string& text) {
  spit(path, std::vector<std::uint8_t>(text.begin(), text.end()));
}

}  // namespace ddp::test
