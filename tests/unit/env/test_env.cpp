// env: the injected environment and its strict typed readers.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdlib>
#include <ddp/env/env.hpp>
#include <string>

using ddp::ConfigError;
using ddp::env::Env;

TEST_SUITE("env") {
  TEST_CASE("Env::from reads back what it was given; empty values count as unset") {
    Env env = Env::from({{"RANK", "3"}, {"MASTER_ADDR", ""}});
    CHECK(env.has("RANK"));
    CHECK(env.get("RANK") == "3");
    CHECK_FALSE(env.has("MASTER_ADDR"));
    CHECK_FALSE(env.get("MASTER_ADDR").has_value());
    CHECK_FALSE(env.has("WORLD_SIZE"));
    CHECK(env.int_var("RANK", "torchrun") == 3);
    CHECK(env.int_get("WORLD_SIZE", "torchrun") == std::nullopt);
    CHECK(env.int_get("RANK", "torchrun") == 3);
  }

  TEST_CASE("Env::with adds, replaces and removes without touching the original") {
    Env base = Env::from({{"RANK", "3"}});
    Env more = base.with("WORLD_SIZE", "4").with("RANK", "1");
    Env less = base.with("RANK", std::nullopt);
    CHECK(base.get("RANK") == "3");
    CHECK(more.get("RANK") == "1");
    CHECK(more.get("WORLD_SIZE") == "4");
    CHECK_FALSE(less.has("RANK"));
  }

  TEST_CASE("Env::process is a snapshot of the real environment") {
    // PATH is set in every test environment; compare with getenv, the independent reference.
    const char* path = std::getenv("PATH");
    REQUIRE(path != nullptr);
    Env env = Env::process();
    CHECK(env.get("PATH") == std::string(path));
    CHECK(env.vars().size() >= 1);
  }

  TEST_CASE("integers parse strictly, negative values included") {
    Env env = Env::from({{"A", "-2"}, {"B", "2147483647"}, {"C", "0"}});
    CHECK(env.int_var("A", "x") == -2);
    CHECK(env.int_var("B", "x") == 2147483647);
    CHECK(env.int_var("C", "x") == 0);
  }

  TEST_CASE("a missing variable names itself, the launcher and the fix (with the flag when there is one)") {
    Env env;
    CHECK_THROWS_WITH_AS(env.int_var("LOCAL_WORLD_SIZE", "torchrun"),
                         "ddp: launched by torchrun but LOCAL_WORLD_SIZE is not set. torchrun always exports it; if "
                         "you start workers yourself, export LOCAL_WORLD_SIZE or pass --local-world-size.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(env.port_var("MASTER_PORT", "torchrun"),
                         "ddp: launched by torchrun but MASTER_PORT is not set. torchrun always exports it; if you "
                         "start workers yourself, export MASTER_PORT or pass --master-port.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(env.int_var("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI mpirun"),
                         "ddp: launched by Open MPI mpirun but OMPI_COMM_WORLD_LOCAL_RANK is not set. Open MPI mpirun "
                         "always exports it; if you start workers yourself, export OMPI_COMM_WORLD_LOCAL_RANK.",
                         ConfigError);
  }

  TEST_CASE("non-numeric and out-of-range values are errors that quote the value") {
    for (const char* bad : {"3x", "", " 3", "3 ", "0x10", "1e3", "+", "-", "+1"}) {
      CAPTURE(bad);
      Env env = Env::from({{"RANK", bad}});
      if (std::string(bad).empty()) {
        CHECK_THROWS_AS(env.int_var("RANK", "torchrun"), ConfigError);  // empty == unset: the "not set" message
        continue;
      }
      CHECK_THROWS_WITH_AS(env.int_var("RANK", "torchrun"),
                           ("ddp: RANK='" + std::string(bad) + "' (from torchrun) is not an integer.").c_str(),
                           ConfigError);
    }
    // Integers that do not fit an int say so rather than "not an integer".
    CHECK_THROWS_WITH_AS(Env::from({{"RANK", "99999999999"}}).int_var("RANK", "torchrun"),
                         "ddp: RANK='99999999999' (from torchrun) is out of range: it must fit in 32 bits "
                         "(-2147483648 to 2147483647).",
                         ConfigError);
    CHECK_THROWS_WITH_AS(Env::from({{"RANK", "3x"}}).int_var("RANK", "torchrun"),
                         "ddp: RANK='3x' (from torchrun) is not an integer.", ConfigError);
    CHECK_THROWS_WITH_AS(Env::from({{"RANK", "3x"}}).int_get("RANK", "torchrun"),
                         "ddp: RANK='3x' (from torchrun) is not an integer.", ConfigError);
  }

  TEST_CASE("ports are 1..65535") {
    CHECK(Env::from({{"P", "1"}}).port_var("P", "x") == 1);
    CHECK(Env::from({{"P", "65535"}}).port_var("P", "x") == 65535);
    CHECK(Env::from({{"MASTER_PORT", "29500"}}).port_get("MASTER_PORT", "x") == 29500);
    for (const char* bad : {"0", "65536", "-1", "http", "29500/tcp"}) {
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(Env::from({{"MASTER_PORT", bad}}).port_var("MASTER_PORT", "torchrun"),
                           ("ddp: MASTER_PORT='" + std::string(bad) +
                            "' (from torchrun) is not a TCP port; use a number from 1 to 65535.")
                               .c_str(),
                           ConfigError);
    }
  }
}
