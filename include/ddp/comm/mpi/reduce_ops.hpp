// mpi::ReduceOps: the MPI_Op for each (dtype, reduce op) the mpi backend hands to MPI's own
// reductions (reduce, reduce_scatter): MPI's built-ins where they do what ours do, MPI_Op_create'd
// ones running comm/reduce.hpp where they do not (bfloat16 and half, which MPI has no type for,
// widened to float; uint8, whose sums must wrap modulo 256 as on the tcp backend and in PyTorch,
// which Open MPI's vectorised uint8 sum does not).
// SPDX-License-Identifier: MIT
#pragma once

#include <mpi.h>

#include <cstddef>

#include "ddp/comm/mpi/mpi_check.hpp"
#include "ddp/comm/reduce.hpp"
#include "ddp/comm/types.hpp"

namespace ddp::comm::mpi {

template <DType D, ReduceOp O>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<std::size_t>(*len), D, O);
}

class ReduceOps {
 public:
  // Needs MPI initialised. The ops live until MPI_Finalize.
  ReduceOps() {
    make<DType::BF16>(bf16_);
    make<DType::F16>(f16_);
    make<DType::U8>(u8_);
  }

  // What MPI reduces `d` values with for `op` (Avg: MPI_SUM, the caller divides).
  MPI_Op of(DType d, ReduceOp op) const {
    const int i = index(op);
    if (d == DType::BF16) return bf16_[i];
    if (d == DType::F16) return f16_[i];
    if (d == DType::U8) return u8_[i];
    constexpr MPI_Op kBuiltin[] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
    return kBuiltin[i];
  }

 private:
  static int index(ReduceOp op) {
    return op == ReduceOp::Min ? 1 : op == ReduceOp::Max ? 2 : op == ReduceOp::Product ? 3 : 0;
  }
  // ops[index(O)] = an MPI_Op running user_reduce<D, O>, for Sum, Min, Max and Product.
  template <DType D>
  static void make(MPI_Op (&ops)[4]) {
    constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product};
    MPI_User_function* const fns[] = {&user_reduce<D, kOps[0]>, &user_reduce<D, kOps[1]>,
                                      &user_reduce<D, kOps[2]>, &user_reduce<D, kOps[3]>};
    for (int k = 0; k < 4; ++k) DDP_MPI_CHECK(MPI_Op_create(fns[k], 1, &ops[index(kOps[k])]));
  }

  MPI_Op bf16_[4] = {}, f16_[4] = {}, u8_[4] = {};
};

}  // namespace ddp::comm::mpi
