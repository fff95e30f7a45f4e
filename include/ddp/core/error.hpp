// The exception hierarchy. Every error the library raises is a ddp::Error with an actionable
// message: what failed, the observed values, the likely cause, and the variable or flag that fixes
// it.
// SPDX-License-Identifier: MIT
//
//   std::runtime_error
//     ddp::Error            any failure inside ddp (also failed DDP_CHECKs)
//       ConfigError         bad or contradictory configuration: environment, flags, build options
//       ValueError          bad arguments to an API: shapes, ranges, sizes
//       IoError             files: missing, truncated, corrupt, foreign format
//       StoreError          key-value store: connection, protocol
//       CommError           collectives: peer died, mismatched ops, transport failures
//       TimeoutError        a bounded wait ran out (store get/wait, Work::wait, barriers)
//       CudaError           a CUDA/cuBLAS/NCCL call failed; carries the library's own text
//
// TimeoutError derives from Error, not StoreError, because collectives time out too; catch
// TimeoutError for "took too long" whatever the layer.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

#define DDP_DEFINE_ERROR_(Name)                             \
  class Name : public Error {                               \
   public:                                                  \
    explicit Name(const std::string& what) : Error(what) {} \
  }

DDP_DEFINE_ERROR_(ConfigError);
DDP_DEFINE_ERROR_(ValueError);
DDP_DEFINE_ERROR_(IoError);
DDP_DEFINE_ERROR_(StoreError);
DDP_DEFINE_ERROR_(CommError);
DDP_DEFINE_ERROR_(TimeoutError);
DDP_DEFINE_ERROR_(CudaError);

#undef DDP_DEFINE_ERROR_

}  // namespace ddp
