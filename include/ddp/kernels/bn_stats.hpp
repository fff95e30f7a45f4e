// BatchNorm's per-channel statistics in one pass over x, written once for the GPU's threads and for
// the host emulation that tests them (docs/decisions/0063): the decomposition, the per-thread
// arithmetic, and the merges in their fixed order.
// SPDX-License-Identifier: MIT
//
// x (N, H, W, C) is M = N*H*W rows of C channels, cut as kernels/cuda/batchnorm.cuh launches it:
//   tile     `cols` threads across cols * vec adjacent channels; vec = 16 bytes / sizeof(T) when
//            every pointer is 16-byte aligned and C % vec == 0 (one vector load per thread and
//            row), else 1;
//   chunk    rows_per_chunk consecutive rows; a block (cols, lanes) of kBnBlockThreads threads
//            covers one tile of one chunk, lane r taking rows r, r + lanes, r + 2 lanes, ...;
//   segment  kBnSegment successive rows of one thread, summed in Acc (float for float x) as
//            s1 = sum (x - K), s2 = sum (x - K)^2, K the segment's first value, then turned into
//            moments (n, mean, M2) in double and merged into the thread's.
// Merges are Chan et al.'s (n, mean, M2) merge in double, in a fixed order: segments in row order,
// a pairwise tree over the lanes (lane r takes r + h, h = lanes/2, ..., 1) giving one partial per
// chunk and channel, then the finalize: kBnFinLanes lanes each merge chunks l, l + kBnFinLanes, ...
// in order, then a pairwise tree over those lanes. Deterministic: independent of scheduling.
// Why: the shift K makes the float cancellation independent of |mean| / std (K is within
// sqrt(n - 1) std of the segment's mean, Samuelson), and with S = kBnSegment = 16 rows a float's
// rounding enters the variance at most (3S + 2 sqrt(S)) gamma(S + 2) ~ 6e-5 relatively and the
// mean at most sqrt(S) gamma(S) ~ 4e-6 std (gamma(n) = n u / (1 - n u), u = 2^-24; derivation in
// docs/decisions/0063). Backward sums (g, g xhat) take the same path with plain float segment sums
// flushed into doubles.
// Example: C = 64 floats: vec 4, 16 columns, 16 lanes; M = 200,704 rows -> 784 chunks of 256 rows,
// each thread 16 rows (one segment).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ddp/config.hpp"

namespace ddp::kernels {

// threads of a statistics or apply block (cols * lanes)
inline constexpr int kBnBlockThreads = 256;
// threads across a tile: one warp reads 32 vectors of a row
inline constexpr int kBnMaxCols = 32;
inline constexpr int kBnSegment = 16;  // rows summed in Acc before a double merge
// chunks (blocks along the rows) of a statistics pass
inline constexpr std::int64_t kBnMaxChunks = 1024;
inline constexpr int kBnFinCols = 32, kBnFinLanes = 16;  // finalize block: channels x chunk lanes

// Per-thread accumulator: float for float and narrower (bf16 widens exactly), double for double.
// x is read only through static_cast<BnAcc<T>>, so a storage-only type (bfloat16) works.
template <class T>
using BnAcc = std::conditional_t<(sizeof(T) > sizeof(float)), double, float>;

// Channels per thread when vectorised: one 16-byte load.
template <class T>
inline constexpr int kBnVec = sizeof(T) <= 16 && 16 % sizeof(T) == 0
                                  ? static_cast<int>(16 / sizeof(T))
                                  : 1;

// vec adjacent values of one row, loaded and stored as one 16-byte access when vec = kBnVec<T>.
template <class T, int V>
struct alignas(sizeof(T) * V) BnVec {
  T v[V];
};
template <class T, int V>
DDP_HOST_DEVICE inline BnVec<T, V> bn_load(const T* p) {
  return *reinterpret_cast<const BnVec<T, V>*>(p);
}
template <class T, int V>
DDP_HOST_DEVICE inline void bn_store(T* p, const BnVec<T, V>& v) {
  *reinterpret_cast<BnVec<T, V>*>(p) = v;
}

// Moments of n values: mean and M2 = sum (x - mean)^2 (biased variance M2 / n).
struct BnMoments {
  double n = 0.0, mean = 0.0, m2 = 0.0;
};

// Chan's merge of (nb, mean_b, m2_b) into (na, mean, m2), given wb = nb / (na + nb) (computed once
// when every channel of a thread shares the counts). na = 0 gives mean_b and m2_b exactly.
DDP_HOST_DEVICE inline void bn_merge_into(double& mean, double& m2, double na, double mean_b,
                                          double m2_b, double wb) {
  const double d = mean_b - mean;
  mean += d * wb;
  m2 += m2_b + d * d * na * wb;
}
DDP_HOST_DEVICE inline BnMoments bn_merge(BnMoments a, const BnMoments& b) {
  if (b.n == 0.0) return a;
  const double n = a.n + b.n;
  bn_merge_into(a.mean, a.m2, a.n, b.mean, b.m2, b.n / n);
  a.n = n;
  return a;
}

// How one pass is cut (header comment). Built on the host, read by kernels and emulation alike.
struct BnGeometry {
  std::int64_t rows = 0, c = 0;
  int vec = 1;                  // channels per thread
  int cols = 1;                 // threads across a tile (a power of two <= kBnMaxCols)
  int lanes = kBnBlockThreads;  // threads along the rows: kBnBlockThreads / cols
  std::int64_t tiles = 0;       // tiles across the channels
  std::int64_t chunks = 0, rows_per_chunk = 1;

  // First channel of thread `col` of tile `tile` (>= c: the thread has no channels).
  DDP_HOST_DEVICE std::int64_t channel(std::int64_t tile, int col) const {
    return (tile * cols + col) * static_cast<std::int64_t>(vec);
  }
  DDP_HOST_DEVICE std::int64_t chunk_begin(std::int64_t chunk) const {
    return chunk * rows_per_chunk;
  }
  DDP_HOST_DEVICE std::int64_t chunk_end(std::int64_t chunk) const {
    const std::int64_t e = (chunk + 1) * rows_per_chunk;
    return e < rows ? e : rows;
  }
};

// vec = kBnVec<T> when `aligned` (every pointer of the pass 16-byte aligned) and C divides, else 1.
template <class T>
BnGeometry bn_geometry(std::int64_t rows, std::int64_t c, bool aligned) {
  BnGeometry g;
  g.rows = rows;
  g.c = c;
  g.vec = aligned && c % kBnVec<T> == 0 ? kBnVec<T> : 1;
  const std::int64_t vectors = c / g.vec;
  while (g.cols < kBnMaxCols && g.cols < vectors) g.cols *= 2;
  g.lanes = kBnBlockThreads / g.cols;
  g.tiles = (vectors + g.cols - 1) / g.cols;
  // At least one segment per thread, at most kBnMaxChunks chunks (the finalize merges them).
  const std::int64_t min_rows = static_cast<std::int64_t>(g.lanes) * kBnSegment;
  g.chunks =
      std::clamp<std::int64_t>((rows + min_rows - 1) / min_rows, rows > 0 ? 1 : 0, kBnMaxChunks);
  if (g.chunks > 0) {
    g.rows_per_chunk = (rows + g.chunks - 1) / g.chunks;
    g.chunks = (rows + g.rows_per_chunk - 1) / g.rows_per_chunk;  // no empty chunk at the end
  }
  return g;
}

// Forward, one thread: moments of channels x[0..V) (x at the thread's first channel) over rows
// first, first + step, ... < end, segment by segment.
template <class T, int V>
DDP_HOST_DEVICE void bn_thread_moments(const T* x, std::int64_t c, std::int64_t first,
                                       std::int64_t end, std::int64_t step, BnMoments (&out)[V]) {
  using A = BnAcc<T>;
  double n = 0.0, mean[V], m2[V];
  for (int l = 0; l < V; ++l) mean[l] = m2[l] = 0.0;
  for (std::int64_t m = first; m < end;) {
    const BnVec<T, V> k = bn_load<T, V>(x + m * c);
    A s1[V], s2[V];
    for (int l = 0; l < V; ++l) s1[l] = s2[l] = A(0);  // the first row's x - K is 0
    int ns = 1;
    for (m += step; ns < kBnSegment && m < end; ++ns, m += step) {
      const BnVec<T, V> v = bn_load<T, V>(x + m * c);
      for (int l = 0; l < V; ++l) {
        const A d = static_cast<A>(v.v[l]) - static_cast<A>(k.v[l]);
        s1[l] += d;
        s2[l] += d * d;
      }
    }
    const double nsd = static_cast<double>(ns), inv = 1.0 / nsd, wb = nsd / (n + nsd);
    for (int l = 0; l < V; ++l) {
      const double a1 = static_cast<double>(s1[l]), a2 = static_cast<double>(s2[l]);
      const double sm2 = a2 - a1 * a1 * inv;  // >= 0 in exact arithmetic; rounding may dip below
      bn_merge_into(mean[l], m2[l], n, static_cast<double>(static_cast<A>(k.v[l])) + a1 * inv,
                    sm2 > 0.0 ? sm2 : 0.0, wb);
    }
    n += nsd;
  }
  for (int l = 0; l < V; ++l) out[l] = BnMoments{n, mean[l], m2[l]};
}

// Backward, one thread: sg = sum g and sgx = sum g (x - mean) invstd over the same rows, g = dy, or
// dy * (ymask > 0) when ymask is given; float segments of kBnSegment rows added into doubles.
template <class T, int V>
DDP_HOST_DEVICE void bn_thread_grad_sums(const T* x, const T* dy, const T* ymask,
                                         const BnAcc<T> (&mean)[V], const BnAcc<T> (&invstd)[V],
                                         std::int64_t c, std::int64_t first, std::int64_t end,
                                         std::int64_t step, double (&sg)[V], double (&sgx)[V]) {
  using A = BnAcc<T>;
  for (int l = 0; l < V; ++l) sg[l] = sgx[l] = 0.0;
  for (std::int64_t m = first; m < end;) {
    A s0[V], s1[V];
    for (int l = 0; l < V; ++l) s0[l] = s1[l] = A(0);
    for (int ns = 0; ns < kBnSegment && m < end; ++ns, m += step) {
      const BnVec<T, V> xv = bn_load<T, V>(x + m * c), gv = bn_load<T, V>(dy + m * c);
      BnVec<T, V> mv{};
      if (ymask) mv = bn_load<T, V>(ymask + m * c);
      for (int l = 0; l < V; ++l) {
        A g = static_cast<A>(gv.v[l]);
        if (ymask && !(static_cast<A>(mv.v[l]) > A(0))) g = A(0);
        s0[l] += g;
        s1[l] += g * ((static_cast<A>(xv.v[l]) - mean[l]) * invstd[l]);
      }
    }
    for (int l = 0; l < V; ++l) {
      sg[l] += static_cast<double>(s0[l]);
      sgx[l] += static_cast<double>(s1[l]);
    }
  }
}

// One step of the pairwise tree over lanes (`w` elements apart): lane r < h takes lane r + h. The
// kernels run a level's steps in parallel (a barrier between levels), the emulation in a loop.
DDP_HOST_DEVICE inline void bn_tree_step(BnMoments* s, int r, int h, int w, int e) {
  s[r * w + e] = bn_merge(s[r * w + e], s[(r + h) * w + e]);
}
DDP_HOST_DEVICE inline void bn_tree_step(double* s, int r, int h, int w, int e) {
  s[r * w + e] += s[(r + h) * w + e];
}

// Finalize, one lane: partials (chunks, c) of channel ch merged over chunks lane, lane +
// kBnFinLanes, ... in order.
DDP_HOST_DEVICE inline BnMoments bn_merge_chunks(const BnMoments* partial, std::int64_t chunks,
                                                 std::int64_t c, std::int64_t ch, int lane) {
  BnMoments m;
  for (std::int64_t j = lane; j < chunks; j += kBnFinLanes) m = bn_merge(m, partial[j * c + ch]);
  return m;
}
// The same for the backward's two sums, partial (2, chunks, c).
DDP_HOST_DEVICE inline void bn_add_chunks(const double* partial, std::int64_t chunks,
                                          std::int64_t c, std::int64_t ch, int lane, double& sg,
                                          double& sgx) {
  sg = sgx = 0.0;
  for (std::int64_t j = lane; j < chunks; j += kBnFinLanes) {
    sg += partial[j * c + ch];
    sgx += partial[(chunks + j) * c + ch];
  }
}

}  // namespace ddp::kernels
