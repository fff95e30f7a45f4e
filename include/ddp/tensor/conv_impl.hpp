// ConvImpl: which implementation a CUDA run's convolutions use, and its flag (--conv).
// SPDX-License-Identifier: MIT
//
//   Auto        cuDNN where ddp was built with it (the ddp::cudnn target, DDP_WITH_CUDNN), else
//     Own.
//   Own         ddp's implicit-GEMM kernels (kernels/cuda/conv2d.cuh): the reference, and what runs
//     without cuDNN.
//   Cudnn       cuDNN with the algorithm its heuristics rank first (PyTorch's default,
//               torch.backends.cudnn.benchmark = False).
//   CudnnFind   cuDNN with the fastest algorithm measured on the first call of each shape
//     (cudnn.benchmark = True):
//               costs a few timed runs per new shape, then nothing.
// Whether cuDNN is there is a property of the program: it links ddp::cudnn (DDP_WITH_CUDNN=1) or
// not, and every file of one program must agree. Both cuDNN modes keep to deterministic algorithms
// when Exec<Cuda>::deterministic is set. 1x1 stride-1 unpadded convolutions are cuBLAS GEMMs in
// every mode (conv2d.cuh). Asking for a cuDNN mode in a program built without cuDNN is a
// ConfigError (resolve_conv_impl) at the first convolution, or earlier where a program checks its
// flag. docs/decisions/0052.
#pragma once

#include <cstdint>
#include <string_view>

#include "ddp/config.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp {

enum class ConvImpl : std::uint8_t { Auto, Own, Cudnn, CudnnFind };

inline constexpr std::string_view conv_impl_name(ConvImpl c) noexcept {
  switch (c) {
    case ConvImpl::Auto: return "auto";
    case ConvImpl::Own: return "own";
    case ConvImpl::Cudnn: return "cudnn";
    case ConvImpl::CudnnFind: return "cudnn_find";
  }
  return "?";
}

// "auto" | "own" | "cudnn" | "cudnn_find" (the --conv flag); ConfigError naming the flag otherwise.
inline ConvImpl parse_conv_impl(std::string_view s) {
  for (ConvImpl c : {ConvImpl::Auto, ConvImpl::Own, ConvImpl::Cudnn, ConvImpl::CudnnFind})
    if (s == conv_impl_name(c)) return c;
  throw ConfigError(ddp::detail::str(
      "ddp: unknown --conv ", ddp::detail::quoted(s),
      "; valid: auto (cuDNN when built with it, else own), own, cudnn, cudnn_find"));
}

// What `impl` means in this program: Auto becomes Cudnn or Own; a cuDNN mode in a program built
// without cuDNN is a ConfigError naming --conv.
inline ConvImpl resolve_conv_impl(ConvImpl impl) {
  if constexpr (BuildConfig::with_cudnn) return impl == ConvImpl::Auto ? ConvImpl::Cudnn : impl;
  if (impl == ConvImpl::Cudnn || impl == ConvImpl::CudnnFind)
    throw ConfigError(
        ddp::detail::str("ddp: --conv ", conv_impl_name(impl),
                         " needs cuDNN, but this program was built without it (it must link "
                         "ddp::cudnn, which CMake defines where it finds cuDNN: "
                         "-DDDP_WITH_CUDNN=ON -DCUDNN_ROOT=<prefix>); use --conv "
                         "own or auto"));
  return ConvImpl::Own;
}

}  // namespace ddp
