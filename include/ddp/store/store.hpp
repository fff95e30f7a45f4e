// The key-value Store interface used for rendezvous: the same operations as PyTorch's c10d::Store.
// SPDX-License-Identifier: MIT
//
// Contract (all implementations):
// - Thread-safe: any method may be called from several threads at once.
// - Blocking reads (get, wait) wait until every key exists or the timeout passes, then throw
//   ddp::TimeoutError naming the keys, the timeout and where the store lives.
// - Values are raw bytes; integers written by add() are decimal ASCII, as in PyTorch.
// - Failures of the transport throw ddp::StoreError naming host:port and the likely cause.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::store {

using Bytes = std::vector<std::uint8_t>;

inline Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
inline std::string to_string(std::span<const std::uint8_t> b) {
  return std::string(b.begin(), b.end());
}

// PyTorch's default: 5 minutes
inline constexpr std::chrono::milliseconds kDefaultStoreTimeout{300'000};

// While alive, every blocking store call of this thread (connect, round trip, get, wait) gives up
// after at most `cap`, whatever its own timeout: for best-effort calls such as publishing a failure
// when the store's host may be frozen (SIGSTOP) or unreachable, where a full timeout would double
// the time to exit. Per thread (other threads keep their timeouts); nests, the smaller cap winning.
class ScopedTimeoutCap {
 public:
  explicit ScopedTimeoutCap(std::chrono::milliseconds cap) noexcept : saved_(current_) {
    if (saved_.count() == 0 || cap < saved_) current_ = cap;
  }
  ~ScopedTimeoutCap() { current_ = saved_; }
  ScopedTimeoutCap(const ScopedTimeoutCap&) = delete;
  ScopedTimeoutCap& operator=(const ScopedTimeoutCap&) = delete;

 private:
  friend std::chrono::milliseconds capped_timeout(std::chrono::milliseconds t) noexcept;
  // this thread's cap (zero: none)
  static inline thread_local std::chrono::milliseconds current_{0};
  std::chrono::milliseconds saved_;
};

// `t`, lowered to this thread's ScopedTimeoutCap if one is active. Store implementations apply it
// to every timeout they block for.
inline std::chrono::milliseconds capped_timeout(std::chrono::milliseconds t) noexcept {
  const auto cap = ScopedTimeoutCap::current_;
  return cap.count() > 0 && cap < t ? cap : t;
}

class Store {
 public:
  explicit Store(std::chrono::milliseconds timeout = kDefaultStoreTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(std::string_view key, std::span<const std::uint8_t> value) = 0;
  // Waits up to timeout() for the key to exist.
  virtual Bytes get(std::string_view key) = 0;
  // Adds delta to the integer stored at key (0 when absent) and returns the new value.
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;
  // Sets key to desired when its value equals expected, or it is absent and expected is empty;
  // returns the value now stored (as torch: absent and expected non-empty -> expected, unstored).
  virtual Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                            std::span<const std::uint8_t> desired) = 0;
  // True when every key exists; never blocks.
  virtual bool check(std::span<const std::string> keys) = 0;
  // Blocks until every key exists or the timeout passes (TimeoutError).
  virtual void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) = 0;
  void wait(std::span<const std::string> keys) { wait(keys, timeout_); }
  // True when the key existed.
  virtual bool delete_key(std::string_view key) = 0;
  virtual std::int64_t num_keys() = 0;
  // Appends value to the bytes at key (creates the key when absent).
  virtual void append(std::string_view key, std::span<const std::uint8_t> value) = 0;

  // Defaults loop over get/set; backends with a batched wire form override them.
  virtual std::vector<Bytes> multi_get(std::span<const std::string> keys) {
    std::vector<Bytes> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(get(k));
    return out;
  }
  virtual void multi_set(std::span<const std::string> keys, std::span<const Bytes> values) {
    if (keys.size() != values.size())
      throw ValueError(::ddp::detail::str("ddp: store multi_set got ", keys.size(), " keys but ",
                                          values.size(), " values"));
    for (std::size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
  }

  // Convenience overloads for text values.
  void set(std::string_view key, std::string_view value) {
    set(key, std::span<const std::uint8_t>(to_bytes(value)));
  }
  std::string get_string(std::string_view key) { return to_string(get(key)); }
  bool check(std::string_view key) {
    std::string k(key);
    return check(std::span<const std::string>(&k, 1));
  }
  void wait(std::string_view key) {
    std::string k(key);
    wait(std::span<const std::string>(&k, 1), timeout_);
  }

  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ = t; }

 protected:
  std::chrono::milliseconds timeout_;
};

}  // namespace ddp::store
