// Embedding kernels' argument structs, their checks and the bad-id error (torch.nn.Embedding).
// SPDX-License-Identifier: MIT
//
// Kernels<D> (kernels/kernels.hpp) takes these like the Args of kernels/args.hpp, with the same
// validate() words.
#pragma once

#include <cstdint>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/kernels/args.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/shape.hpp"
#include "ddp/tensor/view.hpp"

namespace ddp::kernels {

// torch.nn.Embedding: y[n] = weight[ids[n]]; backward dweight[v] = sum over n with ids[n] == v of
// dy[n]. The kernels check every id (a ValueError naming the op) unless ids_checked says the caller
// already has: nn::Embedding checks host ids itself, to name the module and the position in its (B,
// T) ids, and its backward passes the ids its forward checked (unchanged: the caller keeps them
// alive and untouched until backward). The CPU then scans the ids once per call instead of twice,
// and the CUDA backward skips its read-back and stream synchronisation. A caller that sets the flag
// on unchecked ids gets no error: on the CPU, reads or writes outside weight/dweight; on CUDA, zero
// rows for bad ids in forward and bad positions left out of dweight.
template <class T, Device D>
struct EmbeddingForwardArgs {
  TensorView<const std::int64_t, D> ids;  // (N), each in [0, V)
  TensorView<const T, D> weight;          // (V, C)
  TensorView<T, D> y;                     // (N, C); overwritten
  // every id is known to be in [0, V): the kernel does not check
  bool ids_checked = false;
};

template <class T, Device D>
struct EmbeddingBackwardArgs {
  TensorView<const std::int64_t, D> ids;  // (N), each in [0, V)
  TensorView<const T, D> dy;              // (N, C)
  TensorView<T, D> dweight;               // (V, C); overwritten (rows of unused ids are 0)
  // every id is known to be in [0, V): the kernel does not check
  bool ids_checked = false;
};

template <class T, Device D>
void validate_embedding(const TensorView<const std::int64_t, D>& ids,
                        const TensorView<const T, D>& rows, const char* rows_name,
                        const Shape& weight, const char* op) {
  if (weight.rank() != 2 || weight[0] == 0 || weight[1] == 0)
    throw ValueError(
        detail::str("ddp: ", op, ": weight ", weight, " must be (V, C) with V, C >= 1"));
  if (ids.rank() != 1 || ids.dim(0) == 0)
    throw ValueError(detail::str("ddp: ", op, ": ids ", ids.shape(),
                                 " must be (N) with N >= 1; flatten them first"));
  expect_shape(rows, Shape{ids.dim(0), weight[1]}, rows_name, op);
}

template <class T, Device D>
void validate(const EmbeddingForwardArgs<T, D>& a) {
  validate_embedding(a.ids, TensorView<const T, D>(a.y), "output y", a.weight.shape(),
                     "embedding_forward");
}

template <class T, Device D>
void validate(const EmbeddingBackwardArgs<T, D>& a) {
  validate_embedding(a.ids, a.dy, "output gradient dy", a.dweight.shape(), "embedding_backward");
}

// Index of the first of n host ids outside [0, num), or -1 when all are in range.
inline std::int64_t first_id_out_of_range(const std::int64_t* ids, std::int64_t n,
                                          std::int64_t num) {
  for (std::int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= num) return i;
  return -1;
}

// The error for a bad token id: `who` is the op or the module (Module::where()), `index` the id's
// flat index in ids of shape `ids_shape`, printed as a position in that shape.
inline ValueError embedding_id_out_of_range(std::string_view who, std::int64_t id,
                                            std::int64_t index, const Shape& ids_shape,
                                            std::int64_t num) {
  std::int64_t pos[Shape::kMaxRank] = {};
  for (int d = ids_shape.rank() - 1; d >= 0; --d) {
    pos[d] = index % ids_shape[d];
    index /= ids_shape[d];
  }
  std::string at = "(";
  for (int d = 0; d < ids_shape.rank(); ++d) at += detail::str(d ? ", " : "", pos[d]);
  at += ")";
  return ValueError(detail::str("ddp: ", who, ": token id ", id, " at position ", at, " of ids ",
                                ids_shape, " is out of range [0, ", num,
                                "); ids must be below num_embeddings (", num,
                                "): check the vocabulary size against the data"));
}

// Checks ids that the host can read (D::host_memory) and returns true, for Args::ids_checked;
// device ids are left to the kernel (kernels/cuda/embedding.cuh) and it returns false. `who`, as
// embedding_id_out_of_range.
template <Device D>
bool check_ids_on_host(std::string_view who, TensorView<const std::int64_t, D> ids,
                       std::int64_t num) {
  if constexpr (D::host_memory) {
    const std::int64_t bad = first_id_out_of_range(ids.data(), ids.numel(), num);
    if (bad >= 0) throw embedding_id_out_of_range(who, ids.data()[bad], bad, ids.shape(), num);
    return true;
  } else {
    return false;
  }
}

}  // namespace ddp::kernels
