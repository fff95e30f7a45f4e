// DDP_NCCL_CHECK: turns a failed NCCL call into a ddp::CommError with NCCL's own error name and its
// last-error text, and the mapping from ddp's DType / ReduceOp to NCCL's enums.
// SPDX-License-Identifier: MIT
//
// Example message:
//   ddp: ncclAllReduce(...) failed: unhandled system error (run with NCCL_DEBUG=INFO for details)
//     [NCCL: socket
//   connect to 10.0.0.2<43117> failed] at nccl_communicator.hpp:211
// ncclInProgress is not a failure: communicators created non-blocking (ours are, so that a hung
// init or collective can be aborted) return it from calls that finish in the background; the
// communicator polls ncclCommGetAsyncError for those instead of using this macro.
#pragma once

#include <nccl.h>

#include <string>

#include "ddp/comm/types.hpp"
#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::nccl {

// "unhandled system error [NCCL: <last error text>]" ; comm may be nullptr (NCCL's process-wide
// last error).
inline std::string error_text(ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += ddp::detail::str(" [NCCL: ", last, ']');
  if (r == ncclSystemError || r == ncclInternalError || r == ncclRemoteError)
    s += "; run with NCCL_DEBUG=INFO for details";
  return s;
}

inline ncclDataType_t datatype_of(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  return ncclUint8;
}

// Avg maps to ncclAvg (NCCL divides floats by pre-multiplying with 1/n and integers after the sum).
inline ncclRedOp_t op_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Product: return ncclProd;
  }
  return ncclSum;
}

}  // namespace ddp::comm::nccl

// Throws CommError naming the call, NCCL's text and the location unless expr returns ncclSuccess.
#define DDP_NCCL_CHECK(expr)                                                                \
  do {                                                                                      \
    if (const ncclResult_t ddp_nccl_rc_ = (expr); ddp_nccl_rc_ != ncclSuccess)              \
      throw ::ddp::CommError(::ddp::detail::str(                                            \
          "ddp: ", #expr, " failed: ", ::ddp::comm::nccl::error_text(ddp_nccl_rc_), " at ", \
          __FILE__, ':', __LINE__));                                                        \
  } while (0)
