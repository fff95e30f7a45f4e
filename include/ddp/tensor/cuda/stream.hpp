// Stream and Event: owning wrappers for CUDA streams and events, and the Exec<Cuda> helpers built
// on them.
// SPDX-License-Identifier: MIT
//
// Exec<Cuda> holds a non-owning cudaStream_t (as void*); Stream owns one and hands out execs:
//   ddp::Stream compute, comm;
//   Exec<Cuda> ex = compute.exec();
//   Event grads_ready;  grads_ready.record(ex);  grads_ready.wait(comm.exec());   // comm waits,
//     host does not
// Streams are created blocking (cudaStreamDefault): work on the legacy default stream
// (Exec<Cuda>{}, the default allocation stream of tensor/cuda/allocator.hpp) then orders after
// theirs and theirs after it, so code that mixes the two needs no events of its own. Events are
// created without timing (cheaper) unless asked. Destructors never throw; they log failures.
// Move-only.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "ddp/core/cuda_check.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp {

inline cudaStream_t cuda_stream(const Exec<Cuda>& e) noexcept {
  return static_cast<cudaStream_t>(e.stream);
}

// Blocks the host until every operation enqueued on e's stream has finished; throws if one failed.
inline void synchronize(const Exec<Cuda>& e) {
  DDP_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(e)));
}

// The number of CUDA devices (0 when there is no driver or no device; never throws).
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

class Stream {
 public:
  // priority: lower numbers run first (cudaDeviceGetStreamPriorityRange); 0 is the default.
  explicit Stream(int priority = 0) {
    DDP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamDefault, priority));
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      release();
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }
  ~Stream() { release(); }

  cudaStream_t get() const noexcept { return stream_; }
  // An exec on this stream; precision, deterministic and conv as in Exec<Cuda> (tensor/device.hpp).
  Exec<Cuda> exec(Precision precision = Precision::Tf32, bool deterministic = false,
                  ConvImpl conv = ConvImpl::Auto) const noexcept {
    return Exec<Cuda>{
        .stream = stream_, .precision = precision, .conv = conv, .deterministic = deterministic};
  }
  void synchronize() const { DDP_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  void release() noexcept {
    if (stream_) DDP_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
    stream_ = nullptr;
  }
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = false) {
    DDP_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      release();
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  ~Event() { release(); }

  cudaEvent_t get() const noexcept { return event_; }
  // Marks the point reached by the work enqueued so far on e's stream.
  void record(const Exec<Cuda>& e) { DDP_CUDA_CHECK(cudaEventRecord(event_, cuda_stream(e))); }
  // Work enqueued on e's stream after this call waits for the recorded point (the host does not
  // wait).
  void wait(const Exec<Cuda>& e) const {
    DDP_CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(e), event_, 0));
  }
  void synchronize() const { DDP_CUDA_CHECK(cudaEventSynchronize(event_)); }
  bool query() const {  // true when the recorded work has finished
    const cudaError_t r = cudaEventQuery(event_);
    if (r == cudaErrorNotReady) return false;
    DDP_CUDA_CHECK(r);
    return true;
  }
  // Milliseconds between two recorded events (both created with timing = true).
  float elapsed_ms_since(const Event& start) const {
    float ms = 0.f;
    DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  void release() noexcept {
    if (event_) DDP_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_));
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

}  // namespace ddp
