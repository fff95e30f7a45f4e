// FailureState: "this communicator failed earlier", written once for every backend (tcp, mpi, nccl,
// staged): the first failure's message, kept for good, and the error every later op gets instead of
// running (docs/decisions/0009: a failed communicator stays failed; later ops fail at once, quoting
// the first error).
// SPDX-License-Identifier: MIT
//
// Example: rank 1 died during all_reduce #2; rank 0's next op fails without touching the network
//   with
//   CommError "ddp[rank 0/2]: barrier #3 was not run: this communicator failed earlier: ddp[rank
//     0/2]:
//              all_reduce #2 (F32 x 4) failed: rank 1 closed its connection (process died?) [...]"
// Thread-safe (its own mutex): a backend's issuing threads and its progress or watcher thread may
// all read and write it, with or without the backend's own lock held (the mutex is a leaf: nothing
// is locked under it).
#pragma once

#include <exception>
#include <mutex>
#include <string>
#include <string_view>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm {

class FailureState {
 public:
  // Marks the communicator failed with `msg`, unless it failed before (the first message is kept).
  // True when this call was the first failure.
  bool fail(std::string msg) {
    std::lock_guard lock(mu_);
    if (failed_) return false;
    failed_ = true;
    first_error_ = std::move(msg);
    return true;
  }

  bool failed() const {
    std::lock_guard lock(mu_);
    return failed_;
  }

  // The CommError for the op labelled `label` ("ddp[rank 0/2]: barrier #3"), which is not run
  // because the communicator failed earlier; nullptr while healthy.
  std::exception_ptr not_run(std::string_view label) const {
    std::lock_guard lock(mu_);
    if (!failed_) return nullptr;
    return std::make_exception_ptr(CommError(message(label)));
  }
  // Throws not_run(label)'s CommError, if any.
  void throw_if_failed(std::string_view label) const {
    std::unique_lock lock(mu_);
    if (!failed_) return;
    std::string msg = message(label);
    lock.unlock();
    throw CommError(msg);
  }

 private:
  std::string message(std::string_view label) const {
    return ddp::detail::str(label,
                            " was not run: this communicator failed earlier: ", first_error_);
  }

  mutable std::mutex mu_;  // guards failed_ and first_error_
  bool failed_ = false;
  std::string first_error_;
};

}  // namespace ddp::comm
