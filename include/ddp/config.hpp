// Compile-time configuration: the only header that reads __CUDACC__ and the DDP_WITH_* feature
// macros.
// SPDX-License-Identifier: MIT
//
// The DDP_WITH_* macros come only from the INTERFACE definitions of the CMake targets (ddp::cuda,
// ddp::nccl, ddp::cudnn, ddp::mpi), so every translation unit of one program agrees on them. They
// only add classes; they never change the layout of a class that exists without them.
#pragma once

#if defined(__CUDACC__)
#  define DDP_HOST_DEVICE __host__ __device__
#  define DDP_CUDA_COMPILER 1
#else
#  define DDP_HOST_DEVICE
#  define DDP_CUDA_COMPILER 0
#endif

#ifndef DDP_WITH_CUDA
#  define DDP_WITH_CUDA 0
#endif
#ifndef DDP_WITH_NCCL
#  define DDP_WITH_NCCL 0
#endif
#ifndef DDP_WITH_CUDNN
// DDP_WITH_CUDNN 1: the program links ddp::cudnn; conv2d.cuh runs convolutions on cuDNN
// (docs/decisions/0052)
#  define DDP_WITH_CUDNN 0
#endif
#ifndef DDP_WITH_MPI
#  define DDP_WITH_MPI 0
#endif
#ifndef DDP_WITH_BLAS
#  define DDP_WITH_BLAS 0  // 1: CPU GEMM calls CBLAS (OpenBLAS); 0: the portable fallback
#endif
// DDP_CPU_CACHING: 1 serves host tensors from a caching pool (tensor/storage.hpp, Allocator<Cpu>);
// 0 calls aligned_alloc/free per tensor. Default 1, but 0 under AddressSanitizer, which can report
// a use after free only when the memory really goes back to malloc. Every translation unit of a
// program must agree.
#ifndef DDP_CPU_CACHING
#  if defined(__SANITIZE_ADDRESS__)
#    define DDP_CPU_CACHING 0
#  elif defined(__has_feature)
#    if __has_feature(address_sanitizer)
#      define DDP_CPU_CACHING 0
#    endif
#  endif
#endif
#ifndef DDP_CPU_CACHING
#  define DDP_CPU_CACHING 1
#endif

namespace ddp {

// Which optional parts this translation unit was built with (mirrors the macros for `if
// constexpr`).
struct BuildConfig {
  static constexpr bool cuda_compiler = DDP_CUDA_COMPILER != 0;
  static constexpr bool with_cuda = DDP_WITH_CUDA != 0;
  static constexpr bool with_nccl = DDP_WITH_NCCL != 0;
  static constexpr bool with_cudnn = DDP_WITH_CUDNN != 0;
  static constexpr bool with_mpi = DDP_WITH_MPI != 0;
  static constexpr bool with_blas = DDP_WITH_BLAS != 0;
  static constexpr bool cpu_caching = DDP_CPU_CACHING != 0;
};

namespace detail {
// For static_assert in a primary template that must never be instantiated.
template <class...>
inline constexpr bool dependent_false = false;
}  // namespace detail

// CBLAS, when built with it (kernels/cpu/gemm.hpp calls only these, behind BuildConfig::with_blas).
// Row-major GEMM with CBLAS's int sizes; the caller has checked that every size fits.
//
// We declare the two CBLAS entry points ourselves, under our own names bound to the C symbols with
// an asm label, instead of including <cblas.h>: OpenBLAS's cblas.h puts `typedef ... bfloat16;`
// (and blasint, CBLAS_ORDER, ...) in the global namespace, which made `bfloat16` ambiguous in every
// translation unit that says `using namespace ddp;`. The label declarations do not clash with a
// <cblas.h> the user includes. Enum arguments are passed as int: CBLAS's enums are C enums with int
// representation (RowMajor = 101, NoTrans = 111, Trans = 112, fixed by the CBLAS standard).
namespace blas {
namespace detail {
#if DDP_WITH_BLAS
void cblas_sgemm_sym(int order, int ta, int tb, int m, int n, int k, float alpha, const float* a,
                     int lda, const float* b, int ldb, float beta, float* c,
                     int ldc) __asm__("cblas_sgemm");
void cblas_dgemm_sym(int order, int ta, int tb, int m, int n, int k, double alpha, const double* a,
                     int lda, const double* b, int ldb, double beta, double* c,
                     int ldc) __asm__("cblas_dgemm");
// OpenBLAS only; weak, so another CBLAS links too and the call is skipped there.
void openblas_set_num_threads_sym(int n) __asm__("openblas_set_num_threads") __attribute__((weak));
char* openblas_get_corename_sym() __asm__("openblas_get_corename") __attribute__((weak));
#endif
inline constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
}  // namespace detail

inline void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
#if DDP_WITH_BLAS
  detail::cblas_sgemm_sym(detail::kRowMajor, ta ? detail::kTrans : detail::kNoTrans,
                          tb ? detail::kTrans : detail::kNoTrans, m, n, k, alpha, a, lda, b, ldb,
                          beta, c, ldc);
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b,
      (void)ldb, (void)beta, (void)c, (void)ldc;
#endif
}
inline void gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
#if DDP_WITH_BLAS
  detail::cblas_dgemm_sym(detail::kRowMajor, ta ? detail::kTrans : detail::kNoTrans,
                          tb ? detail::kTrans : detail::kNoTrans, m, n, k, alpha, a, lda, b, ldb,
                          beta, c, ldc);
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b,
      (void)ldb, (void)beta, (void)c, (void)ldc;
#endif
}
// OpenBLAS threads its GEMMs by default; ours run inside our own thread pool, so one thread each.
inline void set_single_threaded() noexcept {
#if DDP_WITH_BLAS
  if (detail::openblas_set_num_threads_sym != nullptr) detail::openblas_set_num_threads_sym(1);
#endif
}
// The kernel set OpenBLAS chose when it loaded ("Prescott", "Haswell", "SkylakeX", ...; it reads
// OPENBLAS_CORETYPE); nullptr without OpenBLAS.
inline const char* core_name() noexcept {
#if DDP_WITH_BLAS
  return detail::openblas_get_corename_sym != nullptr ? detail::openblas_get_corename_sym()
                                                      : nullptr;
#else
  return nullptr;
#endif
}
}  // namespace blas

// The CPU's vector extensions as the compiler's runtime check reports them (x86-64 host code;
// none elsewhere).
struct CpuVectorIsa {
  bool avx2 = false, avx512f = false;
};
inline CpuVectorIsa cpu_vector_isa() noexcept {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
  return {.avx2 = __builtin_cpu_supports("avx2") != 0,
          .avx512f = __builtin_cpu_supports("avx512f") != 0};
#else
  return {};
#endif
}

}  // namespace ddp
