// cuBLAS plumbing for the CUDA kernels: one handle per thread and device, and checked fp32/fp64
// GEMMs (single and strided-batched).
// SPDX-License-Identifier: MIT
//
// Handles are created on first use and bound to the exec's stream before each call. They are
// deliberately never destroyed: destroying them from thread-exit or static destructors after the
// CUDA context is gone crashes some drivers, and process exit releases them. The compute type
// follows the exec's Precision (tensor/precision.hpp): Fp32 -> CUBLAS_COMPUTE_32F (no tensor-core
// down-conversion; matches the CPU's fp32 GEMM to rounding), Tf32 -> CUBLAS_COMPUTE_32F_FAST_TF32,
// Bf16 -> CUBLAS_COMPUTE_32F_FAST_16BF (fp32 in and out, bf16 products on tensor cores, fp32
// accumulation). Determinism: cuBLAS gives the same bits run to run on one GPU model and toolkit as
// long as a handle is not shared between streams concurrently (we bind one handle per thread to the
// caller's stream) and atomics mode stays CUBLAS_ATOMICS_NOT_ALLOWED (its default, set explicitly
// here). Shapes are column-major, cuBLAS's convention: C (m x n) = op(A) op(B) + beta C. Row-major
// callers issue the transposed product (see linear.cuh for the worked mapping).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/precision.hpp"

namespace ddp::kernels::cuda::detail {

inline constexpr int kMaxDevices = 64;

// This thread's cuBLAS handle for the current device, bound to e's stream.
inline cublasHandle_t cublas_handle(const Exec<Cuda>& e) {
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices)
    throw CudaError(ddp::detail::str("ddp: CUDA device ", device, " is beyond the ", kMaxDevices,
                                     " devices ddp keeps cuBLAS handles for"));
  cublasHandle_t& h = handles[device];
  if (!h) {
    DDP_CUBLAS_CHECK(cublasCreate(&h));
    DDP_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
  }
  DDP_CUBLAS_CHECK(cublasSetStream(h, cuda_stream(e)));
  return h;
}

template <class T>
inline constexpr cudaDataType_t cuda_data_type = CUDA_R_32F;
template <>
inline constexpr cudaDataType_t cuda_data_type<double> = CUDA_R_64F;
template <>
inline constexpr cudaDataType_t cuda_data_type<bfloat16> = CUDA_R_16BF;

// cuBLAS compute type for element type T at precision p (doubles are always exact).
template <class T>
cublasComputeType_t compute_type(Precision p) {
  if constexpr (sizeof(T) == 8) {
    return CUBLAS_COMPUTE_64F;
  } else {
    switch (p) {
      case Precision::Tf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
      case Precision::Bf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
      case Precision::Fp16: return CUBLAS_COMPUTE_32F_FAST_16F;
      case Precision::Fp32: break;
    }
    return CUBLAS_COMPUTE_32F;
  }
}

// Column-major C (m x n) = alpha op(A) op(B) + beta C, int64 sizes checked against cuBLAS's int.
inline void require_gemm_sizes(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
                               std::int64_t ldb, std::int64_t ldc) {
  constexpr std::int64_t kIntMax = 2147483647;
  if (m > kIntMax || n > kIntMax || k > kIntMax || lda > kIntMax || ldb > kIntMax || ldc > kIntMax)
    throw ValueError(ddp::detail::str("ddp: linear: GEMM sizes m=", m, " n=", n, " k=", k,
                                      " exceed cuBLAS's 32-bit limit; split the batch"));
}

template <class T>
void gemm(const Exec<Cuda>& e, cublasOperation_t ta, cublasOperation_t tb, std::int64_t m,
          std::int64_t n, std::int64_t k, const T* a, std::int64_t lda, const T* b,
          std::int64_t ldb, T beta, T* c, std::int64_t ldc, Precision precision = Precision::Fp32) {
  require_gemm_sizes(m, n, k, lda, ldb, ldc);
  const T alpha = T(1);
  const cublasComputeType_t compute = compute_type<T>(precision);
  DDP_CUBLAS_CHECK(cublasGemmEx(cublas_handle(e), ta, tb, static_cast<int>(m), static_cast<int>(n),
                                static_cast<int>(k), &alpha, a, cuda_data_type<T>,
                                static_cast<int>(lda), b, cuda_data_type<T>, static_cast<int>(ldb),
                                &beta, c, cuda_data_type<T>, static_cast<int>(ldc), compute,
                                CUBLAS_GEMM_DEFAULT));
  sync_check_after("cublasGemmEx", cuda_stream(e));  // DDP_CUDA_SYNC_CHECK=1 only
}

// The same product with bf16 A and B (bf16 activations, docs/decisions/0072): CUBLAS_COMPUTE_32F,
// so products of bf16 operands are exact and accumulate in fp32 whatever the exec's precision; C is
// Out: bfloat16 (alpha AB + beta C formed in fp32, rounded once to nearest even as it is stored) or
// float (a weight gradient).
template <class Out>
void gemm_bf16(const Exec<Cuda>& e, cublasOperation_t ta, cublasOperation_t tb, std::int64_t m,
               std::int64_t n, std::int64_t k, const bfloat16* a, std::int64_t lda,
               const bfloat16* b, std::int64_t ldb, float beta, Out* c, std::int64_t ldc) {
  static_assert(std::is_same_v<Out, bfloat16> || std::is_same_v<Out, float>,
                "ddp: gemm_bf16 writes bf16 or float");
  require_gemm_sizes(m, n, k, lda, ldb, ldc);
  const float alpha = 1.f;
  DDP_CUBLAS_CHECK(cublasGemmEx(
      cublas_handle(e), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
      &alpha, a, CUDA_R_16BF, static_cast<int>(lda), b, CUDA_R_16BF, static_cast<int>(ldb), &beta,
      c, cuda_data_type<Out>, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  sync_check_after("cublasGemmEx", cuda_stream(e));  // DDP_CUDA_SYNC_CHECK=1 only
}

// `count` independent column-major products C_i (m x n) = alpha op(A_i) op(B_i) + beta C_i, where
// X_i starts stride_x elements after X_{i-1} (cublasGemmStridedBatchedEx). `op` names the caller in
// the size error.
// Example: attention's scores of one head over the batch: count = B, stride_a = stride_b = T * 3C.
template <class T>
void gemm_strided_batched(const Exec<Cuda>& e, const char* op, cublasOperation_t ta,
                          cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k,
                          T alpha, const T* a, std::int64_t lda, std::int64_t stride_a, const T* b,
                          std::int64_t ldb, std::int64_t stride_b, T beta, T* c, std::int64_t ldc,
                          std::int64_t stride_c, std::int64_t count,
                          Precision precision = Precision::Fp32) {
  constexpr std::int64_t kIntMax = 2147483647;
  if (m > kIntMax || n > kIntMax || k > kIntMax || lda > kIntMax || ldb > kIntMax ||
      ldc > kIntMax || count > kIntMax)
    throw ValueError(ddp::detail::str("ddp: ", op, ": batched GEMM sizes m=", m, " n=", n, " k=", k,
                                      " count=", count,
                                      " exceed cuBLAS's 32-bit limit; split the batch"));
  const cublasComputeType_t compute = compute_type<T>(precision);
  DDP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_handle(e), ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
      &alpha, a, cuda_data_type<T>, static_cast<int>(lda), static_cast<long long>(stride_a), b,
      cuda_data_type<T>, static_cast<int>(ldb), static_cast<long long>(stride_b), &beta, c,
      cuda_data_type<T>, static_cast<int>(ldc), static_cast<long long>(stride_c),
      static_cast<int>(count), compute, CUBLAS_GEMM_DEFAULT));
  sync_check_after("cublasGemmStridedBatchedEx", cuda_stream(e));  // DDP_CUDA_SYNC_CHECK=1 only
}

}  // namespace ddp::kernels::cuda::detail
