// ddprun's agent in-process: where the store lives (plan_store) and a whole run through run_agent().
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <unistd.h>

#include <ddp/launch/agent.hpp>
#include <string>
#include <vector>

using ddp::launch::parse_launch_args;

namespace {
ddp::launch::LaunchOptions parse_args(std::vector<std::string> args) { return parse_launch_args(args); }
}  // namespace

TEST_SUITE("launch") {
  TEST_CASE("plan_store: node 0 hosts, other nodes only dial; --standalone binds a free loopback port") {
    auto s = ddp::launch::plan_store(parse_args({"--standalone", "x"}));
    CHECK(s.host);
    CHECK(s.bind_host == "127.0.0.1");
    CHECK(s.bind_port == 0);
    CHECK(s.master_addr == "127.0.0.1");
    auto n0 = ddp::launch::plan_store(parse_args({"--nnodes=2", "--node-rank=0", "--master-addr=10.1.2.3", "x"}));
    CHECK(n0.host);
    CHECK(n0.bind_host == "0.0.0.0");
    CHECK(n0.bind_port == 29500);
    CHECK(n0.master_addr == "10.1.2.3");
    auto n1 = ddp::launch::plan_store(
        parse_args({"--nnodes=2", "--node-rank=1", "--master-addr=10.1.2.3", "--master-port=1234", "x"}));
    CHECK_FALSE(n1.host);
    CHECK(n1.bind_port == 1234);
    auto local = ddp::launch::plan_store(parse_args({"x"}));
    CHECK(local.host);
    CHECK(local.bind_host == "127.0.0.1");
  }

  TEST_CASE("run_agent: --standalone workers get the bound free port and a random run id; exit codes") {
    const ddp::launch::EnvMap parent{{"PATH", "/usr/bin:/bin"}};
    // Each worker checks its own environment; the job succeeds only if both checks pass.
    auto ok = ddp::launch::run_agent(
        parse_args({"--standalone", "--nproc-per-node", "2", "sh", "-c",
               "[ \"$MASTER_ADDR\" = 127.0.0.1 ] && [ \"$MASTER_PORT\" -gt 0 ] && [ \"$MASTER_PORT\" != 29500 ] && "
               "[ ${#TORCHELASTIC_RUN_ID} = 16 ] && [ \"$WORLD_SIZE\" = 2 ] && [ \"$OMP_NUM_THREADS\" = 1 ]"}),
        parent);
    CHECK(ok.exit_code == 0);
    CHECK(ok.pids.size() == 2);
    auto bad = ddp::launch::run_agent(
        parse_args({"--standalone", "--nproc-per-node", "2", "--grace-period", "0.5", "sh", "-c",
               "[ \"$RANK\" = 1 ] && exit 3; exec sleep 20"}),
        parent);
    CHECK(bad.exit_code == 3);
    CHECK(bad.failed_rank == 1);
    for (pid_t p : bad.pids) CHECK(::kill(p, 0) == -1);  // reaped: no such process
  }

  TEST_CASE("run_agent: a missing program is a ConfigError before anything starts") {
    CHECK_THROWS_WITH_AS(ddp::launch::run_agent(parse_args({"--standalone", "no-such-program-xyz"}), {{"PATH", "/bin"}}),
                         "ddp: ddprun: program 'no-such-program-xyz' not found in PATH. Give a path such as "
                         "./no-such-program-xyz.",
                         ddp::ConfigError);
  }
}
