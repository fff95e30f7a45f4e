// CPU embedding lookup (torch.nn.Embedding): y[n] = weight[ids[n]], and the weight gradient by
// token.
// SPDX-License-Identifier: MIT
//
// How it works. Forward copies row ids[n] of weight (V, C) into row n of y (N, C), rows split over
// the pool. Backward: dweight = 0, then dweight[ids[n]] += dy[n] for n = 0 .. N-1 in order. Several
// positions may hold the same token, so splitting the positions over threads would race on
// dweight's rows; the pool splits the C columns instead, each thread adding its columns of every
// position in position order: no races, and the same bits for every thread count (and torch's order
// of additions, a serial index_add_ over positions).
// Example: ids (2, 0, 2), dy rows (a, b, c): dweight rows 0 = b, 1 = 0, 2 = a + c.
// Both check every id first (ValueError naming the op, the id and its position: a bad id must not
// read or write outside weight), unless the caller has (Args::ids_checked, set by nn::Embedding).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ddp/kernels/cpu/thread_pool.hpp"
#include "ddp/kernels/embedding_args.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::kernels::cpu {

// Throws embedding_id_out_of_range for the first id of `ids` outside [0, num), naming `who`.
inline void check_embedding_ids(TensorView<const std::int64_t, Cpu> ids, std::int64_t num,
                                std::string_view who) {
  const std::int64_t bad = first_id_out_of_range(ids.data(), ids.numel(), num);
  if (bad >= 0) throw embedding_id_out_of_range(who, ids.data()[bad], bad, ids.shape(), num);
}

template <class T>
void embedding_forward(const Exec<Cpu>& exec, const EmbeddingForwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t n = a.ids.dim(0), v = a.weight.dim(0), c = a.weight.dim(1);
  if (!a.ids_checked) check_embedding_ids(a.ids, v, "embedding_forward");
  parallel_for(exec, n, std::max<std::int64_t>(1, 16384 / c),
               [&](std::int64_t i0, std::int64_t i1, int) {
                 for (std::int64_t i = i0; i < i1; ++i)
                   std::memcpy(a.y.data() + i * c, a.weight.data() + a.ids.data()[i] * c,
                               static_cast<std::size_t>(c) * sizeof(T));
               });
}

template <class T>
void embedding_backward(const Exec<Cpu>& exec, const EmbeddingBackwardArgs<T, Cpu>& a) {
  validate(a);
  const std::int64_t n = a.ids.dim(0), v = a.dweight.dim(0), c = a.dweight.dim(1);
  if (!a.ids_checked) check_embedding_ids(a.ids, v, "embedding_backward");
  const std::int64_t* ids = a.ids.data();
  parallel_for(exec, c, 32, [&](std::int64_t c0, std::int64_t c1, int) {
    T* dw = a.dweight.data();
    for (std::int64_t r = 0; r < v; ++r) std::fill(dw + r * c + c0, dw + r * c + c1, T(0));
    for (std::int64_t i = 0; i < n; ++i) {
      const T* dy = a.dy.data() + i * c;
      T* row = dw + ids[i] * c;
      for (std::int64_t j = c0; j < c1; ++j) row[j] += dy[j];
    }
  });
}

}  // namespace ddp::kernels::cpu
