// Storage<D>: one allocator-owned, move-only byte buffer on device D (64-byte aligned on the CPU).
// SPDX-License-Identifier: MIT
//
// Allocator<D> is the only place that allocates device memory. Allocator<Cpu> is defined here;
// Allocator<Cuda> in tensor/cuda/allocator.hpp, so Storage<Cuda> is usable only in programs that
// include it. Sizes are bytes; a zero-byte storage owns no memory.
//
// Host memory comes from a CachingPool (the GPU's pool) over host_alloc (64-byte aligned, huge-page
// advised from 4 MiB), so the ~1,000 temporaries a step frees and re-allocates are not page-faulted
// in again every step (docs/decisions/0022): steady-state steps allocate nothing and touch only
// mapped pages. Host code runs in program order, so the pool has one stream and a freed block is
// reusable at once. DDP_CPU_CACHING=0 (config.hpp; the default under AddressSanitizer) calls
// host_alloc/host_free per tensor instead.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <optional>
#include <utility>

#include "ddp/config.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/host_memory.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/caching_pool.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp {

template <Device D>
// static void* allocate(std::size_t bytes); static void deallocate(void*) noexcept;
struct Allocator;

namespace detail {

// CachingPool's backend for host memory: one stream (0) and events that are complete when recorded.
struct HostPoolBackend {
  using Stream = int;
  using Event = int;
  void* malloc(std::size_t bytes) noexcept { return host_alloc(bytes); }
  void free(void* p) noexcept { host_free(p); }
  Event create_event() noexcept { return 0; }
  void destroy_event(Event) noexcept {}
  void record(Event, Stream) noexcept {}
  bool query(Event) noexcept { return true; }
  void synchronize(Event) noexcept {}
};

using HostPool = CachingPool<HostPoolBackend>;

// Created on first use and never destroyed: tensors with static storage duration may be freed after
// main returns, later than any pool object with static storage duration would live.
inline HostPool& host_pool() {
  static HostPool* const pool = new HostPool();
  return *pool;
}

}  // namespace detail

template <>
struct Allocator<Cpu> {
  static constexpr std::size_t kAlignment = kHostAlignment;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    if constexpr (BuildConfig::cpu_caching) {
      // on failure it returned its cache to malloc and retried
      p = detail::host_pool().allocate(bytes, 0);
    } else {
      p = host_alloc(bytes);
    }
    if (!p)
      throw ValueError(detail::str("ddp: out of host memory allocating ", bytes, " bytes (",
                                   static_cast<double>(bytes) / (1 << 20),
                                   " MiB); reduce --batch-size"));
    return p;
  }
  static void deallocate(void* p) noexcept {
    if constexpr (BuildConfig::cpu_caching)
      detail::host_pool().deallocate(p);
    else
      host_free(p);
  }
  // The pool block holding address p (CachingPool::stamp); nullopt with DDP_CPU_CACHING=0.
  static std::optional<BlockStamp> stamp(const void* p) {
    if constexpr (BuildConfig::cpu_caching) return detail::host_pool().stamp(p);
    return std::nullopt;
  }
};

// Host tensor memory: in use, peak, reserved and malloc calls (all zero with DDP_CPU_CACHING=0).
inline MemoryStats cpu_memory_stats() {
  return BuildConfig::cpu_caching ? MemoryStats::of(detail::host_pool().stats()) : MemoryStats{};
}
// Starts a new peak measurement (peak_bytes becomes current_bytes).
inline void reset_peak_cpu_memory() {
  if constexpr (BuildConfig::cpu_caching) detail::host_pool().reset_peak();
}
// Returns cached, unused host blocks to malloc; returns the bytes given back.
inline std::size_t release_cached_cpu_memory() {
  return BuildConfig::cpu_caching ? detail::host_pool().release_cached() : 0;
}

template <Device D>
class Storage {
 public:
  Storage() = default;
  explicit Storage(std::size_t bytes) : data_(Allocator<D>::allocate(bytes)), bytes_(bytes) {}
  // Memory someone else owns and frees (`bytes` at `data`, in D's memory); it must outlive this
  // Storage (e.g. DDP's gradient_as_bucket_view: gradients as views into its buckets).
  static Storage borrowed(void* data, std::size_t bytes) noexcept {
    Storage s;
    s.data_ = data;
    s.bytes_ = bytes;
    s.owns_ = false;
    return s;
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  Storage(Storage&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)),
        owns_(std::exchange(o.owns_, true)) {}
  Storage& operator=(Storage&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      owns_ = std::exchange(o.owns_, true);
    }
    return *this;
  }
  ~Storage() { release(); }

  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  bool owns() const noexcept { return owns_; }

 private:
  void release() noexcept {
    if (data_ && owns_) Allocator<D>::deallocate(data_);
    data_ = nullptr;
    bytes_ = 0;
    owns_ = true;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool owns_ = true;  // false: borrowed(), never deallocated here
};

}  // namespace ddp
