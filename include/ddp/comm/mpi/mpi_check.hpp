// DDP_MPI_CHECK: turns a failed MPI call into a ddp::CommError carrying MPI's own error text, and
// the mapping from ddp's DType to MPI datatypes.
// SPDX-License-Identifier: MIT
#pragma once

#include <mpi.h>

#include <string>

#include "ddp/core/dtype.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::mpi {

inline std::string error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return ddp::detail::str("MPI error ", code);
  return std::string(buf, static_cast<std::size_t>(len));
}

// The MPI datatype that carries `d` (bfloat16/half travel as 16-bit words; reductions on them use
// the custom ops of mpi_communicator.hpp).
inline MPI_Datatype datatype_of(DType d) {
  switch (d) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16: return MPI_UINT16_T;
    case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

}  // namespace ddp::comm::mpi

// Throws CommError naming the call, MPI's text and the location when expr does not return
// MPI_SUCCESS.
#define DDP_MPI_CHECK(expr)                                                               \
  do {                                                                                    \
    if (const int ddp_mpi_rc_ = (expr); ddp_mpi_rc_ != MPI_SUCCESS)                       \
      throw ::ddp::CommError(::ddp::detail::str(                                          \
          "ddp: ", #expr, " failed: ", ::ddp::comm::mpi::error_text(ddp_mpi_rc_), " at ", \
          __FILE__, ':', __LINE__));                                                      \
  } while (0)
