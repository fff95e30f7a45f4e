// env: detect(): launcher order and nesting, flags over launchers, the store-address rules, the log line
// and the JSON the probe prints.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/core/log.hpp>
#include <ddp/env/detect.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "check_info.hpp"
#include "launch_envs.hpp"
#include "support/log_capture.hpp"

using ddp::ConfigError;
using ddp::env::DetectOptions;
using ddp::env::Env;
using ddp::env::LaunchFlags;
using ddp::env::LaunchInfo;
namespace de = ddp::env;
using namespace ddp_test;

namespace {

LaunchFlags flags_of(std::vector<std::string> args) {
  args.insert(args.begin(), "./prog");
  return de::extract_launch_flags(args);
}

const DetectOptions kTcp{.need_master_addr = true};
}  // namespace

TEST_SUITE("env") {
  TEST_CASE("each launcher alone is found by detect() and gives what its policy reads") {
    struct Row {
      const char* name;
      Env env;
      const char* source;
      int rank, world_size, local_rank, local_world_size;
    };
    const Row rows[] = {
        {"torchrun 1.13", torchrun_local_rank1(), "torchrun", 1, 2, 1, 2},
        {"torchrun multi-node", torchrun_node1_rank5(), "torchrun", 5, 8, 1, 4},
        {"torchrun standalone", torchrun_standalone_rank0(), "torchrun", 0, 2, 0, 2},
        {"launch --use_env 1.8", launch_use_env_rank3(), "env", 3, 4, 1, 4},
        {"mpirun (Open MPI)", openmpi_rank1(), "openmpi", 1, 2, 1, 2},
        {"mpirun two nodes", openmpi_two_nodes_rank2(), "openmpi", 2, 4, 0, 2},
        {"mpiexec (Hydra)", mpich_hydra_rank3(), "pmi", 3, 4, 1, 2},
        {"mpiexec.mpich -n 2 (Hydra, one host)", mpich_hydra_local_rank1(), "pmi", 1, 2, 1, 2},
        {"mpiexec.mpich uneven hosts", mpich_hydra_uneven_rank0(), "pmi", 0, 4, 0, 1},
        {"mpiexec (Cray PALS)", cray_pals_rank6(), "pmi", 6, 8, 2, 4},
        {"mpirun_rsh (MVAPICH2)", mvapich_rank2(), "mvapich", 2, 4, 0, 2},
        {"srun", srun_rank4(), "slurm", 4, 7, 1, 2},
        {"nothing", Env::from({{"PATH", "/bin"}, {"HOME", "/root"}}), "single-process", 0, 1, 0, 1},
    };
    for (const auto& r : rows) {
      CAPTURE(r.name);
      LaunchInfo info = de::detect(r.env);
      CHECK(info.source == r.source);
      CHECK(info.rank == r.rank);
      CHECK(info.world_size == r.world_size);
      CHECK(info.local_rank == r.local_rank);
      CHECK(info.local_world_size == r.local_world_size);
    }
    check_info(de::detect(Env{}), LaunchInfo{});
    check_info(de::detect(Env{}, {}, kTcp), LaunchInfo{});  // one process needs no store
  }

  TEST_CASE("nested launchers: the one closest to the process wins") {
    // srun torchrun: srun started one torchrun agent per node (SLURM_PROCID=1 on node 1), torchrun the workers.
    Env srun_agent = srun_rank4().with("SLURM_PROCID", "1").with("SLURM_NTASKS", "2").with("SLURM_LOCALID", "0");
    check_info(de::detect(nested(srun_agent, torchrun_node1_rank5()), {}, kTcp), de::detect(torchrun_node1_rank5()));
    // mpirun inside an sbatch allocation: Open MPI's variables, not the batch step's SLURM_PROCID=0.
    check_info(de::detect(nested(sbatch_allocation(), openmpi_two_nodes_rank2()), {}, kTcp),
               de::detect(openmpi_two_nodes_rank2()));
    // Hydra's mpiexec inside an allocation.
    CHECK(de::detect(nested(sbatch_allocation(), mpich_hydra_rank3())).source == "pmi");
    // MVAPICH2 under Hydra also sets PMI's variables: PMI is tried first and reads the same numbers.
    Env mv2_hydra = nested(mvapich_rank2(), Env::from({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"},
                                                       {"MPI_LOCALNRANKS", "2"}}));
    LaunchInfo a = de::detect(mv2_hydra), b = de::detect(mvapich_rank2());
    CHECK(a.source == "pmi");
    CHECK(a.rank == b.rank);
    CHECK(a.local_rank == b.local_rank);
    CHECK(a.master_addr == b.master_addr);
    // srun --mpi=pmi2 exports PMI_RANK/PMI_SIZE but no local count: Slurm reads the task.
    CHECK(de::detect(nested(srun_rank4(), Env::from({{"PMI_RANK", "4"}, {"PMI_SIZE", "7"}, {"PMI_FD", "9"}}))).source ==
          "slurm");
    // Open MPI exports PMIX_RANK too; OMPI_* wins.
    CHECK(de::detect(openmpi_rank1()).source == "openmpi");
    // A hand-set env:// job inside an allocation: RANK/WORLD_SIZE win over SLURM_*.
    Env hand = nested(sbatch_allocation(), Env::from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node01"},
                                                      {"MASTER_PORT", "4000"}}));
    CHECK(de::detect(hand, {}, kTcp).source == "env");
    // torchrun's RANK is also env://'s marker: TORCHELASTIC_RUN_ID decides.
    CHECK(de::detect(torchrun_local_rank1()).source == "torchrun");
  }

  TEST_CASE("Slurm alone: the store address comes from the expanded node list, MASTER_* override it") {
    LaunchInfo info = de::detect(srun_rank4().with("SLURM_STEP_NODELIST", "gpu[007-010],login1"), {}, kTcp);
    CHECK(info.master_addr == "gpu007");
    CHECK(info.master_port == 29956);
    info = de::detect(srun_rank4().with("MASTER_ADDR", "10.0.0.5"), {}, kTcp);
    CHECK(info.master_addr == "10.0.0.5");
    CHECK(info.master_port == 29956);
  }

  TEST_CASE("detect_launch<Ps...> tries only the given policies, first detected wins") {
    Env both = nested(srun_rank4(), torchrun_node1_rank5());
    CHECK(de::detect_launch<de::Slurm, de::Torchrun>(both).source == "slurm");
    CHECK(de::detect_launch<de::Torchrun, de::Slurm>(both).source == "torchrun");
    CHECK(de::detect_launch<de::OpenMpi>(both).source == "single-process");
    CHECK_THROWS_WITH_AS(de::detect_launch<de::Torchrun>(torchrun_node1_rank5().with("LOCAL_WORLD_SIZE", std::nullopt)),
                         "ddp: launched by torchrun but LOCAL_WORLD_SIZE is not set. torchrun always exports it; if "
                         "you start workers yourself, export LOCAL_WORLD_SIZE or pass --local-world-size.",
                         ConfigError);
  }

  TEST_CASE("flags: legacy --local_rank equal to LOCAL_RANK is accepted silently") {
    // torch.distributed.launch 1.13 without --use_env: torchrun underneath, plus --local_rank=N.
    for (auto args : {std::vector<std::string>{"--local_rank=1"}, {"--local-rank=1"}, {"--local-rank", "1"}}) {
      CAPTURE(args[0]);
      check_info(de::detect(torchrun_local_rank1(), flags_of(args), kTcp), de::detect(torchrun_local_rank1()));
    }
  }

  TEST_CASE("flags: --local_rank that contradicts LOCAL_RANK names both") {
    CHECK_THROWS_WITH_AS(de::detect(torchrun_local_rank1(), flags_of({"--local_rank=0"})),
                         "ddp: --local_rank=0 contradicts LOCAL_RANK=1 (from torchrun). Both give this process's "
                         "rank on its node; drop the flag or fix the variable.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(de::detect(launch_use_env_rank3(), flags_of({"--local-rank", "0"})),
                         "ddp: --local-rank=0 contradicts LOCAL_RANK=1 (from env:// variables). Both give this "
                         "process's rank on its node; drop the flag or fix the variable.",
                         ConfigError);
    CHECK_THROWS_WITH_AS(de::detect(Env::from({{"LOCAL_RANK", "2"}}), flags_of({"--local-rank=0"})),
                         "ddp: --local-rank=0 contradicts LOCAL_RANK=2 (from the environment). Both give this "
                         "process's rank on its node; drop the flag or fix the variable.",
                         ConfigError);
  }

  TEST_CASE("flags: torch.distributed.launch 1.8 without --use_env (env:// plus --local_rank)") {
    Env env = launch_use_env_rank3().with("LOCAL_RANK", std::nullopt);
    LaunchInfo info = de::detect(env, flags_of({"--local_rank=1"}), kTcp);
    check_info(info, {.rank = 3, .world_size = 4, .local_rank = 1, .local_world_size = 4, .node_rank = 0,
                      .nnodes = 1, .master_addr = "1.2.3.4", .master_port = 1234, .source = "env+flags"});
  }

  TEST_CASE("flags alone describe the job; flags override single launcher fields") {
    LaunchInfo info = de::detect(Env{}, flags_of({"--rank=1", "--world-size=2", "--master-addr", "10.1.1.1",
                                                  "--master-port=29600"}),
                                 kTcp);
    check_info(info, {.rank = 1, .world_size = 2, .local_rank = 0, .local_world_size = 1, .node_rank = 1,
                      .nnodes = 2, .master_addr = "10.1.1.1", .master_port = 29600, .source = "flags"});
    info = de::detect(Env{}, flags_of({"--rank=1", "--world-size=2", "--local-rank=1", "--local-world-size=2"}), kTcp);
    CHECK(info.master_addr == "127.0.0.1");  // both sizes given by flags prove one host
    CHECK(info.nnodes == 1);
    // Over torchrun: the address moves, so torchrun's agent store is no longer the one to use.
    info = de::detect(torchrun_node1_rank5(), flags_of({"--master-addr=10.0.0.9", "--master-port=4000"}), kTcp);
    CHECK(info.source == "torchrun+flags");
    CHECK(info.master_addr == "10.0.0.9");
    CHECK(info.master_port == 4000);
    CHECK_FALSE(info.launcher_owns_store);
    CHECK(info.rank == 5);
    // Over Open MPI: a rank override.
    info = de::detect(openmpi_two_nodes_rank2(), flags_of({"--rank", "3", "--local-rank", "1"}), kTcp);
    CHECK(info.source == "openmpi+flags");
    CHECK(info.rank == 3);
    CHECK(info.local_rank == 1);
    CHECK(info.node_rank == 1);  // Open MPI's layout stays
  }

  TEST_CASE("store address: defaults only when the launcher proves every rank is local, and says so") {
    ddp::test::LogCapture log;
    Env mpi1 = openmpi_rank1().with("MASTER_ADDR", std::nullopt).with("MASTER_PORT", std::nullopt);
    LaunchInfo r1 = de::detect(mpi1, {}, kTcp);
    CHECK(r1.master_addr == "127.0.0.1");
    CHECK(r1.master_port == 29500);
    CHECK(log.lines().empty());  // rank 1 does not log
    Env mpi0 = mpi1.with("OMPI_COMM_WORLD_RANK", "0").with("OMPI_COMM_WORLD_LOCAL_RANK", "0");
    LaunchInfo r0 = de::detect(mpi0, {}, kTcp);
    CHECK(r0.master_addr == r1.master_addr);
    CHECK(r0.master_port == r1.master_port);
    REQUIRE(log.lines().size() == 1);
    CHECK(log.lines()[0] ==
          "ddp: INFO: MASTER_ADDR and MASTER_PORT not set; all 2 ranks run on this host (OMPI_COMM_WORLD_LOCAL_SIZE=2 "
          "= OMPI_COMM_WORLD_SIZE), so the store defaults to 127.0.0.1:29500. Export MASTER_ADDR/MASTER_PORT or pass "
          "--master-addr/--master-port to choose another.\n");
    // Only the port missing: the given address is kept.
    log.clear();
    LaunchInfo p = de::detect(mpi0.with("MASTER_ADDR", "localhost"), {}, kTcp);
    CHECK(p.master_addr == "localhost");
    CHECK(p.master_port == 29500);
    REQUIRE(log.lines().size() == 1);
    CHECK(log.lines()[0].find("MASTER_PORT not set; all 2 ranks") != std::string::npos);
    // A backend without a store (mpi) gets no invented address.
    CHECK(de::detect(mpi1).master_addr.empty());
    CHECK(de::detect(mpi1, {}, {.need_master_addr = false}).master_port == 0);
    // env:// proves locality only with an explicit LOCAL_WORLD_SIZE.
    Env env_local = Env::from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}});
    CHECK(de::detect(env_local, {}, kTcp).master_addr == "127.0.0.1");
    // mpiexec.mpich -n 2 on one host (captured): MPI_LOCALNRANKS = PMI_SIZE proves locality.
    const LaunchInfo hydra = de::detect(mpich_hydra_local_rank1(), {}, kTcp);
    CHECK(hydra.master_addr == "127.0.0.1");
    CHECK(hydra.master_port == 29500);
  }

  TEST_CASE("half of the env:// pair without a launcher is an error, not a silent single process") {
    // Before: WORLD_SIZE=2 alone detected a single process (rank 0 of 1) and trained alone.
    CHECK_THROWS_WITH_AS(
        de::detect(Env::from({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}), {}, kTcp),
        "ddp: WORLD_SIZE=2 is set but RANK is not, and no launcher was detected (no TORCHELASTIC_RUN_ID, "
        "OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_* or SLURM_PROCID); guessed launcher: env:// variables, which needs "
        "RANK as well. Export both RANK (0 to WORLD_SIZE - 1, one per process) and WORLD_SIZE, with MASTER_ADDR and "
        "MASTER_PORT, or start the job with a launcher (ddprun, torchrun, mpirun, srun); or unset WORLD_SIZE to run "
        "a single process.",
        ConfigError);
    CHECK_THROWS_WITH_AS(de::detect(Env::from({{"RANK", "1"}})),
                         "ddp: RANK=1 is set but WORLD_SIZE is not, and no launcher was detected (no "
                         "TORCHELASTIC_RUN_ID, OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_* or SLURM_PROCID); guessed "
                         "launcher: env:// variables, which needs WORLD_SIZE as well. Export both RANK (0 to "
                         "WORLD_SIZE - 1, one per process) and WORLD_SIZE, with MASTER_ADDR and MASTER_PORT, or start "
                         "the job with a launcher (ddprun, torchrun, mpirun, srun).",
                         ConfigError);
    // A single process stays one: WORLD_SIZE=1 or RANK=0 alone, and flags that give the pair themselves.
    CHECK(de::detect(Env::from({{"WORLD_SIZE", "1"}})).world_size == 1);
    CHECK(de::detect(Env::from({{"RANK", "0"}})).world_size == 1);
    CHECK(de::detect(Env::from({{"WORLD_SIZE", "2"}}), flags_of({"--rank=1", "--world-size=2"})).rank == 1);
    // A launcher's own variables win: under Open MPI a stray WORLD_SIZE is not looked at.
    CHECK(de::detect(openmpi_rank1().with("WORLD_SIZE", "2")).rank == 1);
  }

  TEST_CASE("store address: missing for a multi-process job is an error that says what to set") {
    struct Row {
      const char* name;
      Env env;
      LaunchFlags flags;
      DetectOptions opts;
      const char* message;
    };
    Env mpi4 = openmpi_two_nodes_rank2().with("MASTER_ADDR", std::nullopt).with("MASTER_PORT", std::nullopt);
    Env srun_no_list = srun_rank4()
                           .with("SLURM_STEP_NODELIST", std::nullopt)
                           .with("SLURM_JOB_NODELIST", std::nullopt)
                           .with("SLURM_NODELIST", std::nullopt);
    const Row rows[] = {
        {"mpirun, two nodes", mpi4, {}, kTcp,
         "ddp: launched by Open MPI mpirun (OMPI_COMM_WORLD_SIZE=4) but MASTER_ADDR is not set; --backend tcp needs "
         "it. Run mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ..., or use --backend mpi."},
        {"mpirun, nccl", mpi4, {}, {.need_master_addr = true, .backend = "nccl"},
         "ddp: launched by Open MPI mpirun (OMPI_COMM_WORLD_SIZE=4) but MASTER_ADDR is not set; --backend nccl needs "
         "it. Run mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ..., or use --backend mpi."},
        {"mpirun, port only", mpi4.with("MASTER_ADDR", "1.2.3.4"), {}, kTcp,
         "ddp: launched by Open MPI mpirun (OMPI_COMM_WORLD_SIZE=4) but MASTER_PORT is not set; --backend tcp needs "
         "it. Run mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ..., or use --backend mpi."},
        {"mpirun, one node, defaults disabled",
         openmpi_rank1().with("MASTER_ADDR", std::nullopt),
         {},
         {.need_master_addr = true, .default_local_master = false},
         "ddp: launched by Open MPI mpirun (OMPI_COMM_WORLD_SIZE=2) but MASTER_ADDR is not set; --backend tcp needs "
         "it. Run mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ..., or use --backend mpi."},
        {"mpirun with rank flag", mpi4, flags_of({"--rank=3"}), kTcp,
         "ddp: launched by Open MPI mpirun and command-line flags (OMPI_COMM_WORLD_SIZE=4) but MASTER_ADDR is not "
         "set; --backend tcp needs it. Run mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ..., or use "
         "--backend mpi."},
        {"mpiexec (Hydra)", mpich_hydra_rank3(), {}, kTcp,
         "ddp: launched by MPICH/Intel MPI mpiexec (PMI) (PMI_SIZE=4) but MASTER_ADDR is not set; --backend tcp needs "
         "it. Run mpiexec -genv MASTER_ADDR <host of rank 0> -genv MASTER_PORT 29500 ..., or use --backend mpi."},
        {"mpirun_rsh", mvapich_rank2().with("MASTER_ADDR", std::nullopt), {}, kTcp,
         "ddp: launched by MVAPICH2 mpirun (MV2_COMM_WORLD_SIZE=4) but MASTER_ADDR is not set; --backend tcp needs "
         "it. Run mpirun_rsh ... MASTER_ADDR=<host of rank 0> MASTER_PORT=29500 ./program, or use --backend mpi."},
        {"env:// by hand", Env::from({{"RANK", "1"}, {"WORLD_SIZE", "2"}}), {}, kTcp,
         "ddp: launched by env:// variables (WORLD_SIZE=2) but MASTER_ADDR is not set; --backend tcp needs it. Export "
         "MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port> for every rank, or pass --master-addr and "
         "--master-port."},
        {"env:// by hand, backend mpi", Env::from({{"RANK", "1"}, {"WORLD_SIZE", "2"}}), {},
         {.need_master_addr = true, .backend = "mpi"},
         "ddp: launched by env:// variables (WORLD_SIZE=2) but MASTER_ADDR is not set; --backend mpi needs it. Export "
         "MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port> for every rank, or pass --master-addr and "
         "--master-port."},
        {"flags only", Env{}, flags_of({"--rank=1", "--world-size=2"}), kTcp,
         "ddp: launched by command-line flags (--world-size=2) but MASTER_ADDR is not set; --backend tcp needs it. "
         "Export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port> for every rank, or pass --master-addr and "
         "--master-port."},
        {"srun without node list", srun_no_list, {}, kTcp,
         "ddp: launched by Slurm srun (SLURM_STEP_NUM_TASKS=7) but MASTER_ADDR is not set; --backend tcp needs it. "
         "Export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<port> before srun (no SLURM_*NODELIST or SLURM_JOB_ID "
         "to derive them from), or pass --master-addr and --master-port."},
        {"srun without job id", srun_rank4().with("SLURM_JOB_ID", std::nullopt), {}, kTcp,
         "ddp: launched by Slurm srun (SLURM_STEP_NUM_TASKS=7) but MASTER_PORT is not set; --backend tcp needs it. "
         "Export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<port> before srun (no SLURM_*NODELIST or SLURM_JOB_ID "
         "to derive them from), or pass --master-addr and --master-port."},
    };
    for (const auto& r : rows) {
      CAPTURE(r.name);
      CHECK_THROWS_WITH_AS(de::detect(r.env, r.flags, r.opts), r.message, ConfigError);
    }
  }

  TEST_CASE("describe and log_launch: one line, from rank 0 only") {
    LaunchInfo t = de::detect(torchrun_node1_rank5());
    CHECK(de::describe(t) ==
          "launch via torchrun: rank 5/8, local 1/4, node 1/2, store 10.0.0.1:1234 (owned by torchrun), restart 1, "
          "run none");
    LaunchInfo s = de::detect(srun_rank4().with("SLURM_PROCID", "0").with("SLURM_LOCALID", "0").with("SLURM_NODEID", "0"));
    CHECK(de::describe(s) ==
          "launch via slurm: rank 0/7, local 0/3, node 0/3, store node01:29956 (hosted by rank 0), run 123456");
    CHECK(de::describe(LaunchInfo{}) == "launch via single-process: rank 0/1, local 0/1, node 0/1, no store needed");
    ddp::test::LogCapture log;
    de::log_launch(t);  // rank 5: silent
    CHECK(log.lines().empty());
    de::log_launch(s);
    REQUIRE(log.lines().size() == 1);
    CHECK(log.lines()[0] == "ddp: INFO: " + de::describe(s) + "\n");
  }

  TEST_CASE("to_json: every field, stable keys, parseable") {
    LaunchInfo t = de::detect(torchrun_node1_rank5());
    CHECK(de::to_json(t) ==
          R"({"rank":5,"world_size":8,"local_rank":1,"local_world_size":4,"node_rank":1,"nnodes":2,)"
          R"("master_addr":"10.0.0.1","master_port":1234,"restart_count":1,"run_id":"none",)"
          R"("launcher_owns_store":true,"source":"torchrun"})");
    auto j = nlohmann::json::parse(de::to_json(de::detect(mvapich_rank2())));
    CHECK(j.at("rank") == 2);
    CHECK(j.at("master_addr") == "h1");
    CHECK(j.at("source") == "mvapich");
    CHECK(j.size() == 12);
  }

  TEST_CASE("launch_info_from_json inverts to_json; other text is a ValueError") {
    for (const LaunchInfo& info : {de::detect(torchrun_standalone_rank0()), de::detect(srun_rank4()), LaunchInfo{}}) {
      CAPTURE(info.source);
      CHECK(de::to_json(de::launch_info_from_json(de::to_json(info))) == de::to_json(info));
    }
    CHECK_THROWS_WITH_AS(de::launch_info_from_json("{}"),
                         "ddp: '{}' is not a LaunchInfo JSON object: [json.exception.out_of_range.403] key 'rank' not "
                         "found",
                         ddp::ValueError);
    CHECK_THROWS_AS(de::launch_info_from_json("rank 0"), ddp::ValueError);
    CHECK_THROWS_AS(de::launch_info_from_json(R"({"rank":"0"})"), ddp::ValueError);
  }
}
