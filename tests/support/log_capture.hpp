// LogCapture: while alive, every line the ddp logger writes is kept here instead of going to stderr; on
// destruction the logger's sink, level and rank prefix are restored to their defaults. One at a time.
//   LogCapture log;  do_something();  CHECK(log.contains("caching allocator"));  CHECK(log.lines().size() == 1);
// Thread-safe: lines may come from any thread (servers, progress threads); saw() waits for one (bounded).
// SPDX-License-Identifier: MIT
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <ddp/core/log.hpp>

namespace ddp::test {

class LogCapture {
 public:
  LogCapture() {
    clear();
    ddp::log::set_level(ddp::log::Level::Info);
    ddp::log::set_sink(&capture);
  }
  ~LogCapture() {
    ddp::log::set_sink(nullptr);
    ddp::log::set_level(ddp::log::Level::Info);
    ddp::log::set_rank(-1, 0);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Every captured line so far, '\n' included, in order.
  std::vector<std::string> lines() const {
    std::lock_guard l(mu());
    return store();
  }
  void clear() {
    std::lock_guard l(mu());
    store().clear();
  }
  bool contains(std::string_view needle) const {
    std::lock_guard l(mu());
    for (const auto& s : store())
      if (s.find(needle) != std::string::npos) return true;
    return false;
  }
  // Waits up to `limit` for a line containing `needle` (for lines written by another thread).
  bool saw(std::string_view needle, std::chrono::milliseconds limit = std::chrono::seconds(2)) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!contains(needle)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::string>& store() {
    static std::vector<std::string> l;
    return l;
  }
  static void capture(std::string_view line) {
    std::lock_guard l(mu());
    store().emplace_back(line);
  }
};

}  // namespace ddp::test
