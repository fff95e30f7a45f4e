// Copies involving the GPU: DeviceCopy<Cuda, Cpu>, <Cpu, Cuda>, <Cuda, Cuda> for to<D>(), and
// copy() on the GPU.
// SPDX-License-Identifier: MIT
//
// All copies are enqueued on the exec's stream (cudaMemcpyAsync), so they are ordered with the
// kernels around them. to<Cpu>(gpu_view, exec) returns a host tensor the caller reads at once, so
// it waits for the stream; the other directions return without waiting. A host source is read
// before the call returns unless it is pinned (PinnedBuffer), in which case it must stay alive
// until the stream passes.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp {

namespace detail {
template <class S, class T, Device DS, Device DD>
void copy_async(TensorView<S, DS> src, TensorView<T, DD> dst, cudaMemcpyKind kind,
                const Exec<Cuda>& e, const char* op) {
  if (!(src.shape() == dst.shape()))
    throw ValueError(detail::str("ddp: ", op, ": source shape ", src.shape(),
                                 " differs from destination shape ", dst.shape(),
                                 "; reshape one of the views"));
  if (src.numel())
    DDP_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), kind, cuda_stream(e)));
}
}  // namespace detail

// dst = src on the GPU (asynchronous on e's stream).
template <class T>
void copy(TensorView<const T, Cuda> src, TensorView<T, Cuda> dst, const Exec<Cuda>& e) {
  detail::copy_async(src, dst, cudaMemcpyDeviceToDevice, e, "copy");
}
// Upload into an existing device tensor (asynchronous on e's stream).
template <class T>
void copy(TensorView<const T, Cpu> src, TensorView<T, Cuda> dst, const Exec<Cuda>& e) {
  detail::copy_async(src, dst, cudaMemcpyHostToDevice, e, "copy (host to device)");
}
// Download into an existing host tensor; waits for e's stream so dst is ready on return.
template <class T>
void copy(TensorView<const T, Cuda> src, TensorView<T, Cpu> dst, const Exec<Cuda>& e) {
  detail::copy_async(src, dst, cudaMemcpyDeviceToHost, e, "copy (device to host)");
  synchronize(e);
}

template <>
struct DeviceCopy<Cuda, Cpu> {
  template <class T>
  static Tensor<std::remove_const_t<T>, Cuda> run(TensorView<T, Cpu> src, const Exec<Cuda>& e) {
    Tensor<std::remove_const_t<T>, Cuda> out(src.shape());
    detail::copy_async(src, out.view(), cudaMemcpyHostToDevice, e, "to<Cuda>");
    return out;
  }
};

template <>
struct DeviceCopy<Cpu, Cuda> {
  template <class T>
  static Tensor<std::remove_const_t<T>, Cpu> run(TensorView<T, Cuda> src, const Exec<Cuda>& e) {
    Tensor<std::remove_const_t<T>, Cpu> out(src.shape());
    detail::copy_async(src, out.view(), cudaMemcpyDeviceToHost, e, "to<Cpu>");
    synchronize(e);
    return out;
  }
};

template <>
struct DeviceCopy<Cuda, Cuda> {
  template <class T>
  static Tensor<std::remove_const_t<T>, Cuda> run(TensorView<T, Cuda> src, const Exec<Cuda>& e) {
    Tensor<std::remove_const_t<T>, Cuda> out(src.shape());
    detail::copy_async(src, out.view(), cudaMemcpyDeviceToDevice, e, "to<Cuda>");
    return out;
  }
};

}  // namespace ddp
