// DDP_CUDA_CHECK, DDP_CUDA_CHECK_NOTHROW, DDP_CUBLAS_CHECK: every CUDA runtime / cuBLAS call,
// checked.
// SPDX-License-Identifier: MIT
//
// A failed call throws ddp::CudaError whose text is the expression, the library's own error name
// and description, and the source location, e.g.
//   ddp: cudaMalloc(&p, bytes) failed: cudaErrorMemoryAllocation (out of memory) at
//     allocator.hpp:71
// Destructors use DDP_CUDA_CHECK_NOTHROW, which logs the same text at error level instead of
// throwing. Kernel launches are followed by DDP_CUDA_CHECK(cudaGetLastError()) (a bad launch
// configuration is reported there; a fault inside the kernel surfaces at the next synchronising
// call). Needs only the CUDA toolkit's headers (cuda_runtime.h, cublas_v2.h), not nvcc.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"

namespace ddp::detail {

// "expr failed: cudaErrorX (description) at file:line"
inline std::string cuda_error_text(const char* expr, cudaError_t e, const char* file, int line) {
  return str("ddp: ", expr, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") at ",
             file, ':', line);
}

// cuBLAS has names (cublasGetStatusName) and descriptions (cublasGetStatusString) since 11.4.2.
inline std::string cublas_error_text(const char* expr, cublasStatus_t s, const char* file,
                                     int line) {
  return str("ddp: ", expr, " failed: ", cublasGetStatusName(s), " (", cublasGetStatusString(s),
             ") at ", file, ':', line);
}

}  // namespace ddp::detail

#define DDP_CUDA_CHECK(expr)                                                                     \
  do {                                                                                           \
    if (const cudaError_t ddp_e_ = (expr); ddp_e_ != cudaSuccess)                                \
      throw ::ddp::CudaError(::ddp::detail::cuda_error_text(#expr, ddp_e_, __FILE__, __LINE__)); \
  } while (0)

#define DDP_CUDA_CHECK_NOTHROW(expr)                                                    \
  do {                                                                                  \
    if (const cudaError_t ddp_e_ = (expr); ddp_e_ != cudaSuccess)                       \
      DDP_LOG_ERROR(::ddp::detail::cuda_error_text(#expr, ddp_e_, __FILE__, __LINE__)); \
  } while (0)

#define DDP_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                             \
    if (const cublasStatus_t ddp_s_ = (expr); ddp_s_ != CUBLAS_STATUS_SUCCESS)                     \
      throw ::ddp::CudaError(::ddp::detail::cublas_error_text(#expr, ddp_s_, __FILE__, __LINE__)); \
  } while (0)
