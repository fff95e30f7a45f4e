// OpScope, op_phase, CudaOpProfiler: device time per op class (conv fprop/dgrad/wgrad by library,
// BatchNorm's statistics/finalize/apply passes, pooling, element-wise ops, loss, optimizer),
// measured with CUDA events.
// SPDX-License-Identifier: MIT
//
// Where the scopes are: one OpScope per member of Kernels<Cuda> (kernels.cuh), and op_phase lines
// at the few points inside an op where its work changes kind (conv2d.cuh: which library runs fprop,
// dgrad, wgrad; batchnorm.cuh and bn_act.cuh: statistics, finalize, apply). Labels:
// "<class>[.<phase>]", e.g. "conv.dgrad.cudnn", "conv.fprop.cublas" (1x1 convs as GEMMs),
// "bn_act_forward.apply", "add", "optimizer". The timeline and the per-label sums are plain C++
// (kernels/op_profile.hpp, tested without a GPU). Cost when off: each scope reads one thread-local
// pointer and finds it null; nothing is recorded. When on (a CudaOpProfiling guard on this thread,
// e.g. bench_resnet_gpu --profile): every boundary records a timing event on the op's stream (a few
// microseconds of host time each), so profiled steps are run apart from the timed ones. What an
// interval measures is the device's time between two events of one stream: the kernels between them
// when the stream is busy (the GPU-bound case), plus the device's idle wait for the host's next
// launch when it is not (a launch-bound stretch shows up as time in the op that waited). Only the
// thread that holds the guard is profiled; other threads' ops (comm threads) are not seen.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <exception>
#include <utility>
#include <vector>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/log.hpp"
#include "ddp/kernels/op_profile.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cuda {

// Records the timeline's events on the device and turns them into an OpProfile. One thread at a
// time.
class CudaOpProfiler {
 public:
  CudaOpProfiler() = default;
  CudaOpProfiler(const CudaOpProfiler&) = delete;
  CudaOpProfiler& operator=(const CudaOpProfiler&) = delete;
  ~CudaOpProfiler() {
    for (cudaEvent_t e : events_) DDP_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
  }

  void begin(cudaStream_t s, const char* cls, const char* phase) {
    record(timeline_.begin(cls, phase), s);
  }
  void phase(cudaStream_t s, const char* phase) {
    if (timeline_.phase(phase)) record(timeline_.events() - 1, s);
  }
  void end(cudaStream_t s) { record(timeline_.end(), s); }

  // Waits for the last event, adds the times between consecutive events to `into` as `steps` steps,
  // and starts a new stretch (the events are reused). Call it outside every scope, after the
  // profiled steps.
  void collect(OpProfile& into, int steps) {
    const std::size_t n = timeline_.events();
    if (n > 0) {
      DDP_CUDA_CHECK(cudaEventSynchronize(events_[n - 1]));
      std::vector<double> gaps(n - 1);
      for (std::size_t i = 0; i + 1 < n; ++i) {
        float ms = 0.f;
        DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
        gaps[i] = ms;
      }
      into.add(timeline_, gaps, steps);
    }
    timeline_.clear();
  }

 private:
  void record(std::size_t i, cudaStream_t s) {
    while (events_.size() <= i) {
      cudaEvent_t e = nullptr;
      DDP_CUDA_CHECK(cudaEventCreate(&e));  // with timing
      events_.push_back(e);
    }
    DDP_CUDA_CHECK(cudaEventRecord(events_[i], s));
  }
  OpTimeline timeline_;
  std::vector<cudaEvent_t> events_;  // events_[i] is the timeline's event i
};

// This thread's profiler; nullptr (the default) when profiling is off.
inline CudaOpProfiler*& active_op_profiler() noexcept {
  thread_local CudaOpProfiler* p = nullptr;
  return p;
}

// Profiles this thread's ops into `p` while it lives.
class CudaOpProfiling {
 public:
  explicit CudaOpProfiling(CudaOpProfiler& p) noexcept
      : previous_(std::exchange(active_op_profiler(), &p)) {}
  CudaOpProfiling(const CudaOpProfiling&) = delete;
  CudaOpProfiling& operator=(const CudaOpProfiling&) = delete;
  ~CudaOpProfiling() { active_op_profiler() = previous_; }

 private:
  CudaOpProfiler* previous_;
};

// The op class of the work enqueued on e's stream while it lives (cls, phase: string literals).
class OpScope {
 public:
  OpScope(const Exec<Cuda>& e, const char* cls, const char* phase = nullptr)
      : p_(active_op_profiler()) {
    if (p_) [[unlikely]] {
      s_ = cuda_stream(e);
      p_->begin(s_, cls, phase);
    }
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  ~OpScope() {
    if (p_) [[unlikely]] {
      try {
        p_->end(s_);
        // a failed event record: the profile loses an interval, no more
      } catch (const std::exception& ex) {
        DDP_LOG_ERROR(ex.what());
      }
    }
  }

 private:
  CudaOpProfiler* p_;
  cudaStream_t s_ = nullptr;
};

// From here to the end of the innermost OpScope (or its next op_phase), its work is
// "<class>.<phase>".
inline void op_phase(const Exec<Cuda>& e, const char* phase) {
  if (CudaOpProfiler* p = active_op_profiler()) [[unlikely]]
    p->phase(cuda_stream(e), phase);
}

}  // namespace ddp::kernels::cuda
