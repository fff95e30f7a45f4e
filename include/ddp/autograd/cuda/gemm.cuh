// Autograd on the GPU: Kernels<Cuda> and matmul's GEMM, detail::Gemm<Cuda> (cuBLAS). Compiled only
// by nvcc.
// SPDX-License-Identifier: MIT
//
// A .cu file that runs autograd's ops on Var<T, Cuda> includes this header (it brings
// autograd/autograd.hpp and kernels/cuda/kernels.cuh). The product is blas.cuh's checked
// cublasGemmEx at exec.precision, as Linear's and attention's GEMMs: Fp32 is exact fp32 (matches
// the CPU to rounding), Tf32/Bf16 use tensor cores; double is always CUBLAS_COMPUTE_64F.
//
// Row-major to cuBLAS's column-major: a row-major X (r x c, leading dimension ld) is the
// column-major X^T with the same ld, so row-major C = op(A) op(B) is column-major C^T = op(B)^T
// op(A)^T: cuBLAS's (n x m) product of B's then A's column-major views, each transposed exactly
// when the row-major operand is.
#pragma once

#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>

#include "ddp/autograd/autograd.hpp"
#include "ddp/kernels/cuda/blas.cuh"
#include "ddp/kernels/cuda/kernels.cuh"
#include "ddp/tensor/device.hpp"

namespace ddp::autograd::detail {

template <>
struct Gemm<Cuda> {
  template <class T>
  static void run(const Exec<Cuda>& e, bool ta, bool tb, std::int64_t m, std::int64_t n,
                  std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c,
                  std::int64_t ldc) {
    if (m == 0 || n == 0) return;
    // k = 0 gives C = 0 (beta 0), but cuBLAS still wants every leading dimension >= 1.
    const auto ld = [](std::int64_t x) { return std::max<std::int64_t>(x, 1); };
    kernels::cuda::detail::gemm<T>(e, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, b, ld(ldb), a, ld(lda),
                                   T(0), c, ld(ldc), e.precision);
  }
};

}  // namespace ddp::autograd::detail
