// Explicit copies: copy(src, dst) within a device, convert between element types, to<Dst>() across
// devices.
// SPDX-License-Identifier: MIT
//
// Nothing in ddp copies tensor data implicitly. Cross-device copies take the destination device as
// a template argument and the Exec whose stream orders them: `auto g = to<Cuda>(x.view(), exec)`.
// The CPU <-> CUDA overloads are declared here and defined by the CUDA layer (kernels/cuda/), so a
// CPU-only program that calls them fails to link with an undefined ddp::to<ddp::Cuda...> symbol.
#pragma once

#include <cstring>
#include <type_traits>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp {

// dst = src, element by element; shapes must match exactly (reshape a view first if needed).
template <class T>
void copy(TensorView<const T, Cpu> src, TensorView<T, Cpu> dst) {
  if (!(src.shape() == dst.shape()))
    throw ValueError(detail::str("ddp: copy: source shape ", src.shape(),
                                 " differs from destination shape ", dst.shape(),
                                 "; reshape one of the views"));
  if (src.numel()) std::memmove(dst.data(), src.data(), src.bytes());
}
// The same with an Exec, so code written for any device D can call copy(host_view, view_on_D,
// Exec<D>{}) (tensor/cuda/copy.hpp has the CUDA overloads); a CPU copy is done when it returns.
template <class T>
void copy(TensorView<const T, Cpu> src, TensorView<T, Cpu> dst, const Exec<Cpu>& /*exec*/) {
  copy(src, dst);
}

// dst = To(src) for arithmetic types and the 16-bit floats (float -> bfloat16 rounds to nearest
// even).
template <class From, class To>
void convert(TensorView<const From, Cpu> src, TensorView<To, Cpu> dst) {
  if (!(src.shape() == dst.shape()))
    throw ValueError(detail::str("ddp: convert: source shape ", src.shape(),
                                 " differs from destination shape ", dst.shape()));
  const std::int64_t n = src.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_arithmetic_v<From> && std::is_arithmetic_v<To>)
      dst.data()[i] = static_cast<To>(src.data()[i]);
    else if constexpr (std::is_arithmetic_v<From>)
      dst.data()[i] = To(static_cast<float>(src.data()[i]));
    else if constexpr (std::is_arithmetic_v<To>)
      dst.data()[i] = static_cast<To>(static_cast<float>(src.data()[i]));
    else
      dst.data()[i] = To(static_cast<float>(src.data()[i]));
  }
}

// DeviceCopy<To, From>::run(src, exec) makes a new tensor on To from a view on From. The primary
// template is only declared: Cpu <-> Cuda specialisations come with the CUDA layer (exec is then an
// Exec<Cuda>, whose stream orders the copy), so using them without it is a compile error naming
// DeviceCopy.
template <Device To, Device From>
struct DeviceCopy;

template <>
struct DeviceCopy<Cpu, Cpu> {
  template <class T>
  static Tensor<std::remove_const_t<T>, Cpu> run(TensorView<T, Cpu> src, Exec<Cpu>& /*exec*/) {
    Tensor<std::remove_const_t<T>, Cpu> out(src.shape());
    if (src.numel()) std::memcpy(out.data(), src.data(), src.bytes());
    return out;
  }
};

// auto host = to<Cpu>(gpu_tensor.view(), cuda_exec);  auto copy = to<Cpu>(x.view(), cpu_exec);
template <Device To, class T, Device From, class E>
Tensor<std::remove_const_t<T>, To> to(TensorView<T, From> src, E& exec) {
  return DeviceCopy<To, From>::run(src, exec);
}

}  // namespace ddp
