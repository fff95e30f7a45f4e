// The multi-tensor launch shared by the CUDA optimizer and norm kernels: many tensors, one kernel
// launch.
// SPDX-License-Identifier: MIT
//
// How it works. The tensors' descriptors (any struct with a `numel` member) travel inside the
// kernel's parameter, a __grid_constant__ struct holding a MultiTensorTable of up to kMax
// descriptors, so nothing is uploaded and the host never waits (kernel parameters may be up to 32
// KiB since CUDA 12.1 on Volta and newer; kMax is chosen per kernel so that the table fits). Each
// tensor is cut into chunks of `chunk` elements, one block per chunk; block b finds its tensor by
// binary search in the prefix table block_begin (MultiTensorTable::find) and works on [chunk_begin,
// chunk_end). More tensors than fit, or more blocks than one grid takes, are sent in several
// launches (for_each_multi_tensor_launch). Empty tensors are skipped.
// Example: ResNet-50 (161 tensors, 25.6 M elements) at 16 Ki elements per chunk -> one launch of
//   ~1,650
// blocks instead of 161 launches, most of them too small to fill an H100.
#pragma once

#include <cstdint>
#include <span>

namespace ddp::kernels::cuda {

template <class Desc, int kMax>
struct MultiTensorTable {
  Desc t[kMax];
  std::int32_t block_begin[kMax + 1];  // tensor i owns blocks [block_begin[i], block_begin[i + 1])
  int count;

  // The tensor that block `blk` of this launch works on.
  __device__ int find(std::int32_t blk) const {
    int lo = 0, hi = count;  // invariant: block_begin[lo] <= blk < block_begin[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (block_begin[mid] <= blk)
        lo = mid;
      else
        hi = mid;
    }
    return lo;
  }
  std::int32_t blocks() const { return count == 0 ? 0 : block_begin[count]; }
};

// Fills `table` with the descriptors of `tensors` in order and calls launch() (which launches the
// kernel over table.blocks() blocks) each time it is full and once at the end; table.count is 0
// again afterwards.
template <class Desc, int kMax, class Launch>
void for_each_multi_tensor_launch(std::span<const Desc> tensors, std::int64_t chunk,
                                  MultiTensorTable<Desc, kMax>& table, Launch&& launch) {
  constexpr std::int64_t kMaxBlocksPerLaunch = 2147483647 - 65536;
  auto flush = [&] {
    if (table.count == 0) return;
    launch();
    table.count = 0;
  };
  table.count = 0;
  for (const Desc& d : tensors) {
    if (d.numel == 0) continue;
    const std::int64_t blocks = (d.numel + chunk - 1) / chunk;
    if (table.count == kMax ||
        (table.count > 0 && table.block_begin[table.count] + blocks > kMaxBlocksPerLaunch))
      flush();
    if (table.count == 0) table.block_begin[0] = 0;
    table.t[table.count] = d;
    table.block_begin[table.count + 1] =
        static_cast<std::int32_t>(table.block_begin[table.count] + blocks);
    ++table.count;
  }
  flush();
}

}  // namespace ddp::kernels::cuda
