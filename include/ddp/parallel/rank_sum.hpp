// sum_over_ranks: host values summed element-wise over every rank, in place (counts, loss sums,
// state marks).
// SPDX-License-Identifier: MIT
//
//   std::vector<std::int64_t> have = ...;  parallel::sum_over_ranks(comm, std::span(have), exec);
//     // collective
// One all-reduce (Sum) in D's memory, the memory the communicator DDP uses reaches: the host for
// gloo/mpi on the CPU, the GPU for nccl or a staged tcp/mpi. The values are copied into D's memory
// and back (on the CPU a copy of a few numbers; on CUDA ordered on exec's stream), so this code
// names no device. The host waits. train::sum_over_ranks (train/rank_sum.hpp) is the same for a
// fixed array of doubles, returned by value.
#pragma once

#include <cstdint>
#include <span>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::parallel {

// Collective: every rank calls it with the same number of values. A CUDA D needs
// tensor/cuda/copy.hpp (nvcc).
template <Device D, comm::CommElement V>
void sum_over_ranks(comm::Communicator& comm, std::span<V> values, Exec<D>& exec) {
  if (values.empty()) return;
  const Shape shape{static_cast<std::int64_t>(values.size())};
  Tensor<V, D> in_d = to<D>(TensorView<const V, Cpu>(values.data(), shape), exec);
  comm.all_reduce(in_d.view(), {.op = comm::ReduceOp::Sum, .stream = stream_of(exec)}).wait();
  // the host waits for exec's work
  copy(in_d.cview(), TensorView<V, Cpu>(values.data(), shape), exec);
}

}  // namespace ddp::parallel
