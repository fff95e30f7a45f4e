// PinnedBuffer<T>: page-locked host memory, so host <-> device copies run asynchronously at full
// speed.
// SPDX-License-Identifier: MIT
//
// A cudaMemcpyAsync from pageable memory is staged through a driver buffer and returns only after
// the source was read; from pinned memory it is a DMA that overlaps with compute. The training
// batches go through a ring of them (Prefetcher<Cuda, T...>, tensor/cuda/prefetcher.hpp: the next
// batch's upload on a copy stream while the current step computes). A buffer must outlive the
// copies that read or write it: record an Event after them and wait on it before refilling or
// freeing the buffer. Move-only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>

#include "ddp/core/check.hpp"
#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp {

template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t count) : count_(count) {
    if (count) DDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  ~PinnedBuffer() { release(); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }
  std::span<T> span() const noexcept { return {data_, count_}; }
  // A CPU view of the first shape.numel() elements (throws if the buffer is smaller).
  TensorView<T, Cpu> view(const Shape& shape) const {
    DDP_CHECK_AS(ValueError,
                 shape.numel() >= 0 && static_cast<std::size_t>(shape.numel()) <= count_,
                 "a view of ", shape, " needs ", shape.numel(),
                 " elements but the pinned buffer holds ", count_);
    return TensorView<T, Cpu>(data_, shape);
  }

 private:
  void release() noexcept {
    if (data_) DDP_CUDA_CHECK_NOTHROW(cudaFreeHost(data_));
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace ddp
