// Allocator<Cuda>: stream-ordered caching allocation of device memory (cudaMallocAsync on a memory pool).
// SPDX-License-Identifier: MIT
//
// How it works. Every Storage<Cuda> is carved from the current device's default memory pool with
// cudaMallocAsync and returned with cudaFreeAsync, both on the legacy default stream. The pool keeps
// freed blocks (release threshold raised to "never shrink"), so after the first training step
// allocation is a free-list lookup inside the driver, not a cudaMalloc with its device-wide sync.
// Ordering: the legacy default stream waits for all earlier work of every blocking stream and vice
// versa, so a block freed here is reused only after the kernels that used it on any blocking stream
// (Stream in stream.hpp creates blocking streams) have finished. A stream created elsewhere with
// cudaStreamNonBlocking must synchronise before the tensors it uses are destroyed.
// Example: a 16x56x56x64 float activation (12.25 MiB) freed at the end of step 1 is handed back to the
// same-sized request of step 2 without touching the driver's cudaMalloc path.
// memory_stats() reads the pool's own counters: bytes in use now and the high-water mark (resettable).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/storage.hpp"

namespace ddp {

// Bytes of device memory held by tensors on one device.
struct CudaMemoryStats {
  std::size_t current_bytes = 0;   // in use by live allocations now
  std::size_t peak_bytes = 0;      // high-water mark of current_bytes since start or reset_peak_memory()
  std::size_t reserved_bytes = 0;  // held by the pool (in use + cached for reuse)
};

namespace detail {

inline constexpr int kMaxCudaDevices = 64;

// The current device's default pool, configured on first use to keep freed memory cached. The pool
// handle per device is cached (one relaxed atomic load per allocation after the first).
inline cudaMemPool_t cuda_pool() {
  static std::atomic<cudaMemPool_t> pools[kMaxCudaDevices] = {};
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxCudaDevices)
    throw CudaError(str("ddp: CUDA device ", device, " is beyond the ", kMaxCudaDevices, " devices ddp supports"));
  if (cudaMemPool_t p = pools[device].load(std::memory_order_acquire)) return p;
  cudaMemPool_t pool = nullptr;
  DDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t keep = UINT64_MAX;  // never trim the cache at synchronisation points (idempotent if raced)
  DDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  pools[device].store(pool, std::memory_order_release);
  return pool;
}

inline std::size_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  std::uint64_t v = 0;
  DDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, attr, &v));
  return static_cast<std::size_t>(v);
}

}  // namespace detail

template <>
struct Allocator<Cuda> {
  // Throws CudaError (out of memory names the size and the current usage).
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    cudaMemPool_t pool = detail::cuda_pool();
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool, cudaStreamLegacy);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls do not report it again
      throw CudaError(detail::str("ddp: out of GPU memory allocating ", bytes, " bytes (",
                                  (bytes + (std::size_t{1} << 19)) >> 20, " MiB) with ",
                                  detail::pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent) >> 20,
                                  " MiB in use; reduce --batch-size or use --precision bf16"));
    }
    DDP_CUDA_CHECK(e);
    return p;
  }
  // Never throws (called from destructors): a failure is logged.
  static void deallocate(void* p) noexcept {
    if (p) DDP_CUDA_CHECK_NOTHROW(cudaFreeAsync(p, cudaStreamLegacy));
  }
};

// Current / peak / reserved bytes of the current device's pool.
inline CudaMemoryStats cuda_memory_stats() {
  cudaMemPool_t pool = detail::cuda_pool();
  return {.current_bytes = detail::pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent),
          .peak_bytes = detail::pool_attribute(pool, cudaMemPoolAttrUsedMemHigh),
          .reserved_bytes = detail::pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent)};
}

// Starts a new peak measurement (peak_bytes becomes current_bytes).
inline void reset_peak_cuda_memory() {
  cudaMemPool_t pool = detail::cuda_pool();
  std::uint64_t zero = 0;  // the driver only accepts 0 here: the high-water mark restarts from current use
  DDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
}

// Returns cached, unused blocks to the driver (e.g. before measuring another model's peak).
inline void release_cached_cuda_memory() {
  DDP_CUDA_CHECK(cudaDeviceSynchronize());
  DDP_CUDA_CHECK(cudaMemPoolTrimTo(detail::cuda_pool(), 0));
}

}  // namespace ddp
