// Storage<D>: one allocator-owned, move-only byte buffer on device D (64-byte aligned on the CPU).
// SPDX-License-Identifier: MIT
//
// Allocator<D> is the only place that allocates device memory. Allocator<Cpu> is defined here;
// Allocator<Cuda> is provided by the CUDA layer (cudaMalloc/cudaFree), so Storage<Cuda> is usable only
// in programs that include it. Sizes are bytes (std::size_t); a zero-byte storage owns no memory.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp {

template <Device D>
struct Allocator;  // static void* allocate(std::size_t bytes); static void deallocate(void*) noexcept;

template <>
struct Allocator<Cpu> {
  // 64 bytes: one cache line and the widest SIMD register (AVX-512), so rows never straddle one needlessly.
  static constexpr std::size_t kAlignment = 64;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;  // aligned_alloc wants a multiple
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (!p)
      throw ValueError(detail::str("ddp: out of host memory allocating ", bytes, " bytes (",
                                   static_cast<double>(bytes) / (1 << 20), " MiB); reduce --batch-size"));
    return p;
  }
  static void deallocate(void* p) noexcept { std::free(p); }
};

template <Device D>
class Storage {
 public:
  Storage() = default;
  explicit Storage(std::size_t bytes) : data_(Allocator<D>::allocate(bytes)), bytes_(bytes) {}
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  Storage(Storage&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Storage& operator=(Storage&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~Storage() { release(); }

  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (data_) Allocator<D>::deallocate(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace ddp
