// CUDA embedding lookup (torch.nn.Embedding): y[n] = weight[ids[n]], and the weight gradient by
// token.
// SPDX-License-Identifier: MIT
//
// Same contract as kernels/cpu/embedding.hpp. Forward: one thread per element (n, j) of y (N, C)
// copies weight[ids[n], j]. Backward: instead of racing on dweight's rows (atomicAdd, whose order
// and so last bits vary by run) the positions are sorted by id (CUB's stable radix sort, keys
// limited to the bits of V), and one thread per (token's run, column) sums that token's dy rows in
// position order: the CPU's additions in the CPU's order, so the same bits on every run and as
// the CPU. Unused tokens' dweight rows are zeroed first. A very frequent token (the space in
// character-level text, about a sixth of the batch) makes its threads loop over all its positions.
// Example: ids (2, 0, 2), dy rows (a, b, c): sorted keys (0, 2, 2), positions (1, 0, 2): dweight
// rows 0 = b, 1 = 0, 2 = a + c.
// Token ids are device memory, so the host cannot check them before the launch. The kernels never
// touch memory outside weight/dweight: an id outside [0, V) makes forward write a zero row and
// backward skip the position, and the lowest such position goes to a device word (atomicMin),
// which the host reads back after the launch, waiting for the stream, and throws the CPU's
// ValueError (naming the op, the id and its position). So, unlike the other layers, a call blocks
// until its kernel has run. Args::ids_checked skips the word and the wait; nn::Embedding's backward
// sets it, as its forward checked the same ids, so a training step waits once.
#pragma once

#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ddp/core/cuda_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/kernels/embedding_args.hpp"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

namespace detail {

// For element i of an (N, C) array: its row's id in *id_out, and whether it is in [0, num). A bad
// id's row goes to *bad unless null (lowest wins; column 0 only: one atomic per bad position).
__device__ inline bool embedding_id_ok(const std::int64_t* ids, std::size_t i, std::int64_t c,
                                       std::int64_t num, unsigned long long* bad,
                                       std::int64_t* id_out) {
  const auto row = static_cast<std::int64_t>(i) / c;
  const std::int64_t id = ids[row];
  *id_out = id;
  if (id >= 0 && id < num) return true;
  if (bad != nullptr && static_cast<std::int64_t>(i) % c == 0)
    atomicMin(bad, static_cast<unsigned long long>(row));
  return false;
}

// y[n, j] = weight[ids[n], j]; 0 for a bad id.
template <class T>
struct EmbeddingGather {
  const std::int64_t* ids;
  const T* weight;
  T* y;
  std::int64_t c, num;
  unsigned long long* bad;
  __device__ void operator()(std::size_t i) const {
    std::int64_t id = 0;
    const bool ok = embedding_id_ok(ids, i, c, num, bad, &id);
    y[i] = ok ? weight[id * c + static_cast<std::int64_t>(i) % c] : T(0);
  }
};

// keys[n] = ids[n] when in [0, num), else num (sorted after every token, then skipped); pos[n] = n.
struct EmbeddingSortKeys {
  const std::int64_t* ids;
  std::int64_t* keys;
  std::int64_t* pos;
  std::int64_t num;
  unsigned long long* bad;
  __device__ void operator()(std::size_t i) const {
    std::int64_t id = 0;
    keys[i] = embedding_id_ok(ids, i, 1, num, bad, &id) ? id : num;
    pos[i] = static_cast<std::int64_t>(i);
  }
};

// Element i = (s, j) of the sorted (N, C) order: if s starts the run of token `key` (< num), then
// dweight[key, j] = dy[pos[s], j] + dy[pos[s + 1], j] + ... over the run, in position order (the
// CPU's). Threads of other s return at once.
template <class T>
struct EmbeddingRunSum {
  const std::int64_t* keys;  // sorted ids, (N)
  const std::int64_t* pos;   // their positions, increasing within a run (a stable sort)
  const T* dy;
  T* dweight;
  std::int64_t n, c, num;
  __device__ void operator()(std::size_t i) const {
    const std::int64_t s = static_cast<std::int64_t>(i) / c, j = static_cast<std::int64_t>(i) % c;
    const std::int64_t key = keys[s];
    if (key >= num || (s > 0 && keys[s - 1] == key)) return;
    T acc = T(0);
    for (std::int64_t r = s; r < n && keys[r] == key; ++r) acc += dy[pos[r] * c + j];
    dweight[key * c + j] = acc;
  }
};

// Runs launch(bad) with a device word set to n, then reads it back (waiting for the stream) and
// throws the CPU's ValueError for the first bad id. `checked`: launch(nullptr), no word, no wait.
template <class Launch>
void with_embedding_id_check(const Exec<Cuda>& e, TensorView<const std::int64_t, Cuda> ids,
                             std::int64_t num, std::string_view op, bool checked, Launch launch) {
  if (checked) {
    launch(nullptr);
    return;
  }
  const std::int64_t n = ids.numel();
  const cudaStream_t s = cuda_stream(e);
  const CudaAllocStream on_stream(e);  // the word is reused in the order of e's stream
  Tensor<unsigned long long, Cuda> bad(Shape{1});
  const auto none = static_cast<unsigned long long>(n);
  DDP_CUDA_CHECK(cudaMemcpyAsync(bad.data(), &none, sizeof(none), cudaMemcpyHostToDevice, s));
  launch(bad.data());
  unsigned long long first = none;
  DDP_CUDA_CHECK(cudaMemcpyAsync(&first, bad.data(), sizeof(first), cudaMemcpyDeviceToHost, s));
  DDP_CUDA_CHECK(cudaStreamSynchronize(s));
  if (first < none) {
    std::int64_t id = 0;
    DDP_CUDA_CHECK(cudaMemcpy(&id, ids.data() + first, sizeof(id), cudaMemcpyDeviceToHost));
    throw embedding_id_out_of_range(op, id, static_cast<std::int64_t>(first), ids.shape(), num);
  }
}

}  // namespace detail

template <class T>
void embedding_forward(const Exec<Cuda>& e, const EmbeddingForwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t n = a.ids.dim(0), v = a.weight.dim(0), c = a.weight.dim(1);
  detail::with_embedding_id_check(
      e, a.ids, v, "embedding_forward", a.ids_checked, [&](unsigned long long* bad) {
        for_each_index(e, static_cast<std::size_t>(n * c),
                       detail::EmbeddingGather<T>{.ids = a.ids.data(),
                                                  .weight = a.weight.data(),
                                                  .y = a.y.data(),
                                                  .c = c,
                                                  .num = v,
                                                  .bad = bad});
      });
}

template <class T>
void embedding_backward(const Exec<Cuda>& e, const EmbeddingBackwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t n = a.ids.dim(0), v = a.dweight.dim(0), c = a.dweight.dim(1);
  if (n > 2147483647)
    throw ValueError(
        ddp::detail::str("ddp: embedding_backward: ", n,
                         " token ids exceed the sort's 32-bit count; split the batch"));
  const cudaStream_t s = cuda_stream(e);
  // the sort's buffers are freed while the kernels below may still run
  const CudaAllocStream on_stream(e);
  Tensor<std::int64_t, Cuda> keys(Shape{2, n}), pos(Shape{2, n});  // row 0 unsorted, row 1 sorted
  std::int64_t* keys_in = keys.data();
  std::int64_t* keys_out = keys_in + n;
  std::int64_t* pos_in = pos.data();
  std::int64_t* pos_out = pos_in + n;
  int end_bit = 1;  // keys are in [0, v]: sort only the bits that can be set
  while (end_bit < 63 && (std::int64_t{1} << end_bit) <= v) ++end_bit;
  DDP_CUDA_CHECK(
      cudaMemsetAsync(a.dweight.data(), 0, static_cast<std::size_t>(v * c) * sizeof(T), s));
  detail::with_embedding_id_check(
      e, a.ids, v, "embedding_backward", a.ids_checked, [&](unsigned long long* bad) {
        for_each_index(
            e, static_cast<std::size_t>(n),
            detail::EmbeddingSortKeys{
                .ids = a.ids.data(), .keys = keys_in, .pos = pos_in, .num = v, .bad = bad});
        std::size_t temp_bytes = 0;
        DDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out,
                                                       pos_in, pos_out, static_cast<int>(n), 0,
                                                       end_bit, s));
        Tensor<std::uint8_t, Cuda> temp(
            Shape{static_cast<std::int64_t>(temp_bytes > 0 ? temp_bytes : 1)});
        DDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, keys_in, keys_out,
                                                       pos_in, pos_out, static_cast<int>(n), 0,
                                                       end_bit, s));
        sync_check_after("cub::DeviceRadixSort::SortPairs", s);  // DDP_CUDA_SYNC_CHECK=1 only
        for_each_index(e, static_cast<std::size_t>(n * c),
                       detail::EmbeddingRunSum<T>{.keys = keys_out,
                                                  .pos = pos_out,
                                                  .dy = a.dy.data(),
                                                  .dweight = a.dweight.data(),
                                                  .n = n,
                                                  .c = c,
                                                  .num = v});
      });
}

}  // namespace ddp::kernels::cuda
