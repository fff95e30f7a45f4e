// Checks of every collective against a locally computed reference, for any Communicator: used by the
// tcp unit tests (ranks as threads) and the mpi test (under mpirun).
// SPDX-License-Identifier: MIT
#pragma once

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm_harness.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/comm/reduce.hpp"

namespace ddp::test {

using comm::ReduceOp;

// Element-wise reduction of every rank's data in rank order, then the Avg division.
template <class T>
std::vector<T> reference(const std::vector<std::vector<T>>& all, ReduceOp op) {
  std::vector<T> out = all[0];
  for (std::size_t r = 1; r < all.size(); ++r) comm::reduce_into(out.data(), all[r].data(), out.size(), dtype_of<T>, op);
  if (op == ReduceOp::Avg) comm::divide_by(out.data(), out.size(), dtype_of<T>, static_cast<int>(all.size()));
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Sizes: empty, one element, odd counts not divisible by any world size 2-4 (1001: two or three messages of
// the mpi backend's carried all-reduce for 4- and 8-byte types, the last one partial), one above the
// recursive-doubling threshold (ring; on the mpi backend also above the carry limit at 2 ranks), and (for F32 and BF16, to keep the test short) more than the 1 MiB staging
// buffer and shm slot (tcp/mesh.hpp, shm/collectives.hpp): 3 MiB for F32, just over 1 MiB for BF16, whose
// element-wise conversions make every MiB cost ~3x F32's (most of unit_comm's time under ASan).
template <class T>
std::vector<std::size_t> sizes() {
  std::vector<std::size_t> s{0, 1, 7, 1001, 64 * 1024 / sizeof(T) + 13};
  if (dtype_of<T> == DType::F32) s.push_back((3u << 20) / sizeof(T) + 1);
  if (dtype_of<T> == DType::BF16) s.push_back((1u << 20) / sizeof(T) + 1001);
  return s;
}

constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product};

// Runs every collective on `c` for every size in sizes<T>() with seeded data; returns what differed.
// Every rank of `c` must call it with the same T.
template <class T>
std::vector<std::string> check_collectives(comm::Communicator& c) {
  std::vector<std::string> failures;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  };
  const int n = c.size();
  const int r = c.rank();
  std::uint64_t salt = 0;
  for (std::size_t count : sizes<T>()) {
    const std::string tag = detail::str("n=", n, " ", dtype_name(dtype_of<T>), " count=", count);
    std::vector<std::vector<T>> all;
    auto fresh = [&] {
      ++salt;
      all.clear();
      for (int k = 0; k < n; ++k) all.push_back(test::seeded<T>(k, count, salt));
    };
    for (ReduceOp op : kOps) {  // all_reduce
      fresh();
      std::vector<T> v = all[r];
      c.all_reduce(std::span(v), {.op = op}).wait();
      expect(same_bits(v, reference(all, op)), tag + " all_reduce " + std::string(comm::reduce_op_name(op)));
    }
    for (int root = count > 100000 ? n - 1 : 0; root < n; ++root) {  // broadcast and reduce from every root
      fresh();
      std::vector<T> v = all[r];
      c.broadcast(std::span(v), {.root = root}).wait();
      expect(same_bits(v, all[root]), tag + " broadcast root " + std::to_string(root));
      std::vector<T> w = all[r];
      c.reduce(std::span(w), {.op = ReduceOp::Sum, .root = root}).wait();
      expect(same_bits(w, r == root ? reference(all, ReduceOp::Sum) : all[r]), tag + " reduce root " + std::to_string(root));
    }
    {  // all_gather: each rank contributes `count`
      fresh();
      std::vector<T> out(count * static_cast<std::size_t>(n));
      c.all_gather(std::span<const T>(all[r]), std::span(out)).wait();
      std::vector<T> want;
      for (auto& a : all) want.insert(want.end(), a.begin(), a.end());
      expect(same_bits(out, want), tag + " all_gather");
    }
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {  // reduce_scatter: `count` per rank
      ++salt;
      std::vector<std::vector<T>> big;
      for (int k = 0; k < n; ++k) big.push_back(test::seeded<T>(k, count * static_cast<std::size_t>(n), salt));
      std::vector<T> out(count);
      c.reduce_scatter(std::span<const T>(big[r]), std::span(out), {.op = op}).wait();
      auto full = reference(big, op);
      std::vector<T> want(full.begin() + static_cast<std::ptrdiff_t>(count) * r,
                          full.begin() + static_cast<std::ptrdiff_t>(count) * (r + 1));
      expect(same_bits(out, want), tag + " reduce_scatter " + std::string(comm::reduce_op_name(op)));
    }
    {  // all_to_all: blocks of `count`
      ++salt;
      std::vector<std::vector<T>> big;
      for (int k = 0; k < n; ++k) big.push_back(test::seeded<T>(k, count * static_cast<std::size_t>(n), salt));
      std::vector<T> out(count * static_cast<std::size_t>(n));
      c.all_to_all(std::span<const T>(big[r]), std::span(out)).wait();
      std::vector<T> want;
      for (int k = 0; k < n; ++k)
        want.insert(want.end(), big[k].begin() + static_cast<std::ptrdiff_t>(count) * r,
                    big[k].begin() + static_cast<std::ptrdiff_t>(count) * (r + 1));
      expect(same_bits(out, want), tag + " all_to_all");
    }
    c.barrier().wait();
  }
  return failures;
}

// Every backend raises the same ValueError words for the same mistake (comm/checks.hpp), at the call and
// before anything is sent; returns what differed. Local: no rank waits for another.
inline std::vector<std::string> check_argument_errors(comm::Communicator& c) {
  std::vector<std::string> failures;
  const std::string who = detail::str("ddp[rank ", c.rank(), '/', c.size(), "]: ");
  const std::string backend(c.backend());
  auto expect = [&](const std::string& what, const std::function<void()>& call) {
    try {
      call();
      failures.push_back("no ValueError for: " + what);
    } catch (const ValueError& e) {
      if (e.what() != who + what) failures.push_back(detail::str("got \"", e.what(), "\" instead of \"", who, what, '"'));
    }
  };
  const int n = c.size();
  std::vector<float> v(3), out(3 * static_cast<std::size_t>(n) - 1);
  expect(detail::str("broadcast root ", n, " is out of range [0, ", n, ")"),
         [&] { c.broadcast(std::span(v), {.root = n}); });
  expect(detail::str("reduce root -1 is out of range [0, ", n, ")"), [&] { c.reduce(std::span(v), {.root = -1}); });
  expect(detail::str("cannot send to rank ", c.rank(), ": peers are the other ranks in [0, ", n, ")"),
         [&] { c.send(std::span<const float>(v), c.rank()); });
  expect(detail::str("cannot receive from rank ", n, ": peers are the other ranks in [0, ", n, ")"),
         [&] { c.irecv(std::span(v), n); });
  expect(detail::str("all_gather needs out.size() == size() * in.size() = ", n, " * 3 = ", 3 * n, ", but out has ",
                     3 * n - 1, " elements"),
         [&] { c.all_gather(std::span<const float>(v), std::span(out)); });
  expect(detail::str("reduce_scatter needs in.size() == size() * out.size() = ", n, " * 3 = ", 3 * n, ", but in has ",
                     3 * n - 1, " elements"),
         [&] { c.reduce_scatter(std::span<const float>(out), std::span(v)); });
  if (n > 1)
    expect(detail::str("all_to_all needs in and out of the same size, a multiple of size() = ", n, "; got in 3 and out ",
                       3 * n - 1, " elements"),
           [&] { c.all_to_all(std::span<const float>(v), std::span(out)); });
  // Device memory on a host backend names the backend and the fix. The pointer is never touched.
  TensorView<float, Cuda> device(v.data(), Shape{3});
  expect(detail::str("all_reduce got CUDA device memory, but the ", backend, " backend reaches host memory only; copy "
                     "the tensor to the host (ddp::to<Cpu>), or make the communicator for device memory (--backend nccl, or "
                     "CommOptions::cuda_device)."),
         [&] { c.all_reduce(device); });
  int stream = 0;  // any non-null cudaStream_t
  expect(detail::str("all_reduce got a CUDA stream (.stream), but the ", backend, " backend works on host memory, "
                     "which streams do not order; leave .stream null, or make the communicator for device memory "
                     "(--backend nccl, or CommOptions::cuda_device)."),
         [&] { c.all_reduce(std::span(v), {.stream = &stream}); });
  expect("new_group needs at least one rank", [&] { c.new_group({}); });
  expect(detail::str("new_group needs strictly increasing ranks in [0, ", n, "), got [0, 0]"),
         [&] { c.new_group({0, 0}); });
  return failures;
}

}  // namespace ddp::test
