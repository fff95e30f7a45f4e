// env: launch flags taken out of argv (all spellings), and their errors.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/env/flags.hpp>
#include <string>
#include <vector>

using ddp::ConfigError;
using ddp::env::extract_launch_flags;
using ddp::env::LaunchFlags;
using Args = std::vector<std::string>;

TEST_SUITE("env") {
  TEST_CASE("the three legacy --local_rank forms and the --local-rank N form give the same value") {
    for (Args args : {Args{"./prog", "--local_rank=1", "--backend=gloo"}, Args{"./prog", "--local-rank=1", "--backend=gloo"},
                      Args{"./prog", "--local-rank", "1", "--backend=gloo"},
                      Args{"./prog", "--local_rank", "1", "--backend=gloo"}}) {
      CAPTURE(args[1]);
      LaunchFlags f = extract_launch_flags(args);
      CHECK(f.local_rank == 1);
      CHECK(args == Args{"./prog", "--backend=gloo"});
      CHECK_FALSE(f.rank.has_value());
      CHECK_FALSE(f.empty());
    }
    Args legacy{"./prog", "--local_rank=3"};
    CHECK(extract_launch_flags(legacy).local_rank_flag == "--local_rank");
  }

  TEST_CASE("every launch flag in both forms; the program's own flags stay in order") {
    Args args{"./resnet",        "--use_syn",      "--rank=5",    "--world-size", "8",
              "--batch_size=16", "--local-rank=1", "--local-world-size", "4",      "--master-addr=10.0.0.1",
              "--master-port",   "1234",           "--arch=resnet152"};
    LaunchFlags f = extract_launch_flags(args);
    CHECK(f.rank == 5);
    CHECK(f.world_size == 8);
    CHECK(f.local_rank == 1);
    CHECK(f.local_world_size == 4);
    CHECK(f.master_addr == "10.0.0.1");
    CHECK(f.master_port == 1234);
    CHECK(args == Args{"./resnet", "--use_syn", "--batch_size=16", "--arch=resnet152"});
  }

  TEST_CASE("argv[0] is never a flag, look-alike flags are left alone, and -- ends the scan") {
    Args args{"--rank=1", "--ranks=2", "--rank-file=x", "--master-address=h", "--", "--rank=3"};
    LaunchFlags f = extract_launch_flags(args);
    CHECK(f.empty());
    CHECK(args == Args{"--rank=1", "--ranks=2", "--rank-file=x", "--master-address=h", "--", "--rank=3"});
    Args none;
    CHECK(extract_launch_flags(none).empty());
  }

  TEST_CASE("the same flag twice is fine with one value and an error with two") {
    Args same{"./p", "--rank=1", "--rank", "1"};
    CHECK(extract_launch_flags(same).rank == 1);
    Args twice{"./p", "--local_rank=1", "--local-rank=2"};
    CHECK_THROWS_WITH_AS(extract_launch_flags(twice),
                         "ddp: --local-rank was given twice with different values (1 and 2); pass it once.",
                         ConfigError);
  }

  TEST_CASE("the C argv overload compacts argv in place for cxxopts") {
    std::string a0 = "./prog", a1 = "--local_rank=2", a2 = "--epochs", a3 = "3", a4 = "--master-port", a5 = "29501";
    char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), a5.data(), nullptr};
    int argc = 6;
    LaunchFlags f = extract_launch_flags(argc, argv);
    CHECK(f.local_rank == 2);
    CHECK(f.master_port == 29501);
    REQUIRE(argc == 3);
    CHECK(std::string(argv[0]) == "./prog");
    CHECK(std::string(argv[1]) == "--epochs");
    CHECK(std::string(argv[2]) == "3");
    CHECK(argv[3] == nullptr);
  }

  TEST_CASE("bad flag values name the flag") {
    struct Row {
      Args args;
      const char* message;
    };
    const Row rows[] = {
        {{"./p", "--rank"}, "ddp: --rank needs a value, e.g. --rank=0."},
        {{"./p", "--world-size", "--rank=1"}, "ddp: --world-size needs a value, e.g. --world-size=0."},
        {{"./p", "--master-addr"}, "ddp: --master-addr needs a value, e.g. --master-addr=10.0.0.1."},
        {{"./p", "--master-port"}, "ddp: --master-port needs a value, e.g. --master-port=29500."},
        {{"./p", "--rank=one"}, "ddp: --rank='one' is not an integer."},
        {{"./p", "--local_rank=1x"}, "ddp: --local_rank='1x' is not an integer."},
        {{"./p", "--local-world-size", "four"}, "ddp: --local-world-size='four' is not an integer."},
        {{"./p", "--world-size="}, "ddp: --world-size='' is not an integer."},
        {{"./p", "--master-port=0"}, "ddp: --master-port='0' is not a TCP port; use a number from 1 to 65535."},
        {{"./p", "--master-port", "65536"},
         "ddp: --master-port='65536' is not a TCP port; use a number from 1 to 65535."},
        {{"./p", "--master-addr="}, "ddp: --master-addr is empty; pass the host of rank 0, e.g. --master-addr=10.0.0.1."},
        {{"./p", "--master-addr=a", "--master-addr=b"},
         "ddp: --master-addr was given twice with different values (a and b); pass it once."},
    };
    for (const auto& r : rows) {
      Args args = r.args;
      CAPTURE(args[1]);
      CHECK_THROWS_WITH_AS(extract_launch_flags(args), r.message, ConfigError);
    }
  }
}
