// kernels: GEMM (CBLAS and the portable fallback) against a naive triple loop; ThreadPool and parallel_for.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <ddp/config.hpp>
#include <ddp/kernels/cpu/gemm.hpp>
#include <ddp/kernels/cpu/thread_pool.hpp>
#include <ddp/tensor/random.hpp>
#include <ddp/tensor/tensor.hpp>

using ddp::Cpu;
using ddp::Exec;
namespace cpu = ddp::kernels::cpu;
using cpu::Trans;

namespace {

template <class T>
std::vector<T> random_vec(std::size_t n, std::uint64_t seed) {
  auto t = ddp::Tensor<T, Cpu>::empty({static_cast<std::int64_t>(n)});
  ddp::Generator(seed).fill_uniform(t.view(), -1.0, 1.0);
  return {t.data(), t.data() + n};
}

// C = alpha op(A) op(B) + beta C, the obvious way, in double.
template <class T>
std::vector<double> naive(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                          const std::vector<T>& a, std::int64_t lda, const std::vector<T>& b, std::int64_t ldb,
                          double beta, const std::vector<T>& c, std::int64_t ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av =
            ta == Trans::No ? a[static_cast<std::size_t>(i * lda + p)] : a[static_cast<std::size_t>(p * lda + i)];
        const double bv =
            tb == Trans::No ? b[static_cast<std::size_t>(p * ldb + j)] : b[static_cast<std::size_t>(j * ldb + p)];
        s += av * bv;
      }
      auto& o = out[static_cast<std::size_t>(i * ldc + j)];
      o = alpha * s + (beta == 0 ? 0.0 : beta * o);
    }
  return out;
}

template <class T, class G>
void check_gemm(G&& gemm_under_test, double tol) {
  struct Dims {
    std::int64_t m, n, k;
  };
  int bad = 0;
  for (Dims d : {Dims{1, 1, 1}, Dims{7, 5, 3}, Dims{33, 65, 17}, Dims{70, 3, 300}, Dims{2, 129, 257}, Dims{5, 4, 0}}) {
    for (Trans ta : {Trans::No, Trans::Yes})
      for (Trans tb : {Trans::No, Trans::Yes})
        for (double beta : {0.0, 0.5}) {
          const std::int64_t lda = (ta == Trans::No ? d.k : d.m) + 2, ldb = (tb == Trans::No ? d.n : d.k) + 1,
                             ldc = d.n + 3;  // padded leading dimensions
          const auto rows_a = ta == Trans::No ? d.m : d.k, rows_b = tb == Trans::No ? d.k : d.n;
          auto a = random_vec<T>(static_cast<std::size_t>(rows_a * lda + 1), 1);
          auto b = random_vec<T>(static_cast<std::size_t>(rows_b * ldb + 1), 2);
          auto c = random_vec<T>(static_cast<std::size_t>(d.m * ldc), 3);
          const auto want = naive<T>(ta, tb, d.m, d.n, d.k, 1.5, a, lda, b, ldb, beta, c, ldc);
          gemm_under_test(ta, tb, d.m, d.n, d.k, T(1.5), a.data(), lda, b.data(), ldb, T(beta), c.data(), ldc);
          for (std::int64_t i = 0; i < d.m; ++i)
            for (std::int64_t j = 0; j < d.n; ++j) {
              const auto idx = static_cast<std::size_t>(i * ldc + j);
              if (std::abs(c[idx] - want[idx]) > tol * (1 + std::abs(want[idx])) && bad++ < 3)
                FAIL_CHECK("m n k " << d.m << ' ' << d.n << ' ' << d.k << " ta " << int(ta) << " tb " << int(tb)
                                    << " beta " << beta << " at (" << i << ", " << j << "): " << c[idx] << " vs "
                                    << want[idx]);
            }
        }
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_SUITE("kernels") {
  TEST_CASE("gemm_serial (CBLAS when built with it) equals the naive product for every transpose") {
    INFO("BLAS: " << ddp::BuildConfig::with_blas);
    check_gemm<float>(cpu::gemm_serial<float>, 1e-5);
    check_gemm<double>(cpu::gemm_serial<double>, 1e-12);
  }

  TEST_CASE("the portable fallback GEMM equals the naive product for every transpose") {
    check_gemm<float>(cpu::detail::gemm_portable<float>, 1e-5);
    check_gemm<double>(cpu::detail::gemm_portable<double>, 1e-12);
  }

  TEST_CASE("gemm over a 3-thread pool (row split and column split) equals the naive product") {
    cpu::ThreadPool pool(3);
    const Exec<Cpu> exec{.pool = &pool};
    check_gemm<double>([&](auto... args) { cpu::gemm<double>(exec, args...); }, 1e-12);
  }

  TEST_CASE("beta = 0 ignores NaN already in C, as BLAS does") {
    std::vector<float> a{1, 2}, b{3, 4}, c{std::nanf("")};
    cpu::gemm_serial<float>(Trans::No, Trans::No, 1, 1, 2, 1.f, a.data(), 2, b.data(), 1, 0.f, c.data(), 1);
    CHECK(c[0] == 11.f);
    c[0] = std::nanf("");
    cpu::detail::gemm_portable<float>(Trans::No, Trans::No, 1, 1, 2, 1.f, a.data(), 2, b.data(), 1, 0.f, c.data(), 1);
    CHECK(c[0] == 11.f);
  }

  TEST_CASE("parallel_for covers every index once in contiguous chunks; errors reach the caller") {
    cpu::ThreadPool pool(4);
    const Exec<Cpu> exec{.pool = &pool};
    for (std::int64_t n : {1, 3, 4, 1000, 100003}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::atomic<int> chunks{0};
      cpu::parallel_for(exec, n, 1, [&](std::int64_t b, std::int64_t e, int) {
        ++chunks;
        for (std::int64_t i = b; i < e; ++i) ++hits[static_cast<std::size_t>(i)];
      });
      for (auto& h : hits) REQUIRE(h.load() == 1);
      CHECK(chunks.load() == std::min<std::int64_t>(4, n));
    }
    // grain: 10 indices with grain 4 -> 2 chunks
    std::atomic<int> chunks{0};
    cpu::parallel_for(exec, 10, 4, [&](std::int64_t, std::int64_t, int) { ++chunks; });
    CHECK(chunks.load() == 2);
    // nested calls run inline instead of deadlocking
    std::atomic<int> inner{0};
    cpu::parallel_for(exec, 4, 1, [&](std::int64_t, std::int64_t, int) {
      cpu::parallel_for(exec, 8, 1, [&](std::int64_t b, std::int64_t e, int) { inner += static_cast<int>(e - b); });
    });
    CHECK(inner.load() == 32);
    CHECK_THROWS_WITH_AS(cpu::parallel_for(exec, 8, 1,
                                           [&](std::int64_t b, std::int64_t, int) {
                                             if (b >= 4) throw std::runtime_error("chunk failed");
                                           }),
                         "chunk failed", std::runtime_error);
    int after = 0;  // the pool still works after an exception
    cpu::parallel_for(exec, 2, 1, [&](std::int64_t, std::int64_t, int c) {
      if (c == 0) after = 1;
    });
    CHECK(after == 1);
    // without a pool everything runs on the caller as one chunk
    int calls = 0;
    cpu::parallel_for(Exec<Cpu>{}, 100, 1, [&](std::int64_t b, std::int64_t e, int) {
      ++calls;
      CHECK(e - b == 100);
    });
    CHECK(calls == 1);
  }

  TEST_CASE("default_num_threads honours OMP_NUM_THREADS and rejects bad values") {
    CHECK(cpu::default_num_threads("3") == 3);
    CHECK(cpu::default_num_threads(nullptr) >= 1);
    CHECK(cpu::default_num_threads("") >= 1);
    CHECK_THROWS_WITH_AS(cpu::default_num_threads("two"),
                         "ddp: OMP_NUM_THREADS='two' is not a thread count (an integer from 1 to 4096); unset it or "
                         "pass --threads N",
                         ddp::ConfigError);
    CHECK_THROWS_AS(cpu::default_num_threads("0"), ddp::ConfigError);
    CHECK_THROWS_WITH_AS(cpu::ThreadPool(0), "ddp: ThreadPool needs 1 to 4096 threads, got 0; check --threads",
                         ddp::ValueError);
  }
  TEST_CASE("blas_core_advice: a generic OpenBLAS kernel set on an AVX2 / AVX-512 CPU is named with the fix") {
    // OpenBLAS's x86-64 core names (OPENBLAS_CORETYPE values): Prescott is SSE3 only, Haswell and Zen AVX2,
    // SkylakeX, CooperLake and SapphireRapids AVX-512.
    using cpu::detail::blas_core_advice;
    const std::string slow = blas_core_advice("Prescott", true, true);
    CHECK(slow.find("OpenBLAS chose its 'Prescott' kernels on a CPU with AVX-512") != std::string::npos);
    CHECK(slow.find("Set OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
    CHECK(blas_core_advice("Haswell", true, true).find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
    CHECK(blas_core_advice("Prescott", true, false).find("on a CPU with AVX2") != std::string::npos);
    CHECK(blas_core_advice("Sandybridge", true, false).find("OPENBLAS_CORETYPE=Haswell") != std::string::npos);
    CHECK(blas_core_advice("SkylakeX", true, true).empty());
    CHECK(blas_core_advice("SapphireRapids", true, true).empty());
    CHECK(blas_core_advice("Zen", true, true).empty());  // AMD with AVX-512: OpenBLAS's Zen set is its choice
    CHECK(blas_core_advice("Haswell", true, false).empty());
    CHECK(blas_core_advice("Prescott", false, false).empty());  // nothing better to pick
  }
}
