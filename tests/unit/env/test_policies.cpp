// env: each launcher policy on the environments the launchers really export, and their error messages.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/env/describe.hpp>
#include <ddp/env/env_url.hpp>
#include <ddp/env/mvapich.hpp>
#include <ddp/env/openmpi.hpp>
#include <ddp/env/pmi.hpp>
#include <ddp/env/slurm.hpp>
#include <ddp/env/torchrun.hpp>
#include <functional>
#include <string>

#include "check_info.hpp"
#include "launch_envs.hpp"

using ddp::ConfigError;
using ddp::env::LaunchInfo;
namespace de = ddp::env;
using namespace ddp_test;

static_assert(de::LauncherPolicy<de::Torchrun>);
static_assert(de::LauncherPolicy<de::EnvUrl>);
static_assert(de::LauncherPolicy<de::OpenMpi>);
static_assert(de::LauncherPolicy<de::Pmi>);
static_assert(de::LauncherPolicy<de::Mvapich>);
static_assert(de::LauncherPolicy<de::Slurm>);

namespace {
// Compares every field at once; on failure doctest prints both JSON lines.
}  // namespace

TEST_SUITE("env") {
  TEST_CASE("torchrun: static rendezvous (captured from torchrun 1.13), multi-node, standalone") {
    REQUIRE(de::Torchrun::detected(torchrun_local_rank1()));
    check_info(de::Torchrun::read(torchrun_local_rank1()),
               {.rank = 1, .world_size = 2, .local_rank = 1, .local_world_size = 2, .node_rank = 0, .nnodes = 1,
                .master_addr = "127.0.0.1", .master_port = 29731, .restart_count = 0, .run_id = "none",
                .launcher_owns_store = true, .source = "torchrun"});
    check_info(de::Torchrun::read(torchrun_node1_rank5()),
               {.rank = 5, .world_size = 8, .local_rank = 1, .local_world_size = 4, .node_rank = 1, .nnodes = 2,
                .master_addr = "10.0.0.1", .master_port = 1234, .restart_count = 1, .run_id = "none",
                .launcher_owns_store = true, .source = "torchrun"});
    check_info(de::Torchrun::read(torchrun_standalone_rank0()),
               {.rank = 0, .world_size = 2, .local_rank = 0, .local_world_size = 2, .node_rank = 0, .nnodes = 1,
                .master_addr = "localhost", .master_port = 52993, .restart_count = 0,
                .run_id = "cd216613-3c17-4eee-a6fb-94d66c221544", .launcher_owns_store = false,
                .source = "torchrun"});
  }

  TEST_CASE("torchrun: without GROUP_WORLD_SIZE the node layout is derived from the sizes") {
    auto env = torchrun_node1_rank5().with("GROUP_WORLD_SIZE", std::nullopt).with("GROUP_RANK", std::nullopt);
    LaunchInfo info = de::Torchrun::read(env);
    CHECK(info.nnodes == 2);      // 8 / 4
    CHECK(info.node_rank == 1);   // 5 / 4
  }

  TEST_CASE("env://: torch.distributed.launch --use_env (1.8) and hand-set scripts") {
    auto use_env = launch_use_env_rank3();
    REQUIRE(de::EnvUrl::detected(use_env));
    CHECK_FALSE(de::EnvUrl::detected(torchrun_local_rank1()));  // TORCHELASTIC_RUN_ID: torchrun's
    // LOCAL_RANK without LOCAL_WORLD_SIZE: the count is unknown, WORLD_SIZE is its upper bound.
    check_info(de::EnvUrl::read(use_env),
               {.rank = 3, .world_size = 4, .local_rank = 1, .local_world_size = 4, .node_rank = 0, .nnodes = 1,
                .master_addr = "1.2.3.4", .master_port = 1234, .source = "env"});
    CHECK_FALSE(de::EnvUrl::all_ranks_local(use_env, de::EnvUrl::read(use_env)));
    // RANK and WORLD_SIZE only: each process alone on its node.
    auto bare = de::Env::from({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
    check_info(de::EnvUrl::read(bare), {.rank = 1, .world_size = 2, .local_rank = 0, .local_world_size = 1,
                                        .node_rank = 1, .nnodes = 2, .source = "env"});
    // Everything given, as a k8s operator would.
    auto full = de::Env::from({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"},
                               {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"MASTER_ADDR", "trainer-0"},
                               {"MASTER_PORT", "23456"}});
    check_info(de::EnvUrl::read(full), {.rank = 6, .world_size = 8, .local_rank = 2, .local_world_size = 4,
                                        .node_rank = 1, .nnodes = 2, .master_addr = "trainer-0",
                                        .master_port = 23456, .source = "env"});
  }

  TEST_CASE("Open MPI: one node (captured from mpirun 4.1.4) and the tutorial's two nodes") {
    REQUIRE(de::OpenMpi::detected(openmpi_rank1()));
    check_info(de::OpenMpi::read(openmpi_rank1()),
               {.rank = 1, .world_size = 2, .local_rank = 1, .local_world_size = 2, .node_rank = 0, .nnodes = 1,
                .master_addr = "localhost", .master_port = 29500, .source = "openmpi"});
    // OMPI_COMM_WORLD_NODE_RANK=0 but the process is on node 1: node_rank comes from rank / local size.
    check_info(de::OpenMpi::read(openmpi_two_nodes_rank2()),
               {.rank = 2, .world_size = 4, .local_rank = 0, .local_world_size = 2, .node_rank = 1, .nnodes = 2,
                .master_addr = "1.2.3.4", .master_port = 1234, .source = "openmpi"});
    // Uneven hosts (-H a:3,b:1): the node index is unknown and reported as 0, never out of range.
    auto uneven = de::Env::from({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                                 {"OMPI_MCA_orte_num_nodes", "2"}});
    LaunchInfo info = de::OpenMpi::read(uneven);
    CHECK(info.nnodes == 2);
    CHECK(info.node_rank == 0);
    CHECK(info.master_addr.empty());
    CHECK(info.master_port == 0);
  }

  TEST_CASE("PMI: MPICH/Intel MPI Hydra and Cray PALS; PMIX_RANK when PMI_RANK is absent") {
    REQUIRE(de::Pmi::detected(mpich_hydra_rank3()));
    check_info(de::Pmi::read(mpich_hydra_rank3()), {.rank = 3, .world_size = 4, .local_rank = 1, .local_world_size = 2,
                                                   .node_rank = 1, .nnodes = 2, .source = "pmi"});
    REQUIRE(de::Pmi::detected(cray_pals_rank6()));
    check_info(de::Pmi::read(cray_pals_rank6()), {.rank = 6, .world_size = 8, .local_rank = 2, .local_world_size = 4,
                                                 .node_rank = 1, .nnodes = 2, .source = "pmi"});
    auto pmix = mpich_hydra_rank3().with("PMI_RANK", std::nullopt).with("PMIX_RANK", "2");
    CHECK(de::Pmi::read(pmix).rank == 2);
    // Slurm's own PMI plugins export PMI_RANK without a local count: not this policy's job.
    CHECK_FALSE(de::Pmi::detected(de::Env::from({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"PMI_FD", "5"}})));
    CHECK_FALSE(de::Pmi::detected(de::Env::from({{"PMIX_RANK", "0"}})));
  }

  TEST_CASE("PMI: the environments captured from MPICH 4.0.2's Hydra (one host, uneven hosts, -pmi-port)") {
    check_info(de::Pmi::read(mpich_hydra_local_rank1()),
               {.rank = 1, .world_size = 2, .local_rank = 1, .local_world_size = 2, .node_rank = 0, .nnodes = 1,
                .source = "pmi"});
    // -hosts a:1,b:3: rank 0 is alone on its host. The node fields are the uniform-layout guess (4 nodes of
    // 1), pinned here because Hydra exports nothing better; rank, size and the local pair are exact.
    check_info(de::Pmi::read(mpich_hydra_uneven_rank0()),
               {.rank = 0, .world_size = 4, .local_rank = 0, .local_world_size = 1, .node_rank = 0, .nnodes = 4,
                .source = "pmi"});
    // -pmi-port: the marker is there, so Pmi owns the job, and read() says why it cannot size it.
    CHECK(de::Pmi::detected(mpich_hydra_pmi_port_rank1()));
  }

  TEST_CASE("MVAPICH2 mpirun_rsh") {
    REQUIRE(de::Mvapich::detected(mvapich_rank2()));
    check_info(de::Mvapich::read(mvapich_rank2()),
               {.rank = 2, .world_size = 4, .local_rank = 0, .local_world_size = 2, .node_rank = 1, .nnodes = 2,
                .master_addr = "h1", .master_port = 29500, .source = "mvapich"});
  }

  TEST_CASE("Slurm: srun with the node list expanded for the address and the job-id port rule") {
    REQUIRE(de::Slurm::detected(srun_rank4()));
    // 3,2(x2) tasks per node: node 1 runs 2 tasks. Address: first host of node[01-03].
    // Port: 29500 + 123456 % 1000 = 29956, computed here independently of the policy.
    check_info(de::Slurm::read(srun_rank4()),
               {.rank = 4, .world_size = 7, .local_rank = 1, .local_world_size = 2, .node_rank = 1, .nnodes = 3,
                .master_addr = "node01", .master_port = 29500 + 123456 % 1000, .run_id = "123456",
                .source = "slurm"});
    CHECK(de::Slurm::port_for_job(123456) == 29956);
    CHECK(de::Slurm::port_for_job(7000) == 29500);
    CHECK(de::Slurm::port_for_job(999) == 30499);
  }

  TEST_CASE("Slurm: the environment real srun gave task 1 of `srun -N1 -n2` (tests/integration/slurm)") {
    REQUIRE(de::Slurm::detected(srun_captured_task1()));
    check_info(de::Slurm::read(srun_captured_task1()),
               {.rank = 1, .world_size = 2, .local_rank = 1, .local_world_size = 2, .node_rank = 0, .nnodes = 1,
                .master_addr = "vm", .master_port = 29500 + 1, .run_id = "1", .source = "slurm"});
  }

  TEST_CASE("Slurm: the environment real srun gave task 2 of `srun -N2 -n3` on the second node (tests/integration/slurm)") {
    // 2,1 tasks per node: the second node's only task; the store is on the first host of ddpnode[0-1].
    check_info(de::Slurm::read(srun_captured_node1_task2()),
               {.rank = 2, .world_size = 3, .local_rank = 0, .local_world_size = 1, .node_rank = 1, .nnodes = 2,
                .master_addr = "ddpnode0", .master_port = 29500 + 956467 % 1000, .run_id = "956467",
                .source = "slurm"});
  }

  TEST_CASE("Slurm: the batch script itself (no srun, no SLURM_STEP_ID) is one process or refused") {
    // sbatch -n1: the script's program is the whole job.
    Env one = sbatch_allocation().with("SLURM_NTASKS", "1").with("SLURM_NPROCS", "1").with("SLURM_NNODES", "1");
    REQUIRE(de::Slurm::detected(one));
    check_info(de::Slurm::read(one), {.run_id = "123456", .source = "slurm"});
    // More tasks: refused, naming srun (the message is checked in test_bad_inputs.cpp).
    CHECK_THROWS_AS(de::Slurm::read(sbatch_allocation()), ConfigError);
    // The same process under srun has SLURM_STEP_ID and the step's counts.
    CHECK(de::Slurm::read(srun_rank4()).world_size == 7);
  }

  TEST_CASE("Slurm: MASTER_ADDR/MASTER_PORT win over the node list and the port rule; fallbacks") {
    auto env = srun_rank4().with("MASTER_ADDR", "10.9.8.7").with("MASTER_PORT", "2222");
    LaunchInfo info = de::Slurm::read(env);
    CHECK(info.master_addr == "10.9.8.7");
    CHECK(info.master_port == 2222);
    // Multi-group, zero-padded step node list: the first host is the first of the first group.
    CHECK(de::Slurm::read(srun_rank4().with("SLURM_STEP_NODELIST", "gpu[07-09,12],cpu1")).master_addr == "gpu07");
    // Without step variables, the job's are used; SLURM_NTASKS_PER_NODE is the last resort.
    auto job_only = srun_rank4()
                        .with("SLURM_STEP_NODELIST", std::nullopt)
                        .with("SLURM_STEP_NUM_TASKS", std::nullopt)
                        .with("SLURM_STEP_NUM_NODES", std::nullopt)
                        .with("SLURM_STEP_TASKS_PER_NODE", std::nullopt)
                        .with("SLURM_JOB_NODELIST", "rack[2-3]n[1-2]");
    info = de::Slurm::read(job_only);
    CHECK(info.master_addr == "rack2n1");
    CHECK(info.world_size == 7);
    CHECK(info.nnodes == 3);
    CHECK(info.local_world_size == 2);
    auto uniform = de::Env::from({{"SLURM_PROCID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                  {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NTASKS_PER_NODE", "4"}});
    info = de::Slurm::read(uniform);
    CHECK(info.local_world_size == 4);
    CHECK(info.master_addr.empty());  // no node list: detect() asks for MASTER_ADDR
    CHECK(info.master_port == 0);     // no job id: no port rule
  }

  TEST_CASE("policy errors name the launcher's own variable, the launcher and the fix") {
    struct Row {
      const char* name;
      std::function<LaunchInfo()> read;
      const char* message;
    };
    const std::string why = " The values disagree: check how the job was started (launcher options, exported "
                            "variables, launch flags).";
    const Row rows[] = {
        {"torchrun missing LOCAL_WORLD_SIZE",
         [] { return de::Torchrun::read(torchrun_node1_rank5().with("LOCAL_WORLD_SIZE", std::nullopt)); },
         "ddp: launched by torchrun but LOCAL_WORLD_SIZE is not set. torchrun always exports it; if you start workers "
         "yourself, export LOCAL_WORLD_SIZE or pass --local-world-size."},
        {"torchrun missing MASTER_ADDR",
         [] { return de::Torchrun::read(torchrun_node1_rank5().with("MASTER_ADDR", std::nullopt)); },
         "ddp: launched by torchrun but MASTER_ADDR is not set. torchrun always exports it; if you start workers "
         "yourself, export MASTER_ADDR or pass --master-addr."},
        {"torchrun RANK=3x", [] { return de::Torchrun::read(torchrun_node1_rank5().with("RANK", "3x")); },
         "ddp: RANK='3x' (from torchrun) is not an integer."},
        {"torchrun bad port", [] { return de::Torchrun::read(torchrun_node1_rank5().with("MASTER_PORT", "70000")); },
         "ddp: MASTER_PORT='70000' (from torchrun) is not a TCP port; use a number from 1 to 65535."},
        {"env bad LOCAL_RANK", [] { return de::EnvUrl::read(launch_use_env_rank3().with("LOCAL_RANK", "one")); },
         "ddp: LOCAL_RANK='one' (from env:// variables) is not an integer."},
        {"openmpi missing local rank",
         [] { return de::OpenMpi::read(openmpi_rank1().with("OMPI_COMM_WORLD_LOCAL_RANK", std::nullopt)); },
         "ddp: launched by Open MPI mpirun but OMPI_COMM_WORLD_LOCAL_RANK is not set. Open MPI mpirun always exports "
         "it; if you start workers yourself, export OMPI_COMM_WORLD_LOCAL_RANK."},
        {"pmi missing PMI_SIZE", [] { return de::Pmi::read(mpich_hydra_rank3().with("PMI_SIZE", std::nullopt)); },
         "ddp: launched by MPICH/Intel MPI mpiexec (PMI) but PMI_SIZE is not set. MPICH/Intel MPI mpiexec (PMI) always "
         "exports it; if you start workers yourself, export PMI_SIZE."},
        {"pmi without any rank",
         [] { return de::Pmi::read(mpich_hydra_rank3().with("PMI_RANK", std::nullopt)); },
         "ddp: launched by MPICH/Intel MPI mpiexec (PMI) but PMI_RANK is not set. MPICH/Intel MPI mpiexec (PMI) always "
         "exports it; if you start workers yourself, export PMI_RANK."},
        {"pmi in Hydra's -pmi-port mode", [] { return de::Pmi::read(mpich_hydra_pmi_port_rank1()); },
         "ddp: launched by MPICH/Intel MPI mpiexec (PMI) in -pmi-port mode (PMI_PORT=vm:36559, PMI_ID=1), where Hydra "
         "exports no PMI_RANK and no PMI_SIZE, so the world size is unknown. Run mpiexec without -pmi-port (Hydra's "
         "default exports both), or export RANK and WORLD_SIZE yourself (mpiexec -genv WORLD_SIZE <n> sh -c "
         "'RANK=$PMI_ID exec ./program')."},
        {"mvapich bad size", [] { return de::Mvapich::read(mvapich_rank2().with("MV2_COMM_WORLD_SIZE", "4.0")); },
         "ddp: MV2_COMM_WORLD_SIZE='4.0' (from MVAPICH2 mpirun) is not an integer."},
        {"slurm missing SLURM_LOCALID",
         [] { return de::Slurm::read(srun_rank4().with("SLURM_LOCALID", std::nullopt)); },
         "ddp: launched by Slurm srun but SLURM_LOCALID is not set. Slurm srun always exports it; if you start "
         "workers yourself, export SLURM_LOCALID."},
        {"slurm bad node list", [] { return de::Slurm::read(srun_rank4().with("SLURM_STEP_NODELIST", "node[01-")); },
         "ddp: SLURM_STEP_NODELIST='node[01-' (from Slurm srun) is not a Slurm host list: '[' without ']'. Export "
         "MASTER_ADDR=<host of rank 0> to bypass it."},
        {"slurm bad tasks list",
         [] { return de::Slurm::read(srun_rank4().with("SLURM_STEP_TASKS_PER_NODE", "3,2(x2")); },
         "ddp: SLURM_STEP_TASKS_PER_NODE='3,2(x2' (from Slurm srun) is not a Slurm task count list like '2(x3),1': "
         "entry '2(x2' is not N or N(xK). srun sets it; do not set it by hand."},
        {"slurm node id beyond the tasks list", [] { return de::Slurm::read(srun_rank4().with("SLURM_NODEID", "3")); },
         "ddp: SLURM_NODEID=3 (from Slurm srun) has no entry in SLURM_STEP_TASKS_PER_NODE='3,2(x2)' (3 nodes). The "
         "Slurm environment is inconsistent: start the tasks with srun."},
        {"slurm job id not a number", [] { return de::Slurm::read(srun_rank4().with("SLURM_JOB_ID", "abc")); },
         "ddp: SLURM_JOB_ID='abc' (from Slurm srun) is not a job number, so the store port (29500 + SLURM_JOB_ID % "
         "1000) cannot be derived. Export MASTER_PORT or pass --master-port."},
    };
    for (const auto& r : rows) {
      CAPTURE(r.name);
      CHECK_THROWS_WITH_AS(r.read(), r.message, ConfigError);
    }
  }

  TEST_CASE("range checks name the launcher's variables") {
    struct Row {
      const char* name;
      std::function<LaunchInfo()> read;
      std::string message;
    };
    const std::string why = " The values disagree: check how the job was started (launcher options, exported "
                            "variables, launch flags).";
    const Row rows[] = {
        {"rank == world", [] { return de::Torchrun::read(torchrun_node1_rank5().with("RANK", "8")); },
         "ddp: RANK=8 (from torchrun) is out of range: it must be in [0, 8) since WORLD_SIZE=8." + why},
        {"negative rank", [] { return de::Torchrun::read(torchrun_node1_rank5().with("RANK", "-1")); },
         "ddp: RANK=-1 (from torchrun) is out of range: it must be in [0, 8) since WORLD_SIZE=8." + why},
        {"zero world", [] { return de::EnvUrl::read(de::Env::from({{"RANK", "0"}, {"WORLD_SIZE", "0"}})); },
         "ddp: WORLD_SIZE=0 (from env:// variables) must be at least 1." + why},
        {"local rank == local size", [] { return de::Torchrun::read(torchrun_node1_rank5().with("LOCAL_RANK", "4")); },
         "ddp: LOCAL_RANK=4 (from torchrun) is out of range: it must be in [0, 4) since LOCAL_WORLD_SIZE=4." + why},
        {"local size > world",
         [] { return de::Torchrun::read(torchrun_node1_rank5().with("LOCAL_WORLD_SIZE", "16")); },
         "ddp: LOCAL_WORLD_SIZE=16 (from torchrun) exceeds WORLD_SIZE=8." + why},
        {"local size 0", [] { return de::Torchrun::read(torchrun_node1_rank5().with("LOCAL_WORLD_SIZE", "0")); },
         "ddp: LOCAL_WORLD_SIZE=0 (from torchrun) must be at least 1." + why},
        {"group rank == groups", [] { return de::Torchrun::read(torchrun_node1_rank5().with("GROUP_RANK", "2")); },
         "ddp: GROUP_RANK=2 (from torchrun) is out of range: it must be in [0, 2) since GROUP_WORLD_SIZE=2." + why},
        {"zero groups", [] { return de::Torchrun::read(torchrun_node1_rank5().with("GROUP_WORLD_SIZE", "0")); },
         "ddp: GROUP_WORLD_SIZE=0 (from torchrun) must be at least 1." + why},
        {"groups > world",
         [] { return de::Torchrun::read(torchrun_node1_rank5().with("GROUP_WORLD_SIZE", "9")); },
         "ddp: GROUP_WORLD_SIZE=9 (from torchrun) exceeds WORLD_SIZE=8." + why},
        {"openmpi rank == size", [] { return de::OpenMpi::read(openmpi_rank1().with("OMPI_COMM_WORLD_RANK", "2")); },
         "ddp: OMPI_COMM_WORLD_RANK=2 (from Open MPI mpirun) is out of range: it must be in [0, 2) since "
         "OMPI_COMM_WORLD_SIZE=2." + why},
        {"pmi local rank", [] { return de::Pmi::read(mpich_hydra_rank3().with("MPI_LOCALRANKID", "2")); },
         "ddp: MPI_LOCALRANKID=2 (from MPICH/Intel MPI mpiexec (PMI)) is out of range: it must be in [0, 2) since "
         "MPI_LOCALNRANKS=2." + why},
        {"mvapich rank", [] { return de::Mvapich::read(mvapich_rank2().with("MV2_COMM_WORLD_RANK", "9")); },
         "ddp: MV2_COMM_WORLD_RANK=9 (from MVAPICH2 mpirun) is out of range: it must be in [0, 4) since "
         "MV2_COMM_WORLD_SIZE=4." + why},
        {"slurm rank", [] { return de::Slurm::read(srun_rank4().with("SLURM_PROCID", "7")); },
         "ddp: SLURM_PROCID=7 (from Slurm srun) is out of range: it must be in [0, 7) since SLURM_STEP_NUM_TASKS=7." +
             why},
        {"slurm node id", [] { return de::Slurm::read(srun_rank4().with("SLURM_STEP_NUM_NODES", "1")); },
         "ddp: SLURM_NODEID=1 (from Slurm srun) is out of range: it must be in [0, 1) since SLURM_STEP_NUM_NODES=1." +
             why},
    };
    for (const auto& r : rows) {
      CAPTURE(r.name);
      CHECK_THROWS_WITH_AS(r.read(), r.message.c_str(), ConfigError);
    }
  }
}
