// CPU sum of squares and scaling over many tensors (clip_grad_norm); the reference for
// kernels/cuda/multi_norm.cuh.
// SPDX-License-Identifier: MIT
//
// How sum_squares_multi works: every tensor is cut into chunks of kSumSquaresChunk elements (the
// last one shorter); chunk c's sum of x^2 is accumulated in double into partial[c] on whichever
// pool thread runs it, and the partials are then added in chunk order on the calling thread. The
// order of additions depends on the tensor sizes only, never on the thread count, so the result is
// the same bits for any pool.
// Example: tensors of 5 and 70,000 elements -> chunks [t0 0..5), [t1 0..65536), [t1 65536..70000).
#pragma once

#include <cstdint>
#include <vector>

#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/elementwise.hpp"
#include "ddp/kernels/fused_args.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

inline constexpr std::int64_t kSumSquaresChunk = std::int64_t{1} << 16;

template <class T>
double sum_squares_multi(const Exec<Cpu>& exec, const MultiTensorArgs<T, Cpu>& a) {
  validate(a);
  struct Chunk {
    const T* x;
    std::int64_t n;
  };
  std::vector<Chunk> chunks;
  for (const TensorPtr<T>& t : a.tensors)
    for (std::int64_t b = 0; b < t.numel; b += kSumSquaresChunk)
      chunks.push_back(
          {t.data + b, t.numel - b < kSumSquaresChunk ? t.numel - b : kSumSquaresChunk});
  std::vector<double> partial(chunks.size(), 0.0);
  parallel_for(exec, static_cast<std::int64_t>(chunks.size()), 1,
               [&](std::int64_t c0, std::int64_t c1, int) {
                 for (std::int64_t c = c0; c < c1; ++c) {
                   const Chunk& ch = chunks[static_cast<std::size_t>(c)];
                   double acc = 0.0;
                   for (std::int64_t i = 0; i < ch.n; ++i)
                     acc += static_cast<double>(ch.x[i]) * static_cast<double>(ch.x[i]);
                   partial[static_cast<std::size_t>(c)] = acc;
                 }
               });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

template <class T>
void scale_multi(const Exec<Cpu>& exec, const MultiScaleArgs<T, Cpu>& a) {
  validate(a);
  for (const TensorPtr<T>& t : a.tensors)
    for_each_index(exec, static_cast<std::size_t>(t.numel),
                   Scale<T>{.alpha = static_cast<T>(a.alpha), .x = t.data});
}

}  // namespace ddp::kernels::cpu
