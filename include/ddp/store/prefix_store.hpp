// PrefixStore: a view of another Store whose keys all live under "prefix/" (one namespace per
// process group).
// SPDX-License-Identifier: MIT
//
//   ddp::store::PrefixStore pg("pg0", base);
//   pg.set("rank/1", "x");         // base sees key "pg0/rank/1", as PyTorch's PrefixStore writes
//     it
//
//   PrefixStore attempt("/worker/attempt_1", std::move(tcp));   // owns its base: make_store
//     returns one
//
// Contract: same as the base store (thread-safe when the base is); a borrowed base must outlive the
// view. num_keys() counts the base's keys, as PyTorch does: a store cannot list keys by prefix.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddp/store/store.hpp"

namespace ddp::store {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& base)
      : Store(base.timeout()), prefix_(std::move(prefix)), base_(base) {}
  // Owns its base: the view and the store it wraps live and die together.
  PrefixStore(std::string prefix, std::unique_ptr<Store> base)
      : Store(base->timeout()),
        prefix_(std::move(prefix)),
        owned_(std::move(base)),
        base_(*owned_) {}

  const std::string& prefix() const noexcept { return prefix_; }
  Store& base() noexcept { return base_; }

  void set(std::string_view key, std::span<const std::uint8_t> value) override {
    base_.set(full(key), value);
  }
  using Store::set;
  Bytes get(std::string_view key) override {
    // The view's timeout wins: callers may set_timeout() on the view without touching the base.
    std::string k = full(key);
    base_.wait(std::span<const std::string>(&k, 1), timeout_);
    return base_.get(k);
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override {
    return base_.add(full(key), delta);
  }
  Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override {
    return base_.compare_set(full(key), expected, desired);
  }
  bool check(std::span<const std::string> keys) override { return base_.check(full(keys)); }
  using Store::check;
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    base_.wait(full(keys), timeout);
  }
  using Store::wait;
  bool delete_key(std::string_view key) override { return base_.delete_key(full(key)); }
  std::int64_t num_keys() override { return base_.num_keys(); }
  void append(std::string_view key, std::span<const std::uint8_t> value) override {
    base_.append(full(key), value);
  }
  std::vector<Bytes> multi_get(std::span<const std::string> keys) override {
    auto k = full(keys);
    base_.wait(k, timeout_);
    return base_.multi_get(k);
  }
  void multi_set(std::span<const std::string> keys, std::span<const Bytes> values) override {
    base_.multi_set(full(keys), values);
  }

 private:
  std::string full(std::string_view key) const { return detail::str(prefix_, '/', key); }
  std::vector<std::string> full(std::span<const std::string> keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(full(k));
    return out;
  }

  std::string prefix_;
  std::unique_ptr<Store> owned_;  // null when the base is borrowed
  Store& base_;
};

}  // namespace ddp::store
