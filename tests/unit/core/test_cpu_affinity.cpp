// core/cpu_affinity.hpp: CPU list syntax and pinning a thread (checked with pthread_getaffinity_np).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <pthread.h>
#include <sched.h>

#include <latch>
#include <thread>
#include <vector>

#include "ddp/core/cpu_affinity.hpp"

using namespace ddp;

TEST_SUITE("core") {
  TEST_CASE("parse_cpu_list: taskset's syntax, sorted and without repeats") {
    CHECK(parse_cpu_list("", "--comm-cpus").empty());
    CHECK(parse_cpu_list("1", "--comm-cpus") == std::vector<int>{1});
    CHECK(parse_cpu_list("0-2,5", "--comm-cpus") == std::vector<int>{0, 1, 2, 5});
    CHECK(parse_cpu_list("5,1-2,2", "--comm-cpus") == std::vector<int>{1, 2, 5});
    CHECK_THROWS_WITH_AS(parse_cpu_list("2-1", "--comm-cpus"),
                         "ddp: --comm-cpus '2-1': range 2-1 runs backwards; write CPU numbers and ranges separated "
                         "by commas, e.g. 1 or 0-3,6", ConfigError);
    CHECK_THROWS_WITH_AS(parse_cpu_list("one", "DDP_COMM_CPUS"), doctest::Contains("ddp: DDP_COMM_CPUS 'one': 'one' is not a CPU number"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse_cpu_list("1,", "--comm-cpus"), doctest::Contains("it ends with a comma"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_cpu_list("1,,2", "--comm-cpus"), doctest::Contains("'' is not a CPU number"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_cpu_list("-1", "--comm-cpus"), doctest::Contains("is not a CPU number"), ConfigError);
    CHECK_THROWS_AS(parse_cpu_list("99999", "--comm-cpus"), ConfigError);  // beyond CPU_SETSIZE
  }

  TEST_CASE("pin_thread: the thread runs only where asked; a CPU the kernel refuses names the flag") {
    // Alive until checked (an exited thread's affinity cannot be set); released and joined however the case ends.
    std::latch done(1);
    std::thread t([&] { done.wait(); });
    struct Release {
      std::latch& done;
      std::thread& t;
      ~Release() {
        done.count_down();
        t.join();
      }
    } release{done, t};
    pin_thread(t, {0}, "--comm-cpus");
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::pthread_getaffinity_np(t.native_handle(), sizeof set, &set) == 0);
    CHECK(CPU_COUNT(&set) == 1);
    CHECK(CPU_ISSET(0, &set));
    pin_thread(t, {}, "--comm-cpus");  // empty: left as it is
    REQUIRE(::pthread_getaffinity_np(t.native_handle(), sizeof set, &set) == 0);
    CHECK(CPU_COUNT(&set) == 1);
    CHECK_THROWS_WITH_AS(pin_thread(t, {CPU_SETSIZE - 1}, "--comm-cpus"),
                         doctest::Contains("ddp: --comm-cpus 1023: the kernel refused to pin the communication "
                                           "thread there"), ConfigError);
  }
}
