// Allocator<Cuda>: device memory from a stream-aware caching pool (tensor/caching_pool.hpp over
// cudaMalloc).
// SPDX-License-Identifier: MIT
//
// One CachingPool per device. A Storage<Cuda> takes its block from the cache of this thread's
// allocation stream (cuda_alloc_stream(): the legacy default stream unless a CudaAllocStream guard
// names another) and returns it there when destroyed, without synchronising: the next request on
// that stream runs after every earlier use of the block. After the first step every request is a
// cache hit (no cudaMalloc, no host wait). Memory also used on another stream must be declared with
// cuda_record_stream before it is freed (the nccl backend does so for every buffer it hands NCCL);
// its reuse then waits on the device for an event recorded there (torch's Tensor.record_stream).
// Why not cudaMallocAsync: docs/decisions/0022.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/caching_pool.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/storage.hpp"

namespace ddp {

// Bytes of device memory held by tensors on one device (the same counters as cpu_memory_stats).
using CudaMemoryStats = MemoryStats;

namespace detail {

inline constexpr int kMaxCudaDevices = 64;

// CachingPool's backend on the current device: cudaMalloc / cudaFree and timing-free events.
struct CudaPoolBackend {
  using Stream = cudaStream_t;
  using Event = cudaEvent_t;
  void* malloc(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it so that later calls do not report it again
      return nullptr;
    }
    DDP_CUDA_CHECK(e);
    return p;
  }
  void free(void* p) noexcept { DDP_CUDA_CHECK_NOTHROW(cudaFree(p)); }
  Event create_event() {
    cudaEvent_t e = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void destroy_event(Event e) noexcept { DDP_CUDA_CHECK_NOTHROW(cudaEventDestroy(e)); }
  void record(Event e, Stream s) { DDP_CUDA_CHECK(cudaEventRecord(e, s)); }
  bool query(Event e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    DDP_CUDA_CHECK(r);
    return true;
  }
  void synchronize(Event e) { DDP_CUDA_CHECK(cudaEventSynchronize(e)); }
};

using CudaPool = CachingPool<CudaPoolBackend>;

// The current device's pool. Created on first use and never destroyed: tensors in static storage
// may be freed after main returns, when a destroyed pool (or a torn-down CUDA context) cannot take
// them back.
inline CudaPool& cuda_pool() {
  static std::array<std::atomic<CudaPool*>, kMaxCudaDevices> pools{};
  static std::mutex create;
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxCudaDevices)
    throw CudaError(str("ddp: CUDA device ", device, " is beyond the ", kMaxCudaDevices,
                        " devices ddp supports"));
  if (CudaPool* p = pools[static_cast<std::size_t>(device)].load(std::memory_order_acquire))
    return *p;
  std::lock_guard lk(create);
  CudaPool* p = pools[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
  if (!p) {
    p = new CudaPool();  // intentionally leaked (see above)
    pools[static_cast<std::size_t>(device)].store(p, std::memory_order_release);
  }
  return *p;
}

// nullptr (Exec<Cuda>'s default) is the legacy default stream; one key for both spellings.
inline cudaStream_t normalised(void* stream) noexcept {
  return stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
}

inline cudaStream_t& thread_alloc_stream() noexcept {
  thread_local cudaStream_t s = cudaStreamLegacy;
  return s;
}

}  // namespace detail

// The stream whose cache this thread's new device tensors come from.
inline cudaStream_t cuda_alloc_stream() noexcept { return detail::thread_alloc_stream(); }

// Makes `e`'s stream this thread's allocation stream until destroyed. Use it around code on a
// non-blocking stream of its own, so blocks freed there are reused in that stream's order.
class CudaAllocStream {
 public:
  explicit CudaAllocStream(const Exec<Cuda>& e) noexcept
      : previous_(std::exchange(detail::thread_alloc_stream(), detail::normalised(e.stream))) {}
  CudaAllocStream(const CudaAllocStream&) = delete;
  CudaAllocStream& operator=(const CudaAllocStream&) = delete;
  ~CudaAllocStream() { detail::thread_alloc_stream() = previous_; }

 private:
  cudaStream_t previous_;
};

// Declares that the device memory at `p` (any address inside a tensor's block) is used on `stream`
// too: when the tensor is freed, its block is reused only after `stream` has passed that point.
// Memory that did not come from Allocator<Cuda> is ignored.
inline void cuda_record_stream(const void* p, void* stream) {
  if (p) detail::cuda_pool().record_stream(p, detail::normalised(stream));
}

// Call just before cudaStreamDestroy of a stream cuda_record_stream named: the blocks it used wait
// for its current work instead of for a record at their free (CachingPool::retire_stream).
inline void cuda_retire_stream(void* stream) {
  detail::cuda_pool().retire_stream(detail::normalised(stream));
}

template <>
struct Allocator<Cuda> {
  // Throws CudaError (out of memory names the size and the current usage).
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    detail::CudaPool& pool = detail::cuda_pool();
    void* p = pool.allocate(bytes, cuda_alloc_stream());
    if (!p)
      throw CudaError(detail::str("ddp: out of GPU memory allocating ", bytes, " bytes (",
                                  (bytes + (std::size_t{1} << 19)) >> 20, " MiB) with ",
                                  pool.stats().current_bytes >> 20,
                                  " MiB in use; reduce --batch-size or use --precision bf16"));
    return p;
  }
  // Never throws (called from destructors): a failure is logged.
  static void deallocate(void* p) noexcept {
    if (!p) return;
    try {
      detail::cuda_pool().deallocate(p);
    } catch (...) {  // cudaGetDevice failed (driver shutting down): nothing left to return it to
    }
  }
  // The current device's pool block holding p; nullopt if that pool did not hand it out.
  static std::optional<BlockStamp> stamp(const void* p) { return detail::cuda_pool().stamp(p); }
};

// Current / peak / reserved bytes and cudaMalloc count of the current device's pool.
inline CudaMemoryStats cuda_memory_stats() { return MemoryStats::of(detail::cuda_pool().stats()); }

// Starts a new peak measurement (peak_bytes becomes current_bytes).
inline void reset_peak_cuda_memory() { detail::cuda_pool().reset_peak(); }

// Returns cached, unused blocks to the driver (e.g. before measuring another model's peak).
inline void release_cached_cuda_memory() {
  DDP_CUDA_CHECK(cudaDeviceSynchronize());
  detail::cuda_pool().release_cached();
}

}  // namespace ddp
