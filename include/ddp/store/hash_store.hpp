// HashStore: an in-process Store (a map under a mutex); ranks-as-threads tests rendezvous through
// it.
// SPDX-License-Identifier: MIT
#pragma once

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>

#include "ddp/store/store.hpp"

namespace ddp::store {

class HashStore final : public Store {
 public:
  explicit HashStore(std::chrono::milliseconds timeout = kDefaultStoreTimeout) : Store(timeout) {}

  void set(std::string_view key, std::span<const std::uint8_t> value) override {
    {
      std::lock_guard lock(mu_);
      map_[std::string(key)] = Bytes(value.begin(), value.end());
    }
    cv_.notify_all();
  }
  using Store::set;

  Bytes get(std::string_view key) override {
    std::string k(key);
    std::unique_lock lock(mu_);
    wait_locked(lock, std::span<const std::string>(&k, 1), timeout_);
    return map_.at(k);
  }

  std::int64_t add(std::string_view key, std::int64_t delta) override {
    std::int64_t value = 0;
    {
      std::lock_guard lock(mu_);
      auto& slot = map_[std::string(key)];
      if (!slot.empty()) {
        auto* first = reinterpret_cast<const char*>(slot.data());
        auto [ptr, ec] = std::from_chars(first, first + slot.size(), value);
        if (ec != std::errc() || ptr != first + slot.size())
          throw StoreError(::ddp::detail::str(
              "ddp: store add('", key,
              "') found a value that is not an integer: ", ::ddp::detail::quoted(to_string(slot))));
      }
      value += delta;
      slot = to_bytes(std::to_string(value));
    }
    cv_.notify_all();
    return value;
  }

  Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override {
    Bytes result;
    {
      std::lock_guard lock(mu_);
      auto it = map_.find(std::string(key));
      if (it == map_.end()) {
        if (!expected.empty()) return Bytes(expected.begin(), expected.end());
        it = map_.emplace(std::string(key), Bytes(desired.begin(), desired.end())).first;
      } else if (std::ranges::equal(it->second, expected)) {
        it->second.assign(desired.begin(), desired.end());
      }
      result = it->second;
    }
    cv_.notify_all();
    return result;
  }

  bool check(std::span<const std::string> keys) override {
    std::lock_guard lock(mu_);
    return all_present(keys);
  }
  using Store::check;

  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    wait_locked(lock, keys, timeout);
  }
  using Store::wait;

  bool delete_key(std::string_view key) override {
    std::lock_guard lock(mu_);
    return map_.erase(std::string(key)) > 0;
  }

  std::int64_t num_keys() override {
    std::lock_guard lock(mu_);
    return static_cast<std::int64_t>(map_.size());
  }

  void append(std::string_view key, std::span<const std::uint8_t> value) override {
    {
      std::lock_guard lock(mu_);
      auto& slot = map_[std::string(key)];
      slot.insert(slot.end(), value.begin(), value.end());
    }
    cv_.notify_all();
  }

 private:
  bool all_present(std::span<const std::string> keys) const {
    return std::ranges::all_of(keys, [&](const std::string& k) { return map_.contains(k); });
  }
  void wait_locked(std::unique_lock<std::mutex>& lock, std::span<const std::string> keys,
                   std::chrono::milliseconds timeout) {
    timeout = capped_timeout(timeout);
    if (!cv_.wait_for(lock, timeout, [&] { return all_present(keys); }))
      throw TimeoutError(::ddp::detail::str("ddp: store wait for [",
                                            ::ddp::detail::join(keys, ", "), "] timed out after ",
                                            timeout.count(), " ms on the in-process HashStore"));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes, std::less<>> map_;
};

}  // namespace ddp::store
