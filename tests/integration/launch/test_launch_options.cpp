// ddprun's pure parts: flag parsing (pinned errors), torchrun's worker environment, line prefixing.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/launch/line_prefixer.hpp>
#include <ddp/launch/options.hpp>
#include <ddp/launch/supervisor.hpp>
#include <ddp/launch/worker_env.hpp>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

using ddp::launch::LaunchOptions;
using ddp::launch::parse_launch_args;

namespace {
LaunchOptions parse(std::vector<std::string> args) { return parse_launch_args(args); }
}  // namespace

TEST_SUITE("launch") {
  TEST_CASE("both spellings, both value forms; the program and its flags are kept verbatim") {
    auto o = parse({"--nproc_per_node=2", "--max-restarts", "3", "--run_id=job7", "--grace-period=0.25",
                    "--monitor_interval", "0.5", "--no_python", "./probe", "--rank", "5", "--nproc-per-node=9"});
    CHECK(o.nproc_per_node == 2);
    CHECK(o.max_restarts == 3);
    CHECK(o.run_id == "job7");
    CHECK(o.run_id_given);
    CHECK(o.grace_period.count() == 250);
    CHECK(o.monitor_interval.count() == 500);
    CHECK(o.ignored == std::vector<std::string>{"--no_python"});
    CHECK(o.program == std::vector<std::string>{"./probe", "--rank", "5", "--nproc-per-node=9"});
    CHECK(o.master_addr == "127.0.0.1");
    CHECK(o.master_port == 29500);
  }

  TEST_CASE("multi-node flags and '--' as the end of ddprun's flags") {
    auto o = parse({"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master_port=1234", "--",
                    "-weird-program", "x"});
    CHECK(o.nnodes == 2);
    CHECK(o.node_rank == 1);
    CHECK(o.master_addr == "10.0.0.1");
    CHECK(o.master_port == 1234);
    CHECK(o.program == std::vector<std::string>{"-weird-program", "x"});
  }

  TEST_CASE("torchrun's -r/-t/--log-dir are accepted and reported as ignored") {
    auto o = parse({"-r", "1", "--tee=3", "--log_dir", "/tmp/x", "true"});
    CHECK(o.ignored == std::vector<std::string>{"-r", "--tee", "--log_dir"});
    CHECK(o.program == std::vector<std::string>{"true"});
  }

  TEST_CASE("--help needs no program") { CHECK(parse({"--help"}).help); }

  TEST_CASE("bad flags and values name the flag (pinned)") {
    using ddp::ConfigError;
    CHECK_THROWS_WITH_AS(parse({"--nproc-per-node", "two", "x"}), "ddp: ddprun: --nproc-per-node='two' is not an integer.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--nproc_per_node=0", "x"}),
                         "ddp: ddprun: --nproc-per-node=0 is out of range; it must be at least 1.", ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--max-restarts=-1", "x"}),
                         "ddp: ddprun: --max-restarts=-1 is out of range; it must be at least 0.", ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--master-port", "70000", "x"}),
                         "ddp: ddprun: --master-port='70000' is not a TCP port (1-65535); use --standalone to pick a "
                         "free one.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--grace-period", "soon", "x"}),
                         "ddp: ddprun: --grace-period='soon' is not a number of seconds (0 to 1e6, e.g. 0.5).",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--nproc-per-node"}), "ddp: ddprun: --nproc-per-node needs a value (--nproc-per-node N).",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--standalone=yes", "x"}), "ddp: ddprun: --standalone takes no value (got 'yes').",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--nprocs", "2", "x"}),
                         "ddp: ddprun: unknown flag '--nprocs'. Valid flags: --nproc-per-node, --nnodes, --node-rank, "
                         "--master-addr, --master-port, --standalone, --max-restarts, --run-id, --monitor-interval, "
                         "--grace-period, --no-python, --redirects, --tee, --log-dir, --help. Flags go before PROGRAM; "
                         "run ddprun --help.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--nproc-per-node", "2"}),
                         "ddp: ddprun: no PROGRAM given. Usage: ddprun [flags] PROGRAM [ARGS...]; run ddprun --help.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "x"}),
                         "ddp: ddprun: --node-rank=2 must be less than --nnodes=2; nodes are numbered 0..1.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--nnodes", "2", "x"}),
                         "ddp: ddprun: --nnodes=2 needs --master-addr, the address of node 0 that every node can reach "
                         "(ddprun does not guess one for several nodes).",
                         ConfigError);
    CHECK_THROWS_WITH_AS(parse({"--standalone", "--master-port", "1234", "x"}),
                         "ddp: ddprun: --standalone picks its own address and free port; drop "
                         "--master-addr/--master-port or drop --standalone.",
                         ConfigError);
  }

  TEST_CASE("usage text lists every flag the parser knows") {
    const std::string help = ddp::launch::usage_text();
    for (const auto& f : ddp::launch::detail::kFlags) CHECK(help.find("--" + std::string(f.name)) != std::string::npos);
  }

  // Reference: Debian torchrun 1.13, `--nproc_per_node=2 --no_python env`, worker 1 (see worker_env.hpp).
  TEST_CASE("worker environment matches torchrun's, variable for variable") {
    const ddp::launch::EnvMap parent{{"PATH", "/bin"}, {"RANK", "99"}, {"HOME", "/root"}};
    auto o = parse({"--nproc-per-node", "2", "x"});
    auto env = ddp::launch::worker_env(parent, o, {.local_rank = 1, .restart_count = 0, .master_addr = "127.0.0.1",
                                                  .master_port = 29500, .run_id = "none"});
    const ddp::launch::EnvMap expected{
        {"PATH", "/bin"}, {"HOME", "/root"}, {"RANK", "1"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "2"},
        {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "1"}, {"ROLE_RANK", "1"},
        {"ROLE_WORLD_SIZE", "2"}, {"ROLE_NAME", "default"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
        {"TORCHELASTIC_RESTART_COUNT", "0"}, {"TORCHELASTIC_MAX_RESTARTS", "0"}, {"TORCHELASTIC_RUN_ID", "none"},
        {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"NCCL_ASYNC_ERROR_HANDLING", "1"}, {"OMP_NUM_THREADS", "1"}};
    CHECK(env == expected);
    CHECK(ddp::launch::sets_omp_threads(parent, o));
  }

  TEST_CASE("worker environment: node 1 of 2, restart 2, OMP_NUM_THREADS and NCCL setting kept") {
    const ddp::launch::EnvMap parent{{"OMP_NUM_THREADS", "4"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}};
    auto o = parse({"--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                    "--max-restarts", "3", "x"});
    auto env = ddp::launch::worker_env(parent, o, {.local_rank = 2, .restart_count = 2, .master_addr = "10.0.0.1",
                                                  .master_port = 29500, .run_id = "none"});
    CHECK(env.at("RANK") == "6");
    CHECK(env.at("WORLD_SIZE") == "8");
    CHECK(env.at("LOCAL_RANK") == "2");
    CHECK(env.at("GROUP_RANK") == "1");
    CHECK(env.at("GROUP_WORLD_SIZE") == "2");
    CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "2");
    CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "3");
    CHECK(env.at("OMP_NUM_THREADS") == "4");
    CHECK(env.at("NCCL_ASYNC_ERROR_HANDLING") == "0");
    CHECK_FALSE(ddp::launch::sets_omp_threads(parent, o));
  }

  TEST_CASE("a single worker gets no OMP_NUM_THREADS; envp round-trips") {
    auto o = parse({"x"});
    auto env = ddp::launch::worker_env({}, o, {.master_addr = "127.0.0.1", .master_port = 1, .run_id = "r"});
    CHECK_FALSE(env.contains("OMP_NUM_THREADS"));
    std::vector<std::string> envp = ddp::launch::to_envp(env);
    std::vector<const char*> ptrs;
    for (auto& s : envp) ptrs.push_back(s.c_str());
    ptrs.push_back(nullptr);
    CHECK(ddp::launch::env_map_from(ptrs.data()) == env);
  }

  TEST_CASE("LinePrefixer: whole lines only, tail on finish, long lines cut") {
    ddp::launch::LinePrefixer p("[rank1]: ");
    CHECK(p.feed("a\nb") == "[rank1]: a\n");
    CHECK(p.feed("c\n") == "[rank1]: bc\n");
    CHECK(p.feed("\n\nx") == "[rank1]: \n[rank1]: \n");
    CHECK(p.finish() == "[rank1]: x\n");
    CHECK(p.finish().empty());
    ddp::launch::LinePrefixer q("> ", 4);
    CHECK(q.feed("abcdefghij") == "> abcd\n> efgh\n");
    CHECK(q.feed("\n") == "> ij\n");
    CHECK(q.feed("wxyz\n") == "> wxyz\n");  // exactly max_line bytes: the '\n' is not a second line
    CHECK(q.finish().empty());
  }

  TEST_CASE("LinePrefixer: a redrawn line is a status until its '\\n'; finished lines keep the last redraw") {
    ddp::launch::LinePrefixer p("[rank0]: ", 64);
    CHECK_FALSE(p.take_status().has_value());
    CHECK(p.feed("\rstep 1\x1b[K").empty());
    CHECK(p.take_status() == std::optional<std::string>("[rank0]: step 1"));
    CHECK_FALSE(p.take_status().has_value());  // reported once
    // An hour of redraws: the buffer keeps only the last one, so max_line (64 here) never cuts it into lines.
    for (int i = 0; i < 1000; ++i) CHECK(p.feed("\rstep " + std::to_string(i) + " of many\x1b[K").empty());
    CHECK(p.take_status() == std::optional<std::string>("[rank0]: step 999 of many"));
    CHECK(p.feed("\rstep 1000 of many\x1b[K\nnext") == "[rank0]: step 1000 of many\n");
    CHECK(p.take_status() == std::optional<std::string>(""));  // cleared by the finished line
    CHECK(p.feed("\n") == "[rank0]: next\n");
    CHECK(p.feed("dos line\r\n") == "[rank0]: dos line\n");  // a CRLF line is not a redraw
    CHECK(p.feed("\rlast\x1b[K").empty());
    CHECK(p.finish() == "[rank0]: last\n");
    CHECK(p.take_status() == std::optional<std::string>(""));
  }

  TEST_CASE("Console: other output goes above the live status line, which is drawn again under it") {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    {
      ddp::launch::detail::Console live(true, fds[1]);
      live.write(fds[1], "a\n");
      live.set_status("[rank0]: step 1");
      live.write(fds[1], "[rank1]: hello\n");
      live.set_status("");
      live.write(fds[1], "[rank0]: done\n");
      ddp::launch::detail::Console plain(false, fds[1]);
      plain.set_status("[rank0]: ignored");
      plain.write(fds[1], "b\n");
    }
    ::close(fds[1]);
    std::string got;
    char buf[256];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
    ::close(fds[0]);
    CHECK(got == "a\n\r\x1b[K[rank0]: step 1\r\x1b[K[rank1]: hello\n[rank0]: step 1\r\x1b[K[rank0]: done\nb\n");
  }
}
