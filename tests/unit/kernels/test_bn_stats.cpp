// kernels: BatchNorm's one-pass statistics (kernels/bn_stats.hpp), run on the host in the exact decomposition
// and merge order of kernels/cuda/batchnorm.cuh's kernels, against a two-pass reference in long double.
// SPDX-License-Identifier: MIT
//
// The emulation below is the kernels' bodies with the GPU's parallel loops written as host loops: the same
// BnGeometry, bn_thread_moments / bn_thread_grad_sums per (tile, chunk, column, lane), the same bn_tree_step
// levels over the lanes, the same bn_merge_chunks / bn_add_chunks lanes and tree in the finalize. The bounds
// are the arithmetic's (docs/decisions/0063): with S = kBnSegment rows per float segment and
// gamma(n) = n u / (1 - n u), u = 2^-24,
//   |mean - ref| <= sqrt(S) gamma(S) std + 1e-12 (|mean| + std)            (float segments; double merges)
//   |var - ref|  <= ((3S + 2 sqrt(S)) gamma(S + 2) + 4e-12 (1 + |mean| / std)) var
//   |sum g - ref| <= gamma(S) sum |g|,  |sum g xhat - ref| <= gamma(S + 2) sum |g xhat|   (+ 1e-12 relative)
// Cases: C = 3, 5, 64, 2048; row counts that no chunk or lane divides; a chunk count at kBnMaxChunks; a
// slice one float off 16-byte alignment (scalar path); channels with |mean| / std = 1e3, a constant channel
// (variance exactly 0), and a channel whose outliers sit at segment starts (the shift K far from the mean).
// bf16 inputs (bf16 activations, docs/decisions/0072: the kernels widen each value as they load it, 8 per 16-byte
// vector) against the same long-double references of the widened values, with the same bounds: the float
// arithmetic after the load is the same.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <ddp/core/dtype.hpp>
#include <ddp/kernels/bn_stats.hpp>
#include <ddp/kernels/cpu/kernels.hpp>
#include <ddp/tensor/tensor.hpp>

namespace test_bn_stats {

namespace kn = ddp::kernels;
using kn::BnGeometry;
using kn::BnMoments;

constexpr double kU = 0x1p-24;
constexpr double gamma_n(int n) { return n * kU / (1.0 - n * kU); }

// bn_moments_kernel then bn_finalize_kernel, as loops: per-channel moments.
template <class T, int V>
std::vector<BnMoments> emulate_moments_v(const T* x, const BnGeometry& g) {
  const std::int64_t c = g.c;
  std::vector<BnMoments> partial(static_cast<std::size_t>(g.chunks * c));
  const int w = g.cols * V;
  std::vector<BnMoments> s(static_cast<std::size_t>(kn::kBnBlockThreads * V));
  for (std::int64_t tile = 0; tile < g.tiles; ++tile)
    for (std::int64_t chunk = 0; chunk < g.chunks; ++chunk) {  // one block
      for (int lane = 0; lane < g.lanes; ++lane)
        for (int col = 0; col < g.cols; ++col) {
          const std::int64_t ch0 = g.channel(tile, col);
          BnMoments m[V];
          if (ch0 < c)
            kn::bn_thread_moments<T, V>(x + ch0, c, g.chunk_begin(chunk) + lane, g.chunk_end(chunk), g.lanes, m);
          for (int l = 0; l < V; ++l) s[static_cast<std::size_t>(lane * w + col * V + l)] = m[l];
        }
      for (int h = g.lanes / 2; h > 0; h /= 2)
        for (int lane = 0; lane < h; ++lane)
          for (int col = 0; col < g.cols; ++col)
            for (int l = 0; l < V; ++l) kn::bn_tree_step(s.data(), lane, h, w, col * V + l);
      for (int col = 0; col < g.cols; ++col) {
        const std::int64_t ch0 = g.channel(tile, col);
        if (ch0 < c)
          for (int l = 0; l < V; ++l)
            partial[static_cast<std::size_t>(chunk * c + ch0 + l)] = s[static_cast<std::size_t>(col * V + l)];
      }
    }
  std::vector<BnMoments> out(static_cast<std::size_t>(c));
  std::vector<BnMoments> f(kn::kBnFinCols * kn::kBnFinLanes);
  for (std::int64_t b = 0; b * kn::kBnFinCols < c; ++b) {  // one finalize block
    for (int lane = 0; lane < kn::kBnFinLanes; ++lane)
      for (int col = 0; col < kn::kBnFinCols; ++col) {
        const std::int64_t ch = b * kn::kBnFinCols + col;
        f[static_cast<std::size_t>(lane * kn::kBnFinCols + col)] =
            ch < c ? kn::bn_merge_chunks(partial.data(), g.chunks, c, ch, lane) : BnMoments{};
      }
    for (int h = kn::kBnFinLanes / 2; h > 0; h /= 2)
      for (int lane = 0; lane < h; ++lane)
        for (int col = 0; col < kn::kBnFinCols; ++col) kn::bn_tree_step(f.data(), lane, h, kn::kBnFinCols, col);
    for (int col = 0; col < kn::kBnFinCols && b * kn::kBnFinCols + col < c; ++col)
      out[static_cast<std::size_t>(b * kn::kBnFinCols + col)] = f[static_cast<std::size_t>(col)];
  }
  return out;
}
template <class T>
std::vector<BnMoments> emulate_moments(const T* x, const BnGeometry& g) {
  return g.vec == kn::kBnVec<T> ? emulate_moments_v<T, kn::kBnVec<T>>(x, g) : emulate_moments_v<T, 1>(x, g);
}

// bn_grad_sums_kernel then bn_grad_finalize_kernel's sums, as loops: (sum g, sum g xhat) per channel.
template <class T, int V>
std::vector<double> emulate_grad_sums_v(const T* x, const T* dy, const T* ymask, const float* mean,
                                        const float* invstd, const BnGeometry& g) {
  const std::int64_t c = g.c;
  std::vector<double> partial(static_cast<std::size_t>(2 * g.chunks * c));
  const int w = g.cols * V;
  std::vector<double> s0(static_cast<std::size_t>(kn::kBnBlockThreads * V)), s1(s0.size());
  for (std::int64_t tile = 0; tile < g.tiles; ++tile)
    for (std::int64_t chunk = 0; chunk < g.chunks; ++chunk) {
      for (int lane = 0; lane < g.lanes; ++lane)
        for (int col = 0; col < g.cols; ++col) {
          const std::int64_t ch0 = g.channel(tile, col);
          double sg[V] = {}, sgx[V] = {};
          if (ch0 < c) {
            float mu[V], is[V];
            for (int l = 0; l < V; ++l) {
              mu[l] = mean[ch0 + l];
              is[l] = invstd[ch0 + l];
            }
            kn::bn_thread_grad_sums<T, V>(x + ch0, dy + ch0, ymask ? ymask + ch0 : nullptr, mu, is, c,
                                              g.chunk_begin(chunk) + lane, g.chunk_end(chunk), g.lanes, sg, sgx);
          }
          for (int l = 0; l < V; ++l) {
            s0[static_cast<std::size_t>(lane * w + col * V + l)] = sg[l];
            s1[static_cast<std::size_t>(lane * w + col * V + l)] = sgx[l];
          }
        }
      for (int h = g.lanes / 2; h > 0; h /= 2)
        for (int lane = 0; lane < h; ++lane)
          for (int col = 0; col < g.cols; ++col)
            for (int l = 0; l < V; ++l) {
              kn::bn_tree_step(s0.data(), lane, h, w, col * V + l);
              kn::bn_tree_step(s1.data(), lane, h, w, col * V + l);
            }
      for (int col = 0; col < g.cols; ++col) {
        const std::int64_t ch0 = g.channel(tile, col);
        if (ch0 < c)
          for (int l = 0; l < V; ++l) {
            partial[static_cast<std::size_t>(chunk * c + ch0 + l)] = s0[static_cast<std::size_t>(col * V + l)];
            partial[static_cast<std::size_t>((g.chunks + chunk) * c + ch0 + l)] =
                s1[static_cast<std::size_t>(col * V + l)];
          }
      }
    }
  std::vector<double> out(static_cast<std::size_t>(2 * c));
  std::vector<double> f0(kn::kBnFinCols * kn::kBnFinLanes), f1(f0.size());
  for (std::int64_t b = 0; b * kn::kBnFinCols < c; ++b) {
    for (int lane = 0; lane < kn::kBnFinLanes; ++lane)
      for (int col = 0; col < kn::kBnFinCols; ++col) {
        const std::int64_t ch = b * kn::kBnFinCols + col;
        double a0 = 0.0, a1 = 0.0;
        if (ch < c) kn::bn_add_chunks(partial.data(), g.chunks, c, ch, lane, a0, a1);
        f0[static_cast<std::size_t>(lane * kn::kBnFinCols + col)] = a0;
        f1[static_cast<std::size_t>(lane * kn::kBnFinCols + col)] = a1;
      }
    for (int h = kn::kBnFinLanes / 2; h > 0; h /= 2)
      for (int lane = 0; lane < h; ++lane)
        for (int col = 0; col < kn::kBnFinCols; ++col) {
          kn::bn_tree_step(f0.data(), lane, h, kn::kBnFinCols, col);
          kn::bn_tree_step(f1.data(), lane, h, kn::kBnFinCols, col);
        }
    for (int col = 0; col < kn::kBnFinCols && b * kn::kBnFinCols + col < c; ++col) {
      out[static_cast<std::size_t>(b * kn::kBnFinCols + col)] = f0[static_cast<std::size_t>(col)];
      out[static_cast<std::size_t>(c + b * kn::kBnFinCols + col)] = f1[static_cast<std::size_t>(col)];
    }
  }
  return out;
}

// Input rows x C: channel k % 4 == 0: mean 1e3, std 1; 1: uniform [-1, 1]; 2: constant 7.25 when k < 4
// else N(-3e2, 0.3); 3: N(0, 1) plus +50 on the first row of every segment of g (every 16th row without g),
// so that those segments' shift K is an outlier.
std::vector<float> make_input(std::int64_t rows, std::int64_t c, std::uint64_t seed, const BnGeometry* g = nullptr) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(-1.0, 1.0);
  std::vector<float> x(static_cast<std::size_t>(rows * c));
  for (std::int64_t m = 0; m < rows; ++m)
    for (std::int64_t k = 0; k < c; ++k) {
      double v = 0.0;
      switch (k % 4) {
        case 0: v = 1e3 + nd(rng); break;
        case 1: v = ud(rng); break;
        case 2: v = k < 4 ? 7.25 : -3e2 + 0.3 * nd(rng); break;
        default: {
          const std::int64_t i = g ? (m % g->rows_per_chunk) / g->lanes : m;  // index in the thread's rows
          v = nd(rng) + (i % kn::kBnSegment == 0 ? 50.0 : 0.0);
          break;
        }
      }
      x[static_cast<std::size_t>(m * c + k)] = static_cast<float>(v);
    }
  return x;
}

struct Ref {
  double mean, var;
};
Ref two_pass(const float* x, std::int64_t rows, std::int64_t c, std::int64_t k) {
  long double s = 0.0L;
  for (std::int64_t m = 0; m < rows; ++m) s += x[m * c + k];
  const long double mu = s / rows;
  long double q = 0.0L;
  for (std::int64_t m = 0; m < rows; ++m) q += (x[m * c + k] - mu) * (x[m * c + k] - mu);
  return {static_cast<double>(mu), static_cast<double>(q / rows)};
}

// Checks every channel against the bounds; returns the largest error / bound seen (for the message).
// x: the kernels' input; xf: its values as floats (x itself for float), the reference's.
template <class T>
double check_moments(const T* x, const float* xf, std::int64_t rows, std::int64_t c, const BnGeometry& g) {
  const auto got = emulate_moments(x, g);
  constexpr int S = kn::kBnSegment;
  const double mean_rel = std::sqrt(double(S)) * gamma_n(S);
  const double var_rel = (3.0 * S + 2.0 * std::sqrt(double(S))) * gamma_n(S + 2);
  double worst = 0.0;
  for (std::int64_t k = 0; k < c; ++k) {
    const Ref r = two_pass(xf, rows, c, k);
    const BnMoments& m = got[static_cast<std::size_t>(k)];
    const double sd = std::sqrt(r.var), var = m.m2 / m.n;
    INFO("channel ", k, " of ", c, ": rows ", rows, " vec ", g.vec, " chunks ", g.chunks, "; ref mean ", r.mean,
         " var ", r.var, ", got mean ", m.mean, " var ", var);
    REQUIRE(m.n == double(rows));
    if (r.var == 0.0) {  // a constant channel: the shifted sums are exactly 0
      CHECK(m.mean == r.mean);
      CHECK(var == 0.0);
      continue;
    }
    const double tol_mean = mean_rel * sd + 1e-12 * (std::fabs(r.mean) + sd);
    const double tol_var = (var_rel + 4e-12 * (1.0 + std::fabs(r.mean) / sd)) * r.var;
    CHECK(std::fabs(m.mean - r.mean) <= tol_mean);
    CHECK(std::fabs(var - r.var) <= tol_var);
    worst = std::max({worst, std::fabs(m.mean - r.mean) / tol_mean, std::fabs(var - r.var) / tol_var});
  }
  return worst;
}

TEST_CASE("bn_geometry: vectors only when aligned and C divides; chunks cover the rows, at most kBnMaxChunks") {
  const BnGeometry a = kn::bn_geometry<float>(200704, 64, true);
  CHECK(a.vec == 4);
  CHECK(a.cols == 16);
  CHECK(a.lanes == 16);
  CHECK(a.tiles == 1);
  CHECK(a.chunks == 784);
  CHECK(a.rows_per_chunk == 256);
  CHECK(kn::bn_geometry<float>(1000, 64, false).vec == 1);
  CHECK(kn::bn_geometry<float>(1000, 5, true).vec == 1);
  CHECK(kn::bn_geometry<double>(1000, 64, true).vec == 2);
  const BnGeometry b = kn::bn_geometry<float>(1100003, 3, true);
  CHECK(b.cols == 4);
  CHECK(b.lanes == 64);
  CHECK(b.chunks == kn::kBnMaxChunks);
  CHECK(b.chunk_end(b.chunks - 1) == 1100003);
  CHECK(b.chunk_begin(b.chunks - 1) < 1100003);
  const BnGeometry w = kn::bn_geometry<float>(300, 2048, true);
  CHECK(w.cols == 32);
  CHECK(w.tiles == 16);
  CHECK(w.channel(w.tiles - 1, w.cols - 1) == 2044);
  CHECK(kn::bn_geometry<float>(0, 8, true).chunks == 0);
}

TEST_CASE("one-pass moments in the GPU's decomposition match a two-pass long-double reference") {
  struct Case {
    std::int64_t rows, c;
    bool misalign;
  };
  for (const Case cs : {Case{1100003, 3, false}, Case{4099, 5, false}, Case{20011, 64, false}, Case{20011, 64, true},
                        Case{301, 2048, false}, Case{77, 2048, true}, Case{2, 64, false}}) {
    // An aligned buffer; the slice starts 1 float in when misaligned (then the kernels load scalars).
    const BnGeometry g = kn::bn_geometry<float>(cs.rows, cs.c, !cs.misalign);
    const auto data = make_input(cs.rows + 1, cs.c, 1234 + static_cast<std::uint64_t>(cs.rows), &g);
    std::vector<float> buf(data.size() + 4);
    float* base = buf.data();
    while (reinterpret_cast<std::uintptr_t>(base) % 16 != 0) ++base;
    const float* x = base + (cs.misalign ? 1 : 0);
    std::memcpy(base, data.data(), data.size() * sizeof(float));
    REQUIRE((reinterpret_cast<std::uintptr_t>(x) % 16 == 0) == !cs.misalign);
    CHECK(g.vec == (!cs.misalign && cs.c % 4 == 0 ? 4 : 1));
    const double worst = check_moments(x, x, cs.rows, cs.c, g);
    MESSAGE("rows ", cs.rows, " C ", cs.c, " vec ", g.vec, " chunks ", g.chunks, ": largest error / bound ", worst);
  }
}

TEST_CASE("backward sums in the GPU's decomposition match a long-double reference, with and without the ReLU mask") {
  for (const std::int64_t c : {std::int64_t{5}, std::int64_t{64}, std::int64_t{2048}}) {
    const std::int64_t rows = c == 2048 ? 211 : 9001;
    const auto x = make_input(rows, c, 99);
    std::mt19937_64 rng(7);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<float> dy(x.size()), ymask(x.size()), mean(static_cast<std::size_t>(c)), invstd(mean.size());
    for (auto& v : dy) v = static_cast<float>(nd(rng));
    for (auto& v : ymask) v = static_cast<float>(nd(rng));
    for (std::int64_t k = 0; k < c; ++k) {
      const Ref r = two_pass(x.data(), rows, c, k);
      mean[static_cast<std::size_t>(k)] = static_cast<float>(r.mean);
      invstd[static_cast<std::size_t>(k)] = static_cast<float>(1.0 / std::sqrt(r.var + 1e-5));
    }
    const BnGeometry g = kn::bn_geometry<float>(rows, c, reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0 &&
                                                             reinterpret_cast<std::uintptr_t>(dy.data()) % 16 == 0 &&
                                                             reinterpret_cast<std::uintptr_t>(ymask.data()) % 16 == 0);
    for (const bool masked : {false, true}) {
      const float* mk = masked ? ymask.data() : nullptr;
      const auto got = g.vec == 4
                           ? emulate_grad_sums_v<float, 4>(x.data(), dy.data(), mk, mean.data(), invstd.data(), g)
                           : emulate_grad_sums_v<float, 1>(x.data(), dy.data(), mk, mean.data(), invstd.data(), g);
      constexpr int S = kn::kBnSegment;
      for (std::int64_t k = 0; k < c; ++k) {
        long double sg = 0.0L, sgx = 0.0L, ag = 0.0L, agx = 0.0L;
        for (std::int64_t m = 0; m < rows; ++m) {
          const auto i = static_cast<std::size_t>(m * c + k);
          const long double gv = (mk && !(mk[i] > 0.0f)) ? 0.0L : static_cast<long double>(dy[i]);
          const long double t = gv * (static_cast<long double>(x[i]) - mean[static_cast<std::size_t>(k)]) *
                                invstd[static_cast<std::size_t>(k)];
          sg += gv;
          sgx += t;
          ag += std::fabs(gv);
          agx += std::fabs(t);
        }
        INFO("C ", c, " channel ", k, " masked ", masked, " vec ", g.vec);
        CHECK(std::fabs(got[static_cast<std::size_t>(k)] - static_cast<double>(sg)) <=
              (gamma_n(S) + 1e-12) * static_cast<double>(ag));
        CHECK(std::fabs(got[static_cast<std::size_t>(c + k)] - static_cast<double>(sgx)) <=
              (gamma_n(S + 2) + 1e-12) * static_cast<double>(agx));
      }
    }
  }
}

// bf16 copies of v in a 16-byte aligned buffer, starting `offset` elements in; `widened` receives their values.
struct Bf16Buffer {
  std::vector<ddp::bfloat16> buf;
  const ddp::bfloat16* p = nullptr;
  std::vector<float> widened;
  Bf16Buffer(const std::vector<float>& v, int offset) : buf(v.size() + 16), widened(v.size()) {
    ddp::bfloat16* base = buf.data();
    while (reinterpret_cast<std::uintptr_t>(base) % 16 != 0) ++base;
    base += offset;
    for (std::size_t i = 0; i < v.size(); ++i) {
      base[i] = ddp::bfloat16(v[i]);
      widened[i] = float(base[i]);
    }
    p = base;
  }
};

TEST_CASE("bf16 inputs: moments and backward sums in the GPU's decomposition match long-double references") {
  struct Case {
    std::int64_t rows, c;
    bool misalign;
  };
  for (const Case cs : {Case{4099, 5, false}, Case{20011, 64, false}, Case{20011, 64, true}, Case{77, 2048, false},
                        Case{2, 64, false}}) {
    const BnGeometry g = kn::bn_geometry<ddp::bfloat16>(cs.rows, cs.c, !cs.misalign);
    CHECK(g.vec == (!cs.misalign && cs.c % 8 == 0 ? 8 : 1));  // 8 bf16 values per 16-byte load
    const Bf16Buffer x(make_input(cs.rows, cs.c, 4321 + static_cast<std::uint64_t>(cs.rows), &g), cs.misalign ? 1 : 0);
    REQUIRE((reinterpret_cast<std::uintptr_t>(x.p) % 16 == 0) == !cs.misalign);
    const double worst = check_moments(x.p, x.widened.data(), cs.rows, cs.c, g);
    MESSAGE("bf16: rows ", cs.rows, " C ", cs.c, " vec ", g.vec, ": largest error / bound ", worst);

    std::mt19937_64 rng(11);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<float> dyv(x.widened.size()), maskv(x.widened.size()), mean(static_cast<std::size_t>(cs.c)),
        invstd(mean.size());
    for (auto& v : dyv) v = static_cast<float>(nd(rng));
    for (auto& v : maskv) v = static_cast<float>(nd(rng));
    const Bf16Buffer dy(dyv, cs.misalign ? 1 : 0), ymask(maskv, cs.misalign ? 1 : 0);
    for (std::int64_t k = 0; k < cs.c; ++k) {
      const Ref r = two_pass(x.widened.data(), cs.rows, cs.c, k);
      mean[static_cast<std::size_t>(k)] = static_cast<float>(r.mean);
      invstd[static_cast<std::size_t>(k)] = static_cast<float>(1.0 / std::sqrt(r.var + 1e-5));
    }
    for (const bool masked : {false, true}) {
      const ddp::bfloat16* mk = masked ? ymask.p : nullptr;
      const auto got =
          g.vec == 8 ? emulate_grad_sums_v<ddp::bfloat16, 8>(x.p, dy.p, mk, mean.data(), invstd.data(), g)
                     : emulate_grad_sums_v<ddp::bfloat16, 1>(x.p, dy.p, mk, mean.data(), invstd.data(), g);
      constexpr int S = kn::kBnSegment;
      for (std::int64_t k = 0; k < cs.c; ++k) {
        long double sg = 0.0L, sgx = 0.0L, ag = 0.0L, agx = 0.0L;
        for (std::int64_t m = 0; m < cs.rows; ++m) {
          const auto i = static_cast<std::size_t>(m * cs.c + k);
          const long double gv = (masked && !(ymask.widened[i] > 0.0f)) ? 0.0L : dy.widened[i];
          const long double t = gv * (static_cast<long double>(x.widened[i]) - mean[static_cast<std::size_t>(k)]) *
                                invstd[static_cast<std::size_t>(k)];
          sg += gv;
          sgx += t;
          ag += std::fabs(gv);
          agx += std::fabs(t);
        }
        INFO("bf16: C ", cs.c, " channel ", k, " masked ", masked, " vec ", g.vec);
        CHECK(std::fabs(got[static_cast<std::size_t>(k)] - static_cast<double>(sg)) <=
              (gamma_n(S) + 1e-12) * static_cast<double>(ag));
        CHECK(std::fabs(got[static_cast<std::size_t>(cs.c + k)] - static_cast<double>(sgx)) <=
              (gamma_n(S + 2) + 1e-12) * static_cast<double>(agx));
      }
    }
  }
}

TEST_CASE("batchnorm_forward counts a training batch in num_batches_tracked, once; eval does not") {
  const std::int64_t c = 3;
  ddp::Tensor<float, ddp::Cpu> x(ddp::Shape{2, 2, 2, c}), y(x.shape()), gamma(ddp::Shape{c}), beta(ddp::Shape{c}),
      rm(ddp::Shape{c}), rv(ddp::Shape{c}), sm(ddp::Shape{c}), si(ddp::Shape{c});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = static_cast<float>(i % 5);
  for (std::int64_t k = 0; k < c; ++k) {
    gamma.data()[k] = 1.0f;
    beta.data()[k] = rm.data()[k] = 0.0f;
    rv.data()[k] = 1.0f;
  }
  ddp::Tensor<std::int64_t, ddp::Cpu> count(ddp::Shape{});
  count.data()[0] = 41;
  const ddp::Exec<ddp::Cpu> exec{};
  for (const bool training : {true, false})
    ddp::Kernels<ddp::Cpu>::batchnorm_forward(
        exec, kn::BatchNormForwardArgs<float, ddp::Cpu>{.x = x.cview(), .gamma = gamma.cview(), .beta = beta.cview(),
                                                        .running_mean = rm.view(), .running_var = rv.view(),
                                                        .y = y.view(), .save_mean = sm.view(), .save_invstd = si.view(),
                                                        .training = training, .num_batches_tracked = count.view()});
  CHECK(count.data()[0] == 42);
}

}  // namespace test_bn_stats
