// Device tags (Cpu, Cuda), the Device concept, and Exec<D>: where and how a kernel runs.
// SPDX-License-Identifier: MIT
//
// Code that works on both devices is written once against a tag, never with #ifdef:
//   template <Device D> void step(Exec<D>& exec, TensorView<float, D> x) {
//     Kernels<D>::relu_forward(exec, ...);
//   }
// Exec<Cpu> says how many threads CPU kernels may use (a non-owning handle to a ThreadPool, see
// kernels/cpu/thread_pool.hpp; nullptr runs everything on the calling thread). Exec<Cuda> carries
// the CUDA stream (a cudaStream_t stored as void* so that this header needs no CUDA headers), the
// precision of the GEMM-shaped work (tensor/precision.hpp), the convolutions' implementation
// (tensor/conv_impl.hpp) and the deterministic-mode switch.
#pragma once

#include <concepts>
#include <string_view>

#include "ddp/tensor/conv_impl.hpp"
#include "ddp/tensor/precision.hpp"

namespace ddp {

// name: for messages. host_memory: whether the CPU can dereference the device's pointers (what a
// backend's memory kind is derived from, comm/types.hpp), so code above tensor/ never compares
// tags.
struct Cpu {
  static constexpr std::string_view name = "cpu";
  static constexpr bool host_memory = true;
};
struct Cuda {
  static constexpr std::string_view name = "cuda";
  static constexpr bool host_memory = false;
};

template <class D>
concept Device = std::same_as<D, Cpu> || std::same_as<D, Cuda>;

namespace kernels::cpu {
class ThreadPool;  // kernels/cpu/thread_pool.hpp
}

template <Device D>
struct Exec;

// CPU execution context: cheap to copy; the pool it points to must outlive every copy.
template <>
struct Exec<Cpu> {
  kernels::cpu::ThreadPool* pool = nullptr;  // nullptr: run on the calling thread
};

// CUDA execution context: the stream every kernel and copy of this context is enqueued on, and how
// the kernels compute. Cheap to copy.
template <>
struct Exec<Cuda> {
  void* stream = nullptr;  // cudaStream_t; nullptr is the legacy default stream
  // convolutions and Linear (--precision); see precision.hpp
  Precision precision = Precision::Tf32;
  // convolutions: cuDNN or ddp's own kernels (--conv); conv_impl.hpp
  ConvImpl conv = ConvImpl::Auto;
  // true: only kernels whose results are bitwise reproducible run to run (no atomics in
  // reductions). Every kernel of kernels/cuda/ is deterministic today (split-K and channel sums add
  // partials in a fixed order, max-pool backward gathers); the flag keeps any later fast path with
  // atomics off, and the cuDNN convolutions to algorithms cuDNN reports deterministic.
  bool deterministic = false;
};

// The stream that work on exec's data is ordered on, as comm's options take it (`.stream`,
// comm/types.hpp): none on the host. Code written for any D passes stream_of(exec) and never names
// a device.
inline void* stream_of(const Exec<Cpu>&) noexcept { return nullptr; }
inline void* stream_of(const Exec<Cuda>& e) noexcept { return e.stream; }

// Blocks the host until the work enqueued on exec has finished: CPU kernels have when they return
// (the CUDA overload is in tensor/cuda/stream.hpp).
inline void synchronize(const Exec<Cpu>&) noexcept {}

}  // namespace ddp
