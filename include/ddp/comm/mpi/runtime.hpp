// mpi::Runtime: who initialises and finalises MPI for the mpi backend
// (comm/mpi/mpi_communicator.hpp); and all_gather_strings, the blocking setup exchange of one
// string per rank.
// SPDX-License-Identifier: MIT
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "ddp/comm/mpi/mpi_check.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

namespace ddp::comm::mpi {

// The process-wide MPI runtime: if nobody initialised MPI, the first use calls MPI_Init_thread
// (asking for MPI_THREAD_MULTIPLE, needing at least MPI_THREAD_SERIALIZED) and MPI_Finalize runs at
// process exit, or MPI_Abort when a timed-out collective broke a communicator (it would hang
// MPI_Finalize).
class Runtime {
 public:
  static Runtime& instance() {
    static Runtime r;
    return r;
  }
  void mark_broken() noexcept { broken_ = true; }
  ~Runtime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!owned_ || finalized) return;
    if (broken_)
      MPI_Abort(MPI_COMM_WORLD, 1);  // a pending collective would hang MPI_Finalize
    else
      MPI_Finalize();
  }

 private:
  Runtime() {
    int inited = 0;
    MPI_Initialized(&inited);
    int provided = 0;
    if (!inited) {
      DDP_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      owned_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
      throw ConfigError(ddp::detail::str(
          "ddp: the mpi backend needs MPI_THREAD_SERIALIZED or better, but MPI provides "
          "level ",
          provided,
          "; call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) "
          "yourself or use --backend tcp."));
  }
  bool owned_ = false;
  bool broken_ = false;
};

// Every rank's `mine`, in rank order (blocking and collective on `comm`: for setup, before any op
// runs).
inline std::vector<std::string> all_gather_strings(MPI_Comm comm, const std::string& mine) {
  int n = 0;
  DDP_MPI_CHECK(MPI_Comm_size(comm, &n));
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(n)), offs(static_cast<std::size_t>(n) + 1, 0);
  DDP_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  for (std::size_t r = 0; r < lens.size(); ++r) offs[r + 1] = offs[r] + lens[r];
  std::string all(static_cast<std::size_t>(offs.back()), '\0');
  DDP_MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(),
                               MPI_CHAR, comm));
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lens.size(); ++r)
    out.push_back(all.substr(static_cast<std::size_t>(offs[r]), static_cast<std::size_t>(lens[r])));
  return out;
}

}  // namespace ddp::comm::mpi
