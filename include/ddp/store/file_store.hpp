// FileStore: a Store shared by the processes of one machine through a file (like PyTorch's
// FileStore, own format).
// SPDX-License-Identifier: MIT
//
//   ddp::store::FileStore store("/tmp/job42.store");   // every process opens the same path
//
// How it works: the file is an append-only log of records
//     [u8 kind: 0 set, 1 delete][u64 key length][key][u64 value length][value]   (little-endian)
// Every operation takes flock(LOCK_EX) on the file (plus a mutex, because flock does not exclude
// threads sharing one open file), reads the records it has not seen yet into its map, and for a
// mutation appends one record while still holding the lock, so read-modify-write operations (add,
// compare_set, append) are atomic across processes. get/wait poll (1 ms doubling to 50 ms) until
// the keys exist or the timeout passes. Worked example: process A add("n",1) appends (0,"n","1");
// process B add("n",2) reads that record first, so it appends (0,"n","3"). The file is never
// compacted; it is meant for rendezvous-sized traffic. Remove it between jobs.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/core/clock.hpp"
#include "ddp/core/net.hpp"
#include "ddp/store/store.hpp"

namespace ddp::store {

class FileStore final : public Store {
 public:
  explicit FileStore(std::string path, std::chrono::milliseconds timeout = kDefaultStoreTimeout)
      : Store(timeout), path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw StoreError(detail::str("ddp: cannot open FileStore ", detail::quoted(path_), ": ",
                                   net::errno_text(errno),
                                   ". The directory must exist and be writable."));
  }
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;
  ~FileStore() override {
    if (fd_ >= 0) ::close(fd_);
  }
  const std::string& path() const noexcept { return path_; }

  void set(std::string_view key, std::span<const std::uint8_t> value) override {
    Locked l(*this);
    write_record(0, key, value);
  }
  using Store::set;

  Bytes get(std::string_view key) override {
    std::string k(key);
    wait(std::span<const std::string>(&k, 1), timeout_);
    Locked l(*this);
    auto it = map_.find(k);
    return it == map_.end() ? Bytes{} : it->second;  // deleted between wait and here: empty
  }

  std::int64_t add(std::string_view key, std::int64_t delta) override {
    Locked l(*this);
    std::int64_t v = 0;
    if (auto it = map_.find(key); it != map_.end()) {
      const char* b = reinterpret_cast<const char*>(it->second.data());
      auto [p, ec] = std::from_chars(b, b + it->second.size(), v);
      if (ec != std::errc() || p != b + it->second.size())
        throw StoreError(detail::str(
            "ddp: FileStore add(", detail::quoted(key),
            ") found a value that is not an integer: ", detail::quoted(to_string(it->second))));
    }
    v += delta;
    write_record(0, key, to_bytes(std::to_string(v)));
    return v;
  }

  Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override {
    Locked l(*this);
    auto it = map_.find(key);
    if (it == map_.end()) {
      if (!expected.empty()) return Bytes(expected.begin(), expected.end());
    } else if (!std::ranges::equal(it->second, expected)) {
      return it->second;
    }
    write_record(0, key, desired);
    return Bytes(desired.begin(), desired.end());
  }

  bool check(std::span<const std::string> keys) override {
    Locked l(*this);
    return all_present(keys);
  }
  using Store::check;

  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    timeout = capped_timeout(timeout);
    auto deadline = Clock::now() + timeout;
    std::chrono::milliseconds nap{1};
    for (;;) {
      {
        Locked l(*this);
        if (all_present(keys)) return;
      }
      auto now = Clock::now();
      if (now >= deadline)
        throw TimeoutError(detail::str(
            "ddp: store wait([", detail::join(quoted_keys(keys), ", "), "]) timed out after ",
            timeout.count(), " ms on FileStore ", detail::quoted(path_),
            ". The process that sets these keys may not have started; raise "
            "--timeout-ms (DDP_TIMEOUT_MS) if startup is slow."));
      std::this_thread::sleep_for(std::min<Clock::duration>(nap, deadline - now));
      nap = std::min(nap * 2, std::chrono::milliseconds{50});
    }
  }
  using Store::wait;

  bool delete_key(std::string_view key) override {
    Locked l(*this);
    if (!map_.contains(key)) return false;
    write_record(1, key, {});
    return true;
  }

  std::int64_t num_keys() override {
    Locked l(*this);
    return static_cast<std::int64_t>(map_.size());
  }

  void append(std::string_view key, std::span<const std::uint8_t> value) override {
    Locked l(*this);
    Bytes v;
    if (auto it = map_.find(key); it != map_.end()) v = it->second;
    v.insert(v.end(), value.begin(), value.end());
    write_record(0, key, v);
  }

 private:
  // Holds the thread mutex and the file lock, and brings map_ up to date with the file.
  struct Locked {
    explicit Locked(FileStore& s) : s_(s), lock_(s.mu_) {
      while (::flock(s_.fd_, LOCK_EX) != 0)
        if (errno != EINTR)
          throw StoreError(detail::str("ddp: flock on FileStore ", detail::quoted(s_.path_),
                                       " failed: ", net::errno_text(errno)));
      try {
        s_.refresh();
      } catch (...) {
        ::flock(s_.fd_, LOCK_UN);
        throw;
      }
    }
    ~Locked() { ::flock(s_.fd_, LOCK_UN); }
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;
    FileStore& s_;
    std::lock_guard<std::mutex> lock_;
  };

  static std::vector<std::string> quoted_keys(std::span<const std::string> keys) {
    std::vector<std::string> q;
    for (const auto& k : keys) q.push_back(detail::quoted(k));
    return q;
  }
  bool all_present(std::span<const std::string> keys) const {
    return std::ranges::all_of(keys, [&](const std::string& k) { return map_.contains(k); });
  }

  // Reads every complete record after pos_. A record cut short (a writer died mid-append) stops the
  // scan.
  void refresh() {
    Bytes buf;
    std::uint8_t chunk[64 * 1024];
    for (;;) {
      ssize_t n = ::pread(fd_, chunk, sizeof(chunk), static_cast<off_t>(pos_ + buf.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw StoreError(detail::str("ddp: reading FileStore ", detail::quoted(path_),
                                     " failed: ", net::errno_text(errno)));
      if (n == 0) break;
      buf.insert(buf.end(), chunk, chunk + n);
    }
    std::size_t p = 0;
    auto u64 = [&](std::size_t at) {
      std::uint64_t x = 0;
      for (int i = 0; i < 8; ++i)
        x |= std::uint64_t{buf[at + static_cast<std::size_t>(i)]} << (8 * i);
      return x;
    };
    for (;;) {
      if (buf.size() - p < 9) break;
      std::uint64_t klen = u64(p + 1);
      if (buf.size() - p - 9 < klen + 8) break;
      std::uint64_t vlen = u64(p + 9 + klen);
      if (buf.size() - p - 17 - klen < vlen) break;
      std::string key(buf.begin() + static_cast<std::ptrdiff_t>(p + 9),
                      buf.begin() + static_cast<std::ptrdiff_t>(p + 9 + klen));
      if (buf[p] == 1) {
        map_.erase(key);
      } else {
        auto vb = buf.begin() + static_cast<std::ptrdiff_t>(p + 17 + klen);
        map_[key] = Bytes(vb, vb + static_cast<std::ptrdiff_t>(vlen));
      }
      p += 17 + klen + vlen;
    }
    pos_ += p;
  }

  void write_record(std::uint8_t kind, std::string_view key, std::span<const std::uint8_t> value) {
    Bytes rec;
    rec.reserve(17 + key.size() + value.size());
    rec.push_back(kind);
    auto put = [&](std::uint64_t x) {
      for (int i = 0; i < 8; ++i) rec.push_back(static_cast<std::uint8_t>(x >> (8 * i)));
    };
    put(key.size());
    rec.insert(rec.end(), key.begin(), key.end());
    put(value.size());
    rec.insert(rec.end(), value.begin(), value.end());
    std::size_t done = 0;
    while (done < rec.size()) {
      ssize_t n = ::write(fd_, rec.data() + done, rec.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw StoreError(detail::str("ddp: writing FileStore ", detail::quoted(path_),
                                     " failed: ", net::errno_text(errno)));
      done += static_cast<std::size_t>(n);
    }
    refresh();  // picks up our own record (and advances pos_ past it)
  }

  std::string path_;
  int fd_ = -1;
  std::mutex mu_;
  std::uint64_t pos_ = 0;  // bytes of the file already applied to map_
  std::map<std::string, Bytes, std::less<>> map_;
};

}  // namespace ddp::store
