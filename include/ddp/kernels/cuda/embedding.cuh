// CUDA embedding lookup (torch.nn.Embedding): y[n] = weight[ids[n]], and the weight gradient by token.
// SPDX-License-Identifier: MIT
//
// Same contract as kernels/cpu/embedding.hpp. Forward: one thread per element of y (N, C), a grid-stride loop
// (for_each_index); element (n, j) reads ids[n] and copies weight[ids[n], j]. Backward: dweight = 0 (a memset),
// then one thread per element of dy adds dy[n, j] into dweight[ids[n], j] with atomicAdd, since several positions
// may hold the same token. Float atomics make the order of those additions, and so the last bits of a row whose
// token repeats in the batch, vary from run to run (the CPU adds in position order; docs/ARCHITECTURE.md D48).
// Example: ids (2, 0, 2), dy rows (a, b, c): dweight rows 0 = b, 1 = 0, 2 = a + c (or c + a).
// Token ids: they are device memory here, so the host cannot check them before the launch (the CPU does). The
// kernels never read or write outside weight/dweight: an id outside [0, V) makes forward write a zero row and
// backward skip the position, and the lowest such position is recorded in a device word (atomicMin). After the
// launch the host reads that word back, which waits for the stream, and throws the CPU's ValueError
// (embedding_id_out_of_range, naming the op, the id and its position). Cost: one stream synchronisation per call,
// two per training step (a few microseconds of idle GPU while the host queues the next kernels); unlike the other
// layers these two calls therefore block until their kernel has run. Unverified on a GPU so far.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ddp/core/cuda_check.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/kernels/cuda/launch.cuh"
#include "ddp/tensor/cuda/allocator.hpp"
#include "ddp/tensor/cuda/stream.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::kernels::cuda {

namespace detail {

// For element i of an (N, C) array: its row's id in *id_out, and whether it is in [0, num). A bad id's row goes to
// *bad (lowest wins), recorded by the row's column-0 element only: one atomic per bad position.
__device__ inline bool embedding_id_ok(const std::int64_t* ids, std::size_t i, std::int64_t c, std::int64_t num,
                                       unsigned long long* bad, std::int64_t* id_out) {
  const auto row = static_cast<std::int64_t>(i) / c;
  const std::int64_t id = ids[row];
  *id_out = id;
  if (id >= 0 && id < num) return true;
  if (static_cast<std::int64_t>(i) % c == 0) atomicMin(bad, static_cast<unsigned long long>(row));
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

// dweight[ids[n], j] += dy[n, j]; nothing for a bad id.
template <class T>
struct EmbeddingScatterAdd {
  const std::int64_t* ids;
  const T* dy;
  T* dweight;
  std::int64_t c, num;
  unsigned long long* bad;
  __device__ void operator()(std::size_t i) const {
    std::int64_t id = 0;
    if (embedding_id_ok(ids, i, c, num, bad, &id)) atomicAdd(dweight + id * c + static_cast<std::int64_t>(i) % c, dy[i]);
  }
};

// Runs launch(bad) with a device word set to n, then reads it back (waiting for the stream) and throws the CPU's
// ValueError for the first bad id, if any.
template <class Launch>
void with_embedding_id_check(const Exec<Cuda>& e, TensorView<const std::int64_t, Cuda> ids, std::int64_t num,
                             std::string_view op, Launch launch) {
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
  detail::with_embedding_id_check(e, a.ids, v, "embedding_forward", [&](unsigned long long* bad) {
    for_each_index(e, static_cast<std::size_t>(n * c),
                   detail::EmbeddingGather<T>{
                       .ids = a.ids.data(), .weight = a.weight.data(), .y = a.y.data(), .c = c, .num = v, .bad = bad});
  });
}

template <class T>
void embedding_backward(const Exec<Cuda>& e, const EmbeddingBackwardArgs<T, Cuda>& a) {
  validate(a);
  const std::int64_t n = a.ids.dim(0), v = a.dweight.dim(0), c = a.dweight.dim(1);
  DDP_CUDA_CHECK(cudaMemsetAsync(a.dweight.data(), 0, static_cast<std::size_t>(v * c) * sizeof(T), cuda_stream(e)));
  detail::with_embedding_id_check(e, a.ids, v, "embedding_backward", [&](unsigned long long* bad) {
    for_each_index(e, static_cast<std::size_t>(n * c),
                   detail::EmbeddingScatterAdd<T>{
                       .ids = a.ids.data(), .dy = a.dy.data(), .dweight = a.dweight.data(), .c = c, .num = v, .bad = bad});
  });
}

}  // namespace ddp::kernels::cuda
