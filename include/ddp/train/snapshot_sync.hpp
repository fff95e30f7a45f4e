// Snapshot distribution without a shared filesystem: rank 0 reads the file, every rank receives its
// bytes.
// SPDX-License-Identifier: MIT
//
//   auto bytes = ddp::train::read_and_broadcast(*comm, "snapshot.safetensors");   // collective
//   if (!bytes.empty()) info = ddp::train::load_snapshot_bytes<float>(bytes, net, opt, path);
//   auto bytes = ddp::train::read_and_broadcast(*comm, path, cuda_exec);  // nccl: staged through
//     the GPU
// How it works: rank 0 reads the whole file (or nothing when it does not exist), broadcasts the
// length as one int64, then, when non-zero, the bytes. Other ranks never touch the filesystem
// (docs/decisions/0010). The broadcasts go through parallel::Broadcaster<D>: on the CPU they are
// the communicator's host broadcasts; with an Exec<Cuda> (--backend nccl, which moves device memory
// only) the values are staged through a device buffer on the exec's stream, and that version needs
// nvcc (parallel/cuda/transport.cuh). A file that exists but cannot be read is an IoError on rank
// 0; the other ranks then fail their broadcast with a CommError within the timeout
// (docs/decisions/0009), so no rank hangs. So is a path that is not a regular file (a directory)
// and an empty file: an empty snapshot was cut short, and treating it as "no snapshot" would start
// from scratch and let the next save_snapshot rotate it over the good `<path>.prev`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/parallel/transport.hpp"
#include "ddp/tensor/device.hpp"

namespace ddp::train {

// Collective over `comm`. Returns the file's bytes on every rank, or an empty vector when rank 0
// has no file. `exec` says which memory the broadcasts use (see the file comment); the host waits
// for them.
template <Device D = Cpu>
std::vector<std::uint8_t> read_and_broadcast(comm::Communicator& comm, const std::string& path,
                                             const Exec<D>& exec = {}) {
  std::vector<std::uint8_t> bytes;
  if (comm.rank() == 0 && std::filesystem::exists(path)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
      throw IoError(
          ddp::detail::str("ddp: snapshot ", ddp::detail::quoted(path),
                           " is not a regular file (a directory?); check the path given to the "
                           "program's snapshot flag"));
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw IoError(ddp::detail::str("ddp: cannot read snapshot ", ddp::detail::quoted(path),
                                     "; check its permissions or remove it to start from scratch"));
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (bytes.empty())
      throw IoError(ddp::detail::str("ddp: snapshot ", ddp::detail::quoted(path),
                                     " is empty (0 bytes): it was cut short. Restore ",
                                     ddp::detail::quoted(path + ".prev"),
                                     " (the snapshot before it) if there is one, or delete ",
                                     ddp::detail::quoted(path), " to start from scratch."));
  }
  parallel::Broadcaster<D> bcast(comm);
  std::int64_t n = static_cast<std::int64_t>(bytes.size());
  bcast.broadcast_host(std::span<std::int64_t>(&n, 1), exec);
  if (n == 0) return {};
  bytes.resize(static_cast<std::size_t>(n));
  bcast.broadcast_host(std::span<std::uint8_t>(bytes), exec);
  return bytes;
}

}  // namespace ddp::train
