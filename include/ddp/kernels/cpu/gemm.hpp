// Row-major GEMM for CPU kernels: CBLAS (OpenBLAS) when built with DDP_WITH_BLAS, else a portable
// blocked loop.
// SPDX-License-Identifier: MIT
//
//   C (M x N) = alpha * op(A) (M x K) * op(B) (K x N) + beta * C,   all row-major with leading
//     dimensions
// op(A) = A (M x K, lda >= K) or A^T (A stored K x M, lda >= M); likewise op(B). beta == 0
// overwrites C without reading it (NaN in C does not leak), as BLAS does.
//
// Threads: gemm(exec, ...) splits the M rows (or the N columns when M is small) into one block per
// thread of exec's pool and runs gemm_serial on each, so OpenBLAS itself is kept single-threaded
// (openblas_set_num_threads(1) on first use; this is process-wide). That avoids oversubscription
// when kernels parallelise over images and call gemm_serial per image. Measured on this 2-core
// machine (ResNet layer1 3x3 conv forward, x (16, 56, 56, 64), 2 threads, under load from other
// jobs): our per-image split 112-119 ms vs im2col of the whole batch + one sgemm threaded by
// OpenBLAS 181-182 ms. CBLAS is reached through ddp::blas (config.hpp), so this header has no #if.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/config.hpp"
#include "ddp/core/check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/log.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

enum class Trans : bool { No = false, Yes = true };

namespace detail {

// The portable GEMM: C is scaled by beta once, then accumulated in (kMc x kKc) blocks of op(A)
// against a packed row-major (kKc x N) panel of op(B), with the j loop innermost and contiguous so
// the compiler vectorises it. About 5-15 GFLOP/s per core: for tests and BLAS-less builds.
template <class T>
void gemm_portable(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                   const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                   std::int64_t ldc) {
  constexpr std::int64_t kMc = 64, kKc = 256;
  for (std::int64_t i = 0; i < m; ++i) {
    T* ci = c + i * ldc;
    if (beta == T(0))
      std::fill(ci, ci + n, T(0));
    else if (beta != T(1))
      for (std::int64_t j = 0; j < n; ++j) ci[j] *= beta;
  }
  if (k == 0 || alpha == T(0)) return;
  std::vector<T> panel(static_cast<std::size_t>(std::min(k, kKc) * n));
  for (std::int64_t k0 = 0; k0 < k; k0 += kKc) {
    const std::int64_t kb = std::min(kKc, k - k0);
    for (std::int64_t kk = 0; kk < kb; ++kk)  // panel[kk][j] = op(B)(k0 + kk, j)
      for (std::int64_t j = 0; j < n; ++j)
        panel[static_cast<std::size_t>(kk * n + j)] =
            tb == Trans::No ? b[(k0 + kk) * ldb + j] : b[j * ldb + k0 + kk];
    for (std::int64_t i0 = 0; i0 < m; i0 += kMc) {
      const std::int64_t ie = std::min(m, i0 + kMc);
      for (std::int64_t i = i0; i < ie; ++i) {
        T* ci = c + i * ldc;
        for (std::int64_t kk = 0; kk < kb; ++kk) {
          const T aik = alpha * (ta == Trans::No ? a[i * lda + k0 + kk] : a[(k0 + kk) * lda + i]);
          const T* pk = panel.data() + kk * n;
          for (std::int64_t j = 0; j < n; ++j) ci[j] += aik * pk[j];
        }
      }
    }
  }
}

// OpenBLAS picks its kernels from CPUID when it loads; a VM that hides the CPU model can leave it
// on a generic set ("Prescott", SSE3) on a CPU with AVX2 or AVX-512, where SGEMM, most of a CPU
// training step, runs several times slower (docs/decisions/0080). The warning for kernel set
// `core` on a CPU with those extensions; empty when `core` uses them.
inline std::string blas_core_advice(std::string_view core, bool avx2, bool avx512f) {
  constexpr std::array<std::string_view, 4> k512 = {"SkylakeX", "CooperLake", "SapphireRapids",
                                                    "Zen"};
  constexpr std::array<std::string_view, 5> k256 = {"Haswell", "Zen", "SkylakeX", "CooperLake",
                                                    "SapphireRapids"};
  const auto one_of = [core](const auto& names) {
    return std::find(names.begin(), names.end(), core) != names.end();
  };
  std::string_view want;
  if (avx512f && !one_of(k512))
    want = "SkylakeX";
  else if (avx2 && !one_of(k256))
    want = "Haswell";
  if (want.empty()) return {};
  return ddp::detail::str(
      "OpenBLAS chose its '", core, "' kernels on a CPU with ", avx512f ? "AVX-512" : "AVX2",
      " (its CPU detection did not recognise this CPU, common in VMs): CPU GEMMs run several times "
      "slower. Set OPENBLAS_CORETYPE=",
      want, " in every rank's environment (export it before starting the launcher)");
}

// On first use: OpenBLAS single-threaded, and the warning of blas_core_advice when it applies.
inline void blas_single_threaded_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    ddp::blas::set_single_threaded();
    if (const char* core = ddp::blas::core_name()) {
      const CpuVectorIsa isa = cpu_vector_isa();
      if (std::string advice = blas_core_advice(core, isa.avx2, isa.avx512f); !advice.empty())
        DDP_LOG_WARN(advice);
    }
  });
}

}  // namespace detail

// Single-threaded GEMM (safe to call from inside parallel_for chunks).
template <class T>
void gemm_serial(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                 const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                 std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if constexpr (BuildConfig::with_blas && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
    detail::blas_single_threaded_once();
    constexpr std::int64_t kIntMax = 2147483647;  // CBLAS takes int sizes
    if (m > kIntMax || n > kIntMax || k > kIntMax || lda > kIntMax || ldb > kIntMax ||
        ldc > kIntMax)
      throw ValueError(
          ddp::detail::str("ddp: gemm: sizes m=", m, " n=", n, " k=", k,
                           " exceed CBLAS's 32-bit int; split the batch (smaller --batch-size)"));
    // CBLAS wants lda >= 1 even when a dimension is 0.
    const auto ld = [](std::int64_t x) { return static_cast<int>(std::max<std::int64_t>(x, 1)); };
    ddp::blas::gemm(ta == Trans::Yes, tb == Trans::Yes, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), alpha, a, ld(lda), b, ld(ldb), beta, c, ld(ldc));
  } else {
    detail::gemm_portable(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// GEMM spread over exec's threads: blocks of rows of C (or of columns when M < 2 * threads).
template <class T>
void gemm(const Exec<Cpu>& exec, Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
          T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  const int t = num_threads(exec);
  if (t == 1 || m * n * k < (std::int64_t{1} << 16)) {
    gemm_serial(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else if (m >= 2 * t) {
    parallel_for(exec, m, 1, [&](std::int64_t i0, std::int64_t i1, int) {
      const T* ai = ta == Trans::No ? a + i0 * lda : a + i0;
      gemm_serial(ta, tb, i1 - i0, n, k, alpha, ai, lda, b, ldb, beta, c + i0 * ldc, ldc);
    });
  } else {
    parallel_for(exec, n, 1, [&](std::int64_t j0, std::int64_t j1, int) {
      const T* bj = tb == Trans::No ? b + j0 : b + j0 * ldb;
      gemm_serial(ta, tb, m, j1 - j0, k, alpha, a, lda, bj, ldb, beta, c + j0, ldc);
    });
  }
}

}  // namespace ddp::kernels::cpu
