// shm::Segment: one POSIX shared-memory segment mapped by every rank of a communicator on one host,
// set up through the ranks' own all-gather (the store for tcp, MPI_Allgatherv for mpi) and unlinked
// as soon as every rank has mapped it, so nothing is left in /dev/shm even when a process is killed
// later.
// SPDX-License-Identifier: MIT
//
// How setup works (collective over the communicator's ranks, three all-gathers named "host",
// "name", "ok"):
//   1. every rank contributes its host identity (hostname + kernel boot id); unless all are equal,
//      every rank returns an empty segment (the caller keeps its other transport);
//   2. rank 0 creates "/ddp-<pid>-<random>" (O_EXCL, mode 0600), sizes and maps it, writes a header
//      {magic, random nonce, size}, and contributes "name nonce" (the others contribute nothing);
//   3. the others open and map it and check magic and nonce (a different /dev/shm, e.g. another
//      container with the same hostname, fails here); every rank contributes ok = 1 or 0;
//   4. once every ok is in, rank 0 unlinks the name. The segment lives on only as long as some
//      process maps it. Only a kill -9 of rank 0 within this setup (milliseconds) can leave a
//      /dev/shm/ddp-* entry behind; its name carries the pid that created it.
// Any failure makes every rank agree on "no shared memory" (with a warning naming the reason),
// never an error: the backend's other transport still works.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/clock.hpp"
#include "ddp/core/fd.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/net.hpp"
#include "ddp/core/str.hpp"
#include "ddp/store/store.hpp"

namespace ddp::comm::shm {

inline constexpr std::uint64_t kMagic = 0xDD9C'5348'4D00'0001ull;

// The first bytes of every segment, written by rank 0 before it publishes the name.
struct SegmentHeader {
  std::uint64_t magic;
  std::uint64_t nonce;
  std::uint64_t bytes;  // total mapped size
  std::uint64_t ranks;
};

// One collective exchange of a string per rank: every rank passes its own, all get everyone's in
// rank order. `step` names the exchange ("host", "name", "ok"), for backends that key it (the
// store).
using AllGather =
    std::function<std::vector<std::string>(const std::string& step, const std::string& mine)>;

// AllGather through the store: keys <prefix>shm/<step>/<rank>, each wait bounded by `deadline`.
inline AllGather store_all_gather(store::Store& store, std::string prefix, int rank, int size,
                                  Clock::time_point deadline) {
  return [&store, prefix = std::move(prefix), rank, size, deadline](const std::string& step,
                                                                    const std::string& mine) {
    const std::string p = ddp::detail::str(prefix, "shm/", step, '/');
    store.set(ddp::detail::str(p, rank), mine);
    std::vector<std::string> keys;
    for (int k = 0; k < size; ++k) keys.push_back(ddp::detail::str(p, k));
    store.wait(keys, net::time_left(deadline));
    std::vector<std::string> out;
    for (const auto& v : store.multi_get(keys)) out.push_back(store::to_string(v));
    return out;
  };
}

class Segment {
 public:
  Segment() = default;
  Segment(Segment&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)),
        name_(std::move(o.name_)),
        owner_(std::exchange(o.owner_, false)) {}
  Segment& operator=(Segment&& o) noexcept {
    if (this != &o) {
      release();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      name_ = std::move(o.name_);
      owner_ = std::exchange(o.owner_, false);
    }
    return *this;
  }
  ~Segment() { release(); }

  explicit operator bool() const noexcept { return base_ != nullptr; }
  std::byte* data() const noexcept { return static_cast<std::byte*>(base_); }
  std::size_t bytes() const noexcept { return bytes_; }

  // Setup (see the file comment). Returns an empty segment on every rank unless all ranks mapped
  // it. `enabled` false (CommOptions::shm off) contributes a host identity no other rank has, so
  // all fall back; `fallback` names the transport used instead, for the warning.
  static Segment create(const AllGather& all_gather, int rank, int size, bool enabled,
                        std::size_t bytes, std::string_view fallback) {
    const auto hosts =
        all_gather("host", enabled ? host_identity() : ddp::detail::str("shm off on rank ", rank));
    for (const auto& h : hosts)
      // not all on one host: every rank sees the same and agrees
      if (h != hosts.front()) return {};

    Segment seg;
    std::string why, published;
    if (rank == 0) {
      std::mt19937_64 gen(std::random_device{}());
      const std::uint64_t nonce = gen();
      const std::string name = ddp::detail::str("/ddp-", ::getpid(), '-', std::hex, nonce);
      why = seg.create_named(name, bytes, nonce, size);
      if (seg) published = ddp::detail::str(name, ' ', nonce);
    }
    std::vector<std::string> oks;
    try {
      const std::string v = all_gather("name", published).front();
      if (rank != 0) {
        if (!v.empty()) {
          const auto sp = v.find(' ');
          why = seg.open_named(v.substr(0, sp), bytes, std::stoull(v.substr(sp + 1)), size);
        } else {
          why = "rank 0 could not create the segment";
        }
      }
      oks = all_gather("ok", seg ? "1" : "0");
    } catch (...) {
      seg.release();  // unlinks on rank 0
      throw;
    }
    seg.unlink();  // rank 0: every rank has mapped it (or given up)
    const auto bad =
        std::find_if(oks.begin(), oks.end(), [](const std::string& o) { return o != "1"; });
    if (bad != oks.end()) {
      if (!why.empty())
        DDP_LOG_WARN("no shared memory between local ranks (", why, "); using ", fallback);
      else
        DDP_LOG_DEBUG("rank ", bad - oks.begin(), " could not map the shared memory; using ",
                      fallback);
      return {};
    }
    return seg;
  }

  // "hostname/boot-id": equal exactly for processes on one running kernel.
  static std::string host_identity() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string boot;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    return ddp::detail::str(host, '/', boot);
  }

 private:
  std::string create_named(const std::string& name, std::size_t bytes, std::uint64_t nonce,
                           int ranks) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return ddp::detail::str("shm_open(", name, ") failed: ", net::errno_text(errno));
    name_ = name;
    owner_ = true;
    Fd guard(fd);
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int e = errno;
      release();
      return ddp::detail::str("sizing ", name, " to ", bytes, " bytes failed: ", net::errno_text(e),
                              "; /dev/shm may be too small (docker: --shm-size)");
    }
    if (std::string why = map(fd, bytes); !why.empty()) return why;
    auto* h = reinterpret_cast<SegmentHeader*>(base_);
    *h = {.magic = kMagic,
          .nonce = nonce,
          .bytes = bytes,
          .ranks = static_cast<std::uint64_t>(ranks)};
    return {};
  }

  std::string open_named(const std::string& name, std::size_t bytes, std::uint64_t nonce,
                         int ranks) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
      return ddp::detail::str("shm_open(", name, ") failed: ", net::errno_text(errno),
                              " (a separate /dev/shm, e.g. another container?)");
    Fd guard(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes)
      return ddp::detail::str(name, " has ", st.st_size, " bytes, expected ", bytes);
    if (std::string why = map(fd, bytes); !why.empty()) return why;
    const auto* h = reinterpret_cast<const SegmentHeader*>(base_);
    if (h->magic != kMagic || h->nonce != nonce || h->bytes != bytes ||
        h->ranks != static_cast<std::uint64_t>(ranks)) {
      release();
      return ddp::detail::str(name, " is not the segment rank 0 created (header mismatch)");
    }
    return {};
  }

  std::string map(int fd, std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      release();
      return ddp::detail::str("mmap of ", bytes, " bytes failed: ", net::errno_text(e));
    }
    base_ = p;
    bytes_ = bytes;
    return {};
  }

  void unlink() noexcept {
    if (owner_) ::shm_unlink(name_.c_str());
    owner_ = false;
  }

  void release() noexcept {
    unlink();
    if (base_) ::munmap(base_, bytes_);
    base_ = nullptr;
    bytes_ = 0;
  }

  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;  // rank 0 until it unlinked the name
};

}  // namespace ddp::comm::shm
