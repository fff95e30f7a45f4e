// The tcp backend's shared-memory path (all ranks on one host): every collective against the reference
// with shm on and off, mismatches and timeouts reported as on the socket path, nothing left in /dev/shm.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <latch>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "collective_checks.hpp"
#include "comm_harness.hpp"
#include "ddp/comm/shm/collectives.hpp"
#include "ddp/comm/shm/segment.hpp"

using namespace ddp;
using namespace std::chrono_literals;

namespace {

// The segments this process created ("/ddp-<pid>-<nonce>", shm/segment.hpp): other tests running beside this
// one (mpirun jobs) create and unlink their own.
std::set<std::string> shm_entries() {
  const std::string mine = ddp::detail::str("ddp-", ::getpid(), '-');
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind(mine, 0) == 0) out.insert(e.path().filename().string());
  return out;
}

template <class T>
std::vector<std::string> check_all(int n, bool shm) {
  std::vector<std::string> failures;
  std::mutex mu;
  auto errors = test::run_ranks(n, [&](comm::TcpCommunicator& c) {
    if (c.uses_shm() != (shm && n > 1)) throw std::runtime_error("uses_shm() is not what was asked for");
    auto f = test::check_collectives<T>(c);
    std::lock_guard lock(mu);
    for (auto& x : f) failures.push_back(ddp::detail::str("rank ", c.rank(), ": ", x));
  }, {.timeout = 10s, .shm = shm});
  for (const auto& e : errors)
    if (e) failures.push_back(test::message(e));
  return failures;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE_TEMPLATE("tcp shm: every collective matches the reference for world sizes 2-4, with shm on and off", T,
                     float, bfloat16, std::int32_t, std::uint8_t) {
    const auto before = shm_entries();
    for (bool shm : {true, false})
      for (int n = 2; n <= 4; ++n) {
        CAPTURE(n);
        CAPTURE(shm);
        for (const auto& f : check_all<T>(n, shm)) FAIL_CHECK(f);
      }
    CHECK(shm_entries() == before);  // every segment was unlinked
  }

  TEST_CASE("tcp shm: ops above shm::kStreamBytes (streaming copy-out) at an unaligned address are exact") {
    const std::size_t n = comm::shm::kStreamBytes / sizeof(float) + 1001;  // several slots and a tail
    auto errors = test::run_ranks(3, [&](comm::TcpCommunicator& c) {
      REQUIRE(c.uses_shm());
      std::vector<std::vector<float>> all;
      for (int k = 0; k < 3; ++k) all.push_back(test::seeded<float>(k, n, 99));
      std::vector<float> buf(n + 1);  // data at buf + 1: 4 bytes past a 16-byte boundary
      std::copy(all[static_cast<std::size_t>(c.rank())].begin(), all[static_cast<std::size_t>(c.rank())].end(), buf.begin() + 1);
      c.all_reduce(std::span(buf).subspan(1)).wait();
      CHECK(test::same_bits(std::vector<float>(buf.begin() + 1, buf.end()), test::reference(all, comm::ReduceOp::Sum)));
      std::vector<float> b = all[static_cast<std::size_t>(c.rank())];
      c.broadcast(std::span(b), {.root = 2}).wait();
      CHECK(test::same_bits(b, all[2]));
      std::vector<float> out(3 * n + 1);
      c.all_gather(std::span<const float>(all[static_cast<std::size_t>(c.rank())]), std::span(out).subspan(1)).wait();
      std::vector<float> want;
      for (auto& a : all) want.insert(want.end(), a.begin(), a.end());
      CHECK(test::same_bits(std::vector<float>(out.begin() + 1, out.end()), want));
    }, {.timeout = 20s});
    for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
  }

  TEST_CASE("tcp shm: the host identity is hostname/boot id") {
    const std::string id = comm::shm::Segment::host_identity();
    CHECK(id.find('/') != std::string::npos);
    CHECK(id.size() > 30);  // a boot id is 36 characters
  }

  TEST_CASE("tcp shm: all_reduce on one rank and broadcast on the other fail on both, naming both ops") {
    const auto start = std::chrono::steady_clock::now();
    auto errors = test::run_ranks(2, [](comm::TcpCommunicator& c) {
      REQUIRE(c.uses_shm());
      std::vector<float> v(4, 1.0f);
      if (c.rank() == 0) c.all_reduce(std::span(v)).wait();
      else c.broadcast(std::span(v), {.root = 0}).wait();
    }, {.timeout = 2s, .shutdown_timeout = 2s});
    CHECK(std::chrono::steady_clock::now() - start < 1500ms);
    const std::string rank1 =
        "ddp[rank 1/2]: broadcast #1 (F32 x 4, root 0) does not match rank 0, which ran all_reduce #1 (F32 x 4, sum) "
        "at this point. Every rank must call the same collectives in the same order with the same dtype, count, "
        "root and op.";
    CHECK_THROWS_WITH_AS(std::rethrow_exception(errors[1]), rank1.c_str(), CommError);
    CHECK_THROWS_WITH_AS(std::rethrow_exception(errors[0]),
                         ("ddp[rank 0/2]: all_reduce #1 (F32 x 4) failed: rank 1 reported: " + rank1).c_str(), CommError);
  }

  TEST_CASE("tcp shm: a shm collective against a socket one (reduce) is a mismatch, not a hang") {
    const auto start = std::chrono::steady_clock::now();
    auto errors = test::run_ranks(3, [](comm::TcpCommunicator& c) {
      std::vector<float> v(1000, 1.0f);
      if (c.rank() == 2) c.reduce(std::span(v), {.root = 2}).wait();
      else c.all_reduce(std::span(v)).wait();
    }, {.timeout = 3s, .shutdown_timeout = 2s});
    CHECK(std::chrono::steady_clock::now() - start < 2500ms);
    for (const auto& e : errors) CHECK(e);
    const std::string e0 = test::message(errors[0]);
    CHECK_MESSAGE(e0.find("which ran reduce #1 (F32 x 1000") != std::string::npos, e0);
  }

  TEST_CASE("tcp shm: a timeout names the rank that never reached the op") {
    std::latch others_done(1);
    auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      if (c.rank() == 1) {
        others_done.wait();
        return;
      }
      std::vector<float> v(4, 1.0f);
      auto w = c.all_reduce(std::span(v), {.timeout = 300ms});
      try {
        w.wait();
      } catch (...) {
        others_done.count_down();
        throw;
      }
    }, {.timeout = 2s, .shutdown_timeout = 1s});
    const std::string e0 = test::message(errors[0]);
    CHECK_MESSAGE(e0.find("ddp[rank 0/2]: all_reduce #1 (F32 x 4) timed out after 300 ms while waiting for rank 1 in "
                          "shared memory") != std::string::npos, e0);
    CHECK_MESSAGE(e0.find("Ranks that never reached all_reduce #1: 1 (no report") != std::string::npos, e0);
  }
}
