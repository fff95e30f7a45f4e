// Test helpers for the comm layer: run one function per rank on threads over a HashStore, and seeded data.
// SPDX-License-Identifier: MIT
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/tcp/tcp_communicator.hpp"
#include "ddp/store/hash_store.hpp"

namespace ddp::test {

// Runs body(rank, store) for ranks 0..n-1, each on its own thread, over one HashStore. Returns each rank's
// exception (nullptr on success).
inline std::vector<std::exception_ptr> run_threads(int n, const std::function<void(int, store::Store&)>& body) {
  store::HashStore store(std::chrono::seconds(5));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, store);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// The launch info of rank r of n on this host (what a TcpCommunicator in a thread-per-rank test gets).
inline env::LaunchInfo local_rank_info(int r, int n) {
  return env::LaunchInfo{.rank = r, .world_size = n, .master_addr = "127.0.0.1"};
}

// Runs body(comm) for ranks 0..n-1, each on its own thread with its own TcpCommunicator over one
// HashStore. Returns each rank's exception (nullptr on success); construction failures count too.
inline std::vector<std::exception_ptr> run_ranks(int n, const std::function<void(comm::TcpCommunicator&)>& body,
                                                 comm::CommOptions opts = {.timeout = std::chrono::seconds(5)}) {
  return run_threads(n, [&](int r, store::Store& store) {
    comm::TcpCommunicator c(local_rank_info(r, n), store, opts);
    body(c);
  });
}

inline std::string message(const std::exception_ptr& e) {
  if (!e) return "(no error)";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "(unknown)";
}

// Small integers, so that every reduction is exact in every dtype and results compare bit for bit.
template <class T>
std::vector<T> seeded(int rank, std::size_t count, std::uint64_t salt) {
  std::mt19937_64 gen(salt * 7919u + static_cast<std::uint64_t>(rank) * 104729u + 17u);
  std::vector<T> v(count);
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, std::uint8_t>) {
      x = static_cast<T>(gen() % 256);
    } else {
      const int i = static_cast<int>(gen() % 9) - 4;  // -4..4
      if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, half>) x = T(static_cast<float>(i));
      else x = static_cast<T>(i);
    }
  }
  return v;
}

}  // namespace ddp::test
