// sum_over_ranks: a few host numbers (counts, loss sums) summed over every rank, e.g. evaluation metrics.
// SPDX-License-Identifier: MIT
//
//   auto [loss_sum, tokens] = ddp::train::sum_over_ranks(comm, exec, std::array<double, 2>{l, n});  // collective
// One all-reduce (Sum) in D's memory, the memory the communicator DDP uses reaches: the host for gloo/mpi on the
// CPU, the GPU for nccl or a staged tcp/mpi (the values go up and come back on exec's stream). Doubles, so
// counts up to 2^53 stay exact.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "ddp/comm/communicator.hpp"
#include "ddp/tensor/copy.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::train {

template <Device D, std::size_t N>
std::array<double, N> sum_over_ranks(comm::Communicator& comm, Exec<D>& exec, const std::array<double, N>& values) {
  Tensor<double, Cpu> host(Shape{static_cast<std::int64_t>(N)});
  std::copy(values.begin(), values.end(), host.data());
  if constexpr (std::same_as<D, Cpu>) {
    comm.all_reduce(host.view(), {.op = comm::ReduceOp::Sum}).wait();
  } else {
    Tensor<double, D> dev = to<D>(host.cview(), exec);
    comm.all_reduce(dev.view(), {.op = comm::ReduceOp::Sum, .stream = exec.stream}).wait();
    host = to<Cpu>(dev.cview(), exec);  // ordered after the all-reduce on exec's stream
  }
  std::array<double, N> out;
  std::copy_n(host.data(), N, out.begin());
  return out;
}

}  // namespace ddp::train
