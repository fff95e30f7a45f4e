// Prefetcher<Cuda, T...>: batches uploaded from pinned slots on a copy stream, one step ahead
// (tensor/prefetch.hpp).
// SPDX-License-Identifier: MIT
//
//   ddp::Prefetcher<ddp::Cuda, float, std::int64_t> uploads(exec);  // exec: the compute stream's
//     Exec<Cuda>
//   uploads.push(images.cview(), labels.cview());  // memcpy into a PinnedBuffer, cudaMemcpyAsync
//     on the copy stream
//   auto [x, y] = uploads.pop();                    // exec's stream waits (on the device) for that
//     upload
// CudaUploadBackend is PrefetchRing's backend: a copy stream of its own, created blocking like
// ddp::Stream (so it also orders after work on the legacy default stream), the compute stream of
// the Exec given, PinnedBuffer staging and device buffers from the caching allocator
// (tensor/cuda/allocator.hpp). Every CUDA call is checked (DDP_CUDA_CHECK: a CudaError naming the
// call). Construct it with the batches' device current (cudaSetDevice). Design:
// docs/decisions/0050.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "ddp/core/cuda_check.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/pinned.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/prefetch.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

class CudaUploadBackend {
 public:
  using device = Cuda;
  using Event = ddp::Event;
  template <class T>
  using HostBuffer = PinnedBuffer<T>;
  template <class T>
  using DeviceBuffer = Tensor<T, Cuda>;

  explicit CudaUploadBackend(const Exec<Cuda>& compute) : compute_(compute) {}

  void upload(void* dst, const void* src, std::size_t bytes) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_.get()));
  }
  void record_upload(Event& e) { e.record(copy_.exec()); }
  void copy_wait(const Event& e) { e.wait(copy_.exec()); }
  void record_compute(Event& e) { e.record(compute_); }
  void compute_wait(const Event& e) { e.wait(compute_); }
  void host_wait(const Event& e) { e.synchronize(); }
  void finish() noexcept { DDP_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(copy_.get())); }

 private:
  Stream copy_;
  Exec<Cuda> compute_;
};

template <class... T>
class Prefetcher<Cuda, T...> : public PrefetchRing<CudaUploadBackend, T...> {
 public:
  // Batches used on `compute`'s stream; slots >= 2 (ValueError otherwise): lookahead() = slots - 1
  // batches upload while one is in use.
  explicit Prefetcher(const Exec<Cuda>& compute, std::size_t slots = 2)
      : PrefetchRing<CudaUploadBackend, T...>(CudaUploadBackend(compute), slots) {}
};

}  // namespace ddp
