// sum_over_ranks: a few host numbers (counts, loss sums) summed over every rank, e.g. evaluation
// metrics.
// SPDX-License-Identifier: MIT
//
//   auto [loss_sum, tokens] = ddp::train::sum_over_ranks(comm, exec, std::array<double, 2>{l, n});
//     // collective
// One all-reduce (Sum) in D's memory, the memory the communicator DDP uses reaches: the host for
// gloo/mpi on the CPU, the GPU for nccl or a staged tcp/mpi (parallel::sum_over_ranks,
// parallel/rank_sum.hpp, does the work). Doubles, so counts up to 2^53 stay exact.
#pragma once

#include <array>
#include <cstddef>
#include <span>

#include "ddp/comm/communicator.hpp"
#include "ddp/parallel/rank_sum.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::train {

template <Device D, std::size_t N>
std::array<double, N> sum_over_ranks(comm::Communicator& comm, Exec<D>& exec,
                                     const std::array<double, N>& values) {
  std::array<double, N> out = values;
  parallel::sum_over_ranks(comm, std::span<double>(out), exec);
  return out;
}

}  // namespace ddp::train
