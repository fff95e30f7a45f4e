// A fresh directory under the system temp dir, removed with everything in it at scope exit. Unique per
// process and per instance, so parallel test executables and repeated cases never share one.
// SPDX-License-Identifier: MIT
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace ddp::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "ddp_test_") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           (tag + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1)));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace ddp::test
