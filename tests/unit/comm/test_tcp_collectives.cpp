// Every collective of the tcp backend x world size 1-4 x dtype x sizes, checked bit for bit against a
// reference computed locally from every rank's seeded data.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstring>
#include <latch>
#include <mutex>
#include <vector>

#include "collective_checks.hpp"
#include "comm_harness.hpp"

using namespace ddp;

namespace {

template <class T>
void check_all_collectives(int n) {
  std::vector<std::string> failures;
  std::mutex mu;
  auto errors = test::run_ranks(n, [&](comm::TcpCommunicator& c) {
    auto f = test::check_collectives<T>(c);
    std::lock_guard lock(mu);
    for (auto& x : f) failures.push_back(ddp::detail::str("rank ", c.rank(), ": ", x));
  });
  for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE_TEMPLATE("tcp: every collective matches the reference for world sizes 1-4", T, float, double, bfloat16,
                     half, std::int32_t, std::int64_t, std::uint8_t) {
    for (int n = 1; n <= 4; ++n) {
      CAPTURE(n);
      check_all_collectives<T>(n);
    }
  }

  TEST_CASE("tcp: send/recv and isend/irecv deliver in order, with tags") {
    auto errors = test::run_ranks(3, [](comm::TcpCommunicator& c) {
      if (c.rank() == 0) {
        std::vector<float> a{1, 2, 3}, b(1000, 7.0f);
        c.send(std::span<const float>(a), 1);
        auto w1 = c.isend(std::span(b), 2, {.tag = 5});
        auto w2 = c.isend(std::span(a), 2);
        w1.wait();
        w2.wait();
      } else if (c.rank() == 1) {
        std::vector<float> a(3), back{9};
        auto r = c.irecv(std::span(a), 0);  // posted before this rank's own send: must not block
        c.send(std::span<const float>(back), 2);
        r.wait();
        if (a != std::vector<float>{1, 2, 3}) throw std::runtime_error("rank 1 got wrong data");
      } else {
        std::vector<float> b(1000), a(3), back(1);
        c.recv(std::span(back), 1);
        if (back[0] != 9) throw std::runtime_error("rank 2 got wrong data from rank 1");
        auto w1 = c.irecv(std::span(b), 0, {.tag = 5});
        auto w2 = c.irecv(std::span(a), 0);
        w2.wait();
        w1.wait();
        if (b != std::vector<float>(1000, 7.0f) || a != std::vector<float>{1, 2, 3})
          throw std::runtime_error("rank 2 got wrong data");
      }
      c.barrier().wait();
    });
    for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
  }

  TEST_CASE("tcp: irecv posted before the own send completes (MPI-style ring exchange)") {
    for (int n : {2, 3, 4}) {
      auto errors = test::run_ranks(n, [](comm::TcpCommunicator& c) {
        const int n = c.size(), r = c.rank();
        for (std::size_t count : {std::size_t{1}, std::size_t{3} << 20}) {  // tiny, and larger than socket buffers
          std::vector<std::int32_t> out(count, r), in(count, -1);
          auto w = c.irecv(std::span(in), (r + n - 1) % n);
          c.send(std::span<const std::int32_t>(out), (r + 1) % n);
          w.wait();
          for (auto x : in)
            if (x != (r + n - 1) % n) throw std::runtime_error(ddp::detail::str("rank ", r, " got ", x));
        }
        c.barrier().wait();  // collectives after a send/recv batch still line up
      });
      for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
    }
  }

  TEST_CASE("tcp: async ops overlap: issue several, wait later in any order") {
    auto errors = test::run_ranks(2, [](comm::TcpCommunicator& c) {
      constexpr int kOpsInFlight = 8;
      std::vector<std::vector<std::int64_t>> bufs;
      for (int i = 0; i < kOpsInFlight; ++i)
        bufs.emplace_back(static_cast<std::size_t>(1 + i * 100000), static_cast<std::int64_t>(c.rank() + i));
      std::vector<comm::Work> works;
      for (auto& b : bufs) works.push_back(c.all_reduce(std::span(b)));
      for (int i = kOpsInFlight - 1; i >= 0; --i) {
        works[static_cast<std::size_t>(i)].wait(std::chrono::seconds(5));
        for (auto x : bufs[static_cast<std::size_t>(i)])
          if (x != 2 * i + 1) throw std::runtime_error(ddp::detail::str("op ", i, " has ", x, ", expected ", 2 * i + 1));
      }
      for (auto& w : works) {
        if (!w.is_completed() || w.exception()) throw std::runtime_error("completed work reports otherwise");
      }
    });
    for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
  }

  TEST_CASE("tcp: a blocking all-reduce runs on the calling thread at any size, an async one is queued") {
    // AllreduceOptions::blocking: 4 MiB is far above inline_max_bytes (64 KiB). On a communicator with nothing
    // queued the blocking op has completed when all_reduce returns; so has the next (it ran inline too, so the
    // progress thread never ran anything). Then an async op of the same size is queued: rank 1 issues its part
    // only after rank 0's call returned, so rank 0's cannot have completed by then.
    std::latch rank0_returned(1);
    auto errors = test::run_ranks(2, [&](comm::TcpCommunicator& c) {
      std::vector<float> v(1u << 20, static_cast<float>(c.rank() + 1));
      for (int i = 0; i < 2; ++i) {
        const comm::Work w = c.all_reduce(std::span(v), {.op = comm::ReduceOp::Sum, .blocking = true});
        if (!w.is_completed()) throw std::runtime_error(ddp::detail::str("blocking op ", i, " returned incomplete"));
        w.wait();
      }
      if (v.front() != 6.0f || v.back() != 6.0f)  // 1 + 2 = 3, then 3 + 3
        throw std::runtime_error(ddp::detail::str("blocking all-reduces gave ", v.front(), ", expected 6"));
      if (c.rank() == 1) rank0_returned.wait();
      const comm::Work w = c.all_reduce(std::span(v));
      if (c.rank() == 0) {
        if (w.is_completed()) throw std::runtime_error("an async 4 MiB all-reduce completed before rank 1 joined");
        rank0_returned.count_down();
      }
      w.wait(std::chrono::seconds(5));
      if (v.front() != 12.0f) throw std::runtime_error(ddp::detail::str("async all-reduce gave ", v.front()));
    });
    for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
  }

  TEST_CASE("tcp: subgroups from new_group") {
    auto errors = test::run_ranks(4, [](comm::TcpCommunicator& c) {
      auto odd = c.new_group({1, 3});
      auto all = c.new_group({0, 1, 2, 3});
      if ((c.rank() % 2 == 1) != static_cast<bool>(odd)) throw std::runtime_error("wrong membership");
      if (odd) {
        std::vector<std::int32_t> v{c.rank()};
        odd->all_reduce(std::span(v)).wait();
        if (v[0] != 4 || odd->size() != 2 || odd->rank() != c.rank() / 2) throw std::runtime_error("odd group sum");
      }
      std::vector<std::int32_t> v{c.rank()};
      all->all_reduce(std::span(v)).wait();
      if (v[0] != 6) throw std::runtime_error("group of all");
    });
    for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
  }

  TEST_CASE("tcp: argument errors are ValueErrors at the call, in the words every backend uses") {
    for (int n : {1, 2}) {
      auto errors = test::run_ranks(n, [](comm::TcpCommunicator& c) {
        std::vector<float> v(3), out(5);
        CHECK_THROWS_WITH_AS(c.broadcast(std::span(v), {.root = 2}),
                             doctest::Contains("broadcast root 2 is out of range [0, "), ValueError);
        for (const auto& f : test::check_argument_errors(c)) FAIL_CHECK(f);
        c.barrier().wait();  // nothing was sent: the next collective still lines up
      });
      for (const auto& e : errors) CHECK_MESSAGE(!e, test::message(e));
    }
  }
}
