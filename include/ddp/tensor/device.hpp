// Device tags (Cpu, Cuda), the Device concept, and Exec<D>: where and how a kernel runs.
// SPDX-License-Identifier: MIT
//
// Code that works on both devices is written once against a tag, never with #ifdef:
//   template <Device D> void step(Exec<D>& exec, TensorView<float, D> x) {
//     Kernels<D>::relu_forward(exec, ...);
//   }
// Exec<Cpu> points to the ThreadPool CPU kernels may use; Exec<Cuda> carries the stream (as void*,
// so this header needs no CUDA headers) and how the GPU kernels compute.
#pragma once

#include <concepts>
#include <string_view>

#include "ddp/tensor/conv_impl.hpp"
#include "ddp/tensor/precision.hpp"

namespace ddp {

// name: for messages. host_memory: whether the CPU can dereference the device's pointers (a
// backend's memory kind derives from it), so code above tensor/ never compares tags.
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

// CUDA execution context (cheap to copy): the stream its work is enqueued on, and how it computes.
template <>
struct Exec<Cuda> {
  void* stream = nullptr;  // cudaStream_t; nullptr is the legacy default stream
  // convolutions and Linear (--precision); see precision.hpp
  Precision precision = Precision::Tf32;
  // convolutions: cuDNN or ddp's own kernels (--conv); conv_impl.hpp
  ConvImpl conv = ConvImpl::Auto;
  // true: only kernels whose results are bitwise reproducible run to run (no atomics in
  // reductions): cuDNN convolutions keep to algorithms cuDNN reports deterministic. ddp's own CUDA
  // kernels are always deterministic (partials added in a fixed order, max-pool backward gathers).
  bool deterministic = false;
};

// The stream work on exec's data is ordered on, as comm's options take it (`.stream`); none on the
// host. Code written for any D passes stream_of(exec) and never names a device.
inline void* stream_of(const Exec<Cpu>&) noexcept { return nullptr; }
inline void* stream_of(const Exec<Cuda>& e) noexcept { return e.stream; }

// Waits for exec's work: CPU kernels have finished when they return (CUDA: tensor/cuda/stream.hpp).
inline void synchronize(const Exec<Cpu>&) noexcept {}

}  // namespace ddp
