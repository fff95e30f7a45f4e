// FailureState (comm/failure_state.hpp): the first failure wins, including when threads race to fail, and every
// later op's error quotes it. The backends' use of it is tested end to end in test_tcp_failures.cpp,
// test_staged.cpp and tests/integration/mpi/test_mpi_mismatch.cpp.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <atomic>
#include <exception>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/failure_state.hpp"
#include "ddp/core/error.hpp"

using namespace ddp;

namespace test_failure_state {

// The message of the exception in `e` (a std::exception), and whether it is a CommError.
std::string what_of(const std::exception_ptr& e, bool& comm_error) {
  comm_error = false;
  try {
    std::rethrow_exception(e);
  } catch (const CommError& x) {
    comm_error = true;
    return x.what();
  } catch (const std::exception& x) {
    return x.what();
  }
  return {};  // not reached: rethrow_exception throws, each catch returns
}

}  // namespace test_failure_state

TEST_SUITE("comm") {
  TEST_CASE("failure state: healthy until the first failure, which later failures do not replace") {
    comm::FailureState s;
    CHECK_FALSE(s.failed());
    CHECK(s.not_run("ddp[rank 0/2]: barrier #1") == nullptr);
    CHECK_NOTHROW(s.throw_if_failed("ddp[rank 0/2]: barrier #1"));

    CHECK(s.fail("ddp[rank 0/2]: all_reduce #2 (F32 x 4) failed: rank 1 closed its connection"));
    CHECK_FALSE(s.fail("ddp[rank 0/2]: all_reduce #3 (F32 x 4) failed: later"));
    CHECK(s.failed());

    const std::string want =
        "ddp[rank 0/2]: barrier #4 was not run: this communicator failed earlier: "
        "ddp[rank 0/2]: all_reduce #2 (F32 x 4) failed: rank 1 closed its connection";
    bool comm_error = false;
    CHECK(test_failure_state::what_of(s.not_run("ddp[rank 0/2]: barrier #4"), comm_error) == want);
    CHECK(comm_error);
    CHECK_THROWS_WITH_AS(s.throw_if_failed("ddp[rank 0/2]: barrier #4"), want.c_str(), CommError);
  }

  TEST_CASE("failure state: of threads failing at once, exactly one is first, and its message is kept") {
    constexpr int kThreads = 8;
    comm::FailureState s;
    std::atomic<int> firsts{0}, winner{-1};
    std::latch go(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] {
        go.arrive_and_wait();
        (void)s.failed();  // readers race with the writers too
        if (s.fail("thread " + std::to_string(i))) {
          ++firsts;
          winner = i;
        }
      });
    for (auto& t : threads) t.join();
    REQUIRE(firsts == 1);
    bool comm_error = false;
    CHECK(test_failure_state::what_of(s.not_run("op"), comm_error) ==
          "op was not run: this communicator failed earlier: thread " + std::to_string(winner.load()));
  }
}
