// Seeded, counter-based random numbers (Philox4x32-10) with independent streams per (seed, rank,
// stream).
// SPDX-License-Identifier: MIT
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) is a
// bijection of a 128-bit counter under a 64-bit key (ten rounds of two 32x32->64 multiplies, xors
// and a Weyl key bump). No hidden state: block b of a stream is philox(counter, key) with
//   key     = (seed & 0xffffffff, seed >> 32)
//   counter = (b & 0xffffffff, b >> 32, rank, stream)
// so no two ranks' or streams' sequences overlap, whatever the number of draws. Each block gives
// four 32-bit words w[0..3]. A fill of n elements from block offset o gives element i word w[i % 4]
// of block o + i / 4, then advances the offset by ceil(n / 4):
//   uniform(lo, hi):  u = (w + 0.5) / 2^32 in (0, 1), computed in double;  x = lo + (hi - lo) * u
//   normal(mean, sd): Box-Muller on the word pairs (w0, w1) and (w2, w3) of a block:
//                     r = sqrt(-2 ln u(w0)), x0 = r cos(2 pi u(w1)), x1 = r sin(2 pi u(w1));
//                     x = mean + sd * x
// The integer part is exact; glibc's and CUDA's log, sqrt, cos, sin are within 1 ulp of double,
// so the float results are identical across runs, thread counts and platforms except in
// (astronomically rare) double-rounding cases. Random123's test vectors are pinned in
// test_random.cpp.
// Example: Generator(42, /*rank*/1, kStreamInit).fill_uniform(v /*6 elements*/, 0, 1) draws
// blocks 0 and 1 of counter (., ., 1, 0) under key (42, 0), uses words 0..3 of block 0 and 0..1 of
// block 1, and leaves offset() == 2.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <numbers>
#include <utility>

#include "ddp/config.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp {

// c (the counter) becomes the four output words under key (k0, k1). Plain arrays: std::array's
// operator[] is host-only for nvcc.
DDP_HOST_DEVICE inline void philox4x32_10_inplace(std::uint32_t (&c)[4], std::uint32_t k0,
                                                  std::uint32_t k1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  // Weyl key increments (golden ratio, sqrt 3)
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    const std::uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += kW0;
    k1 += kW1;
  }
}

// Host convenience form.
inline std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> ctr,
                                                  std::array<std::uint32_t, 2> key) {
  std::uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
  philox4x32_10_inplace(c, key[0], key[1]);
  return {c[0], c[1], c[2], c[3]};
}

// Stream ids: independent sequences for the same (seed, rank). Users may add their own above 255.
inline constexpr std::uint32_t kStreamInit = 0;     // parameter initialisation
inline constexpr std::uint32_t kStreamData = 1;     // synthetic data, augmentation
inline constexpr std::uint32_t kStreamShuffle = 2;  // sampler permutations
inline constexpr std::uint32_t kStreamDropout = 3;

// Everything needed to resume a generator exactly (stored in snapshots).
struct RngState {
  std::uint64_t seed = 0;
  std::uint32_t rank = 0;
  std::uint32_t stream = 0;
  std::uint64_t offset = 0;  // next unused block
  friend bool operator==(const RngState&, const RngState&) = default;
};

// Not thread-safe: one Generator per thread of use (they are cheap: four integers).
class Generator {
 public:
  explicit Generator(std::uint64_t seed, std::uint32_t rank = 0, std::uint32_t stream = kStreamInit)
      : state_{.seed = seed, .rank = rank, .stream = stream, .offset = 0} {}
  explicit Generator(const RngState& s) : state_(s) {}

  const RngState& state() const noexcept { return state_; }
  std::uint64_t offset() const noexcept { return state_.offset; }
  void set_offset(std::uint64_t blocks) noexcept { state_.offset = blocks; }

  // Block b of this stream (does not advance).
  std::array<std::uint32_t, 4> block(std::uint64_t b) const {
    return philox4x32_10(
        {static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32), state_.rank,
         state_.stream},
        {static_cast<std::uint32_t>(state_.seed), static_cast<std::uint32_t>(state_.seed >> 32)});
  }
  // 64 random bits from words 0 and 1 of the next block (consumes one block).
  std::uint64_t next_u64() {
    const auto w = block(state_.offset++);
    return static_cast<std::uint64_t>(w[0]) | (static_cast<std::uint64_t>(w[1]) << 32);
  }
  // Uniform integer in [0, n) without modulo bias: values below 2^64 mod n are rejected, so every
  // residue is hit by exactly floor(2^64 / n) accepted values. Consumes one block per attempt.
  std::uint64_t uniform_int(std::uint64_t n) {
    if (n <= 1) return 0;
    const std::uint64_t threshold = (0 - n) % n;
    for (;;) {
      const std::uint64_t x = next_u64();
      if (x >= threshold) return x % n;
    }
  }

  static double to_unit(std::uint32_t w) noexcept {
    return (static_cast<double>(w) + 0.5) * 0x1p-32;
  }

  template <class T>
  void fill_uniform(TensorView<T, Cpu> v, double lo, double hi) {
    const std::int64_t n = v.numel();
    for (std::int64_t i = 0; i < n; i += 4) {
      const auto w = block(state_.offset + static_cast<std::uint64_t>(i / 4));
      for (std::int64_t j = 0; j < 4 && i + j < n; ++j)
        v.data()[i + j] = static_cast<T>(lo + (hi - lo) * to_unit(w[static_cast<std::size_t>(j)]));
    }
    state_.offset += static_cast<std::uint64_t>((n + 3) / 4);
  }

  template <class T>
  void fill_normal(TensorView<T, Cpu> v, double mean, double stddev) {
    const std::int64_t n = v.numel();
    for (std::int64_t i = 0; i < n; i += 4) {
      const auto w = block(state_.offset + static_cast<std::uint64_t>(i / 4));
      double z[4];
      for (int pair = 0; pair < 2; ++pair) {
        const double r = std::sqrt(-2.0 * std::log(to_unit(w[2 * pair])));
        const double theta = 2.0 * std::numbers::pi * to_unit(w[2 * pair + 1]);
        z[2 * pair] = r * std::cos(theta);
        z[2 * pair + 1] = r * std::sin(theta);
      }
      for (std::int64_t j = 0; j < 4 && i + j < n; ++j)
        v.data()[i + j] = static_cast<T>(mean + stddev * z[j]);
    }
    state_.offset += static_cast<std::uint64_t>((n + 3) / 4);
  }

 private:
  RngState state_;
};

// ---- The process-wide default generator (torch.default_generator's role) ----
// Layers draw their default initialisation from it when constructed (docs/decisions/0064), so a
// model built twice after the same manual_seed(s) is bit-identical. It is Generator(seed, rank 0,
// kStreamInit). Before any manual_seed its seed is kDefaultSeed, libtorch's default_rng_seed_val
// (Python's torch reseeds at random at import), so an unseeded program is reproducible. Ranks may
// differ in seed: DDP broadcasts rank 0's parameters. Thread-safe: each use holds one process-wide
// mutex; concurrent threads get disjoint draws in an unspecified order (build a model on one
// thread when its numbers matter).
inline constexpr std::uint64_t kDefaultSeed = 67280421310721ull;

namespace detail {
struct DefaultGenerator {
  std::mutex mutex;
  std::uint64_t initial_seed = kDefaultSeed;
  Generator gen{kDefaultSeed, 0, kStreamInit};
};
inline DefaultGenerator& default_generator() {
  static DefaultGenerator g;  // one per process (an inline function's static), created on first use
  return g;
}
}  // namespace detail

// torch.manual_seed: the default generator restarts at offset 0 of Generator(seed, 0, kStreamInit).
inline void manual_seed(std::uint64_t seed) {
  detail::DefaultGenerator& d = detail::default_generator();
  const std::lock_guard lock(d.mutex);
  d.initial_seed = seed;
  d.gen = Generator(seed, 0, kStreamInit);
}

// The default generator's seed: the last manual_seed's, else kDefaultSeed (torch.initial_seed).
inline std::uint64_t initial_seed() {
  detail::DefaultGenerator& d = detail::default_generator();
  const std::lock_guard lock(d.mutex);
  return d.initial_seed;
}

// f(gen), the default generator held locked for the call (f must not call manual_seed and the
// like: the mutex is not recursive).
template <class F>
decltype(auto) with_default_generator(F&& f) {
  detail::DefaultGenerator& d = detail::default_generator();
  const std::lock_guard lock(d.mutex);
  return std::forward<F>(f)(d.gen);
}

}  // namespace ddp
