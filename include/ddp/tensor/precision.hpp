// Precision: the arithmetic a CUDA run uses for its GEMM-shaped work (convolutions, Linear), and
// its flag.
// SPDX-License-Identifier: MIT
//
//   Fp32  exact fp32 FMAs (SIMT implicit GEMM; cuBLAS CUBLAS_COMPUTE_32F): matches the CPU to
//     rounding.
//   Tf32  tensor cores with TF32 operands (10 mantissa bits) and fp32 accumulation: ~1e-3 relative.
//         The default on the GPU, as PyTorch's cudnn.allow_tf32.
//   Bf16  tensor cores with bf16 operands (7 mantissa bits) and fp32 accumulation: ~1e-2 relative.
//   Fp16  tensor cores with fp16 operands (10 mantissa bits, 5 exponent bits: |x| > 65504
//     overflows, < 6e-8
//         flushes) and fp32 accumulation; for cuBLAS GEMMs only (Linear, attention: the GPT's
//           --use_amp
//         --amp_dtype fp16, with a loss scaler, optim/grad_scaler.hpp). The convolutions refuse it,
//           and
//         parse_precision does not offer it, so --precision cannot select it for a ResNet.
// Whatever the precision, tensors in memory stay float32 (weights, activations, gradients), the
// loss is float32, and BatchNorm, pooling, losses and SGD run in fp32 (their statistics in double).
// Exec<Cuda> carries it (tensor/device.hpp); the CPU ignores it. parse_precision reads --precision.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp {

enum class Precision : std::uint8_t { Fp32, Tf32, Bf16, Fp16 };

inline constexpr std::string_view precision_name(Precision p) noexcept {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Tf32: return "tf32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}

// "fp32" | "tf32" | "bf16" (the --precision flag); ConfigError naming the flag otherwise.
inline Precision parse_precision(std::string_view s) {
  if (s == "fp32") return Precision::Fp32;
  if (s == "tf32") return Precision::Tf32;
  if (s == "bf16") return Precision::Bf16;
  throw ConfigError(ddp::detail::str("ddp: unknown --precision ", ddp::detail::quoted(s),
                                     "; valid: fp32, tf32 (the GPU default), bf16"));
}

}  // namespace ddp
