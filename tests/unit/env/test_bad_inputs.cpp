// env: one table of bad launch inputs (environment variables of every launcher family, launch flags, and
// contradictory mixes of both) with the exact ConfigError each must give.
// SPDX-License-Identifier: MIT
//
// Why a table: every row goes through the public entry point, detect(env, flags, options), as a program
// started by that launcher would, so each message is checked where users meet it. A message must name the
// variable or flag, the launcher it came from, and what to do. Rows already covered by the policy, range,
// store-address and flag-parsing tables next door (test_policies.cpp, test_detect.cpp, test_flags.cpp,
// test_hostlist.cpp) are not repeated here.
#include <doctest/doctest.h>

#include <ddp/env/detect.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launch_envs.hpp"

using ddp::ConfigError;
using ddp::env::DetectOptions;
using ddp::env::Env;
namespace de = ddp::env;
using namespace ddp_test;

namespace {

// The tail every range error carries (policy.hpp).
const std::string kWhy =
    " The values disagree: check how the job was started (launcher options, exported variables, launch flags).";

struct Row {
  const char* name;
  Env env;
  std::vector<std::string> args;  // launch flags, as they follow the program name on the command line
  std::string message;
  DetectOptions opts = {};
};

// `srun -N2 -n8 --ntasks-per-node=4`, task 5, reduced to the uniform count (real srun also exports the
// per-node lists, which win; this exercises the last fallback).
Env srun_uniform_rank5() {
  return Env::from({{"SLURM_PROCID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                    {"SLURM_NODEID", "1"},
                    {"SLURM_NNODES", "2"}, {"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_JOB_ID", "77"},
                    {"SLURM_JOB_NODELIST", "n[1-2]"}});
}

}  // namespace

TEST_SUITE("env") {
  TEST_CASE("bad launch inputs: every launcher family, the flags, and contradictory mixes (table)") {
    const Env torchrun = torchrun_node1_rank5();      // RANK=5 WORLD_SIZE=8 LOCAL_RANK=1 LOCAL_WORLD_SIZE=4
    const Env env_url = launch_use_env_rank3();       // RANK=3 WORLD_SIZE=4 LOCAL_RANK=1, no LOCAL_WORLD_SIZE
    const Env ompi = openmpi_two_nodes_rank2();       // rank 2 of 4, local 0 of 2, 2 nodes
    const Env hydra = mpich_hydra_rank3();            // PMI_RANK=3 PMI_SIZE=4 MPI_LOCALRANKID=1 MPI_LOCALNRANKS=2
    const Env mv2 = mvapich_rank2();                  // rank 2 of 4, local 0 of 2
    const Env srun = srun_rank4();                    // task 4 of 7 on node 1 of 3 (3,2(x2) tasks per node)
    const DetectOptions tcp{.need_master_addr = true};
    const Row rows[] = {
        // ---- torchrun (TORCHELASTIC_RUN_ID) ----
        {"torchrun: RANK not a number", torchrun.with("RANK", "3x"), {},
         "ddp: RANK='3x' (from torchrun) is not an integer."},
        {"torchrun: WORLD_SIZE not a number", torchrun.with("WORLD_SIZE", "eight"), {},
         "ddp: WORLD_SIZE='eight' (from torchrun) is not an integer."},
        {"torchrun: RANK past 32 bits", torchrun.with("RANK", "2147483648"), {},
         "ddp: RANK='2147483648' (from torchrun) is out of range: it must fit in 32 bits (-2147483648 to 2147483647)."},
        {"torchrun: WORLD_SIZE past 64 bits", torchrun.with("WORLD_SIZE", "123456789012345678901234567890"), {},
         "ddp: WORLD_SIZE='123456789012345678901234567890' (from torchrun) is out of range: it must fit in 32 bits "
         "(-2147483648 to 2147483647)."},
        {"torchrun: WORLD_SIZE 0", torchrun.with("WORLD_SIZE", "0"), {},
         "ddp: WORLD_SIZE=0 (from torchrun) must be at least 1." + kWhy},
        {"torchrun: negative LOCAL_RANK", torchrun.with("LOCAL_RANK", "-1"), {},
         "ddp: LOCAL_RANK=-1 (from torchrun) is out of range: it must be in [0, 4) since LOCAL_WORLD_SIZE=4." + kWhy},
        {"torchrun: MASTER_PORT 0", torchrun.with("MASTER_PORT", "0"), {},
         "ddp: MASTER_PORT='0' (from torchrun) is not a TCP port; use a number from 1 to 65535."},
        {"torchrun: negative MASTER_PORT", torchrun.with("MASTER_PORT", "-29500"), {},
         "ddp: MASTER_PORT='-29500' (from torchrun) is not a TCP port; use a number from 1 to 65535."},
        {"torchrun: MASTER_PORT exported empty", torchrun.with("MASTER_PORT", ""), {},
         "ddp: launched by torchrun but MASTER_PORT is not set. torchrun always exports it; if you start workers "
         "yourself, export MASTER_PORT or pass --master-port."},
        {"torchrun: TORCHELASTIC_RESTART_COUNT garbage", torchrun.with("TORCHELASTIC_RESTART_COUNT", "x"), {},
         "ddp: TORCHELASTIC_RESTART_COUNT='x' (from torchrun) is not an integer."},
        {"torchrun: GROUP_WORLD_SIZE without GROUP_RANK", torchrun.with("GROUP_RANK", std::nullopt), {},
         "ddp: launched by torchrun but GROUP_RANK is not set. torchrun always exports it; if you start workers "
         "yourself, export GROUP_RANK."},
        {"torchrun: negative GROUP_RANK", torchrun.with("GROUP_RANK", "-1"), {},
         "ddp: GROUP_RANK=-1 (from torchrun) is out of range: it must be in [0, 2) since GROUP_WORLD_SIZE=2." + kWhy},

        // ---- env:// (RANK + WORLD_SIZE, no TORCHELASTIC_RUN_ID) ----
        {"env://: negative WORLD_SIZE", env_url.with("WORLD_SIZE", "-3"), {},
         "ddp: WORLD_SIZE=-3 (from env:// variables) must be at least 1." + kWhy},
        {"env://: RANK == WORLD_SIZE", env_url.with("RANK", "4"), {},
         "ddp: RANK=4 (from env:// variables) is out of range: it must be in [0, 4) since WORLD_SIZE=4." + kWhy},
        {"env://: RANK with a leading space", env_url.with("RANK", " 1"), {},
         "ddp: RANK=' 1' (from env:// variables) is not an integer."},
        {"env://: MASTER_PORT with a suffix", env_url.with("MASTER_PORT", "29500/tcp"), {},
         "ddp: MASTER_PORT='29500/tcp' (from env:// variables) is not a TCP port; use a number from 1 to 65535."},
        {"env://: LOCAL_RANK beyond LOCAL_WORLD_SIZE", env_url.with("LOCAL_WORLD_SIZE", "2").with("LOCAL_RANK", "3"),
         {},
         "ddp: LOCAL_RANK=3 (from env:// variables) is out of range: it must be in [0, 2) since LOCAL_WORLD_SIZE=2." +
             kWhy},
        {"env://: GROUP_WORLD_SIZE without GROUP_RANK", env_url.with("GROUP_WORLD_SIZE", "2"), {},
         "ddp: GROUP_WORLD_SIZE=2 (from env:// variables) is set but GROUP_RANK is not. Export GROUP_RANK (this "
         "node's index, 0 to 1) as well, or neither."},

        // ---- Open MPI (OMPI_COMM_WORLD_SIZE) ----
        {"Open MPI: rank not a number", ompi.with("OMPI_COMM_WORLD_RANK", "two"), {},
         "ddp: OMPI_COMM_WORLD_RANK='two' (from Open MPI mpirun) is not an integer."},
        {"Open MPI: negative size", ompi.with("OMPI_COMM_WORLD_SIZE", "-2"), {},
         "ddp: OMPI_COMM_WORLD_SIZE=-2 (from Open MPI mpirun) must be at least 1." + kWhy},
        {"Open MPI: local size missing", ompi.with("OMPI_COMM_WORLD_LOCAL_SIZE", std::nullopt), {},
         "ddp: launched by Open MPI mpirun but OMPI_COMM_WORLD_LOCAL_SIZE is not set. Open MPI mpirun always exports "
         "it; if you start workers yourself, export OMPI_COMM_WORLD_LOCAL_SIZE."},
        {"Open MPI: local rank == local size", ompi.with("OMPI_COMM_WORLD_LOCAL_RANK", "2"), {},
         "ddp: OMPI_COMM_WORLD_LOCAL_RANK=2 (from Open MPI mpirun) is out of range: it must be in [0, 2) since "
         "OMPI_COMM_WORLD_LOCAL_SIZE=2." + kWhy},
        {"Open MPI: local size > size", ompi.with("OMPI_COMM_WORLD_LOCAL_SIZE", "8"), {},
         "ddp: OMPI_COMM_WORLD_LOCAL_SIZE=8 (from Open MPI mpirun) exceeds OMPI_COMM_WORLD_SIZE=4." + kWhy},
        {"Open MPI: zero nodes", ompi.with("OMPI_MCA_orte_num_nodes", "0"), {},
         "ddp: OMPI_MCA_orte_num_nodes=0 (from Open MPI mpirun) must be at least 1." + kWhy},
        {"Open MPI: -x MASTER_PORT=65536", ompi.with("MASTER_PORT", "65536"), {},
         "ddp: MASTER_PORT='65536' (from Open MPI mpirun) is not a TCP port; use a number from 1 to 65535."},

        // ---- PMI: MPICH / Intel MPI Hydra, Cray PALS ----
        {"Hydra: negative PMI_RANK", hydra.with("PMI_RANK", "-1"), {},
         "ddp: PMI_RANK=-1 (from MPICH/Intel MPI mpiexec (PMI)) is out of range: it must be in [0, 4) since "
         "PMI_SIZE=4." + kWhy},
        {"Hydra: PMI_RANK >= PMI_SIZE", hydra.with("PMI_SIZE", "2"), {},
         "ddp: PMI_RANK=3 (from MPICH/Intel MPI mpiexec (PMI)) is out of range: it must be in [0, 2) since "
         "PMI_SIZE=2." + kWhy},
        {"Hydra: MPI_LOCALNRANKS not a number", hydra.with("MPI_LOCALNRANKS", "2x"), {},
         "ddp: MPI_LOCALNRANKS='2x' (from MPICH/Intel MPI mpiexec (PMI)) is not an integer."},
        {"Hydra: only PMIX_RANK, garbage", hydra.with("PMI_RANK", std::nullopt).with("PMIX_RANK", "x"), {},
         "ddp: PMIX_RANK='x' (from MPICH/Intel MPI mpiexec (PMI)) is not an integer."},
        {"Cray PALS: PMI_LOCAL_RANK missing", cray_pals_rank6().with("PMI_LOCAL_RANK", std::nullopt), {},
         "ddp: launched by MPICH/Intel MPI mpiexec (PMI) but PMI_LOCAL_RANK is not set. MPICH/Intel MPI mpiexec (PMI) "
         "always exports it; if you start workers yourself, export PMI_LOCAL_RANK."},

        // ---- MVAPICH2 (MV2_COMM_WORLD_SIZE) ----
        {"MVAPICH2: local size missing", mv2.with("MV2_COMM_WORLD_LOCAL_SIZE", std::nullopt), {},
         "ddp: launched by MVAPICH2 mpirun but MV2_COMM_WORLD_LOCAL_SIZE is not set. MVAPICH2 mpirun always exports "
         "it; if you start workers yourself, export MV2_COMM_WORLD_LOCAL_SIZE."},
        {"MVAPICH2: local rank == local size", mv2.with("MV2_COMM_WORLD_LOCAL_RANK", "2"), {},
         "ddp: MV2_COMM_WORLD_LOCAL_RANK=2 (from MVAPICH2 mpirun) is out of range: it must be in [0, 2) since "
         "MV2_COMM_WORLD_LOCAL_SIZE=2." + kWhy},
        {"MVAPICH2: rank == size", mv2.with("MV2_COMM_WORLD_RANK", "4"), {},
         "ddp: MV2_COMM_WORLD_RANK=4 (from MVAPICH2 mpirun) is out of range: it must be in [0, 4) since "
         "MV2_COMM_WORLD_SIZE=4." + kWhy},
        {"MVAPICH2: MASTER_PORT not a number", mv2.with("MASTER_PORT", "abc"), {},
         "ddp: MASTER_PORT='abc' (from MVAPICH2 mpirun) is not a TCP port; use a number from 1 to 65535."},

        // ---- Slurm srun (SLURM_PROCID) ----
        {"srun: SLURM_PROCID not a number", srun.with("SLURM_PROCID", "four"), {},
         "ddp: SLURM_PROCID='four' (from Slurm srun) is not an integer."},
        {"srun: negative SLURM_LOCALID", srun.with("SLURM_LOCALID", "-1"), {},
         "ddp: SLURM_LOCALID=-1 (from Slurm srun) is out of range: it must be in [0, 2) since "
         "SLURM_STEP_TASKS_PER_NODE=2." + kWhy},
        {"srun: SLURM_NODEID missing", srun.with("SLURM_NODEID", std::nullopt), {},
         "ddp: launched by Slurm srun but SLURM_NODEID is not set. Slurm srun always exports it; if you start workers "
         "yourself, export SLURM_NODEID."},
        {"srun: negative SLURM_NODEID", srun.with("SLURM_NODEID", "-1"), {},
         "ddp: SLURM_NODEID=-1 (from Slurm srun) has no entry in SLURM_STEP_TASKS_PER_NODE='3,2(x2)' (3 nodes). The "
         "Slurm environment is inconsistent: start the tasks with srun."},
        {"srun: zero tasks", srun.with("SLURM_STEP_NUM_TASKS", "0"), {},
         "ddp: SLURM_STEP_NUM_TASKS=0 (from Slurm srun) must be at least 1." + kWhy},
        {"srun: negative SLURM_JOB_ID", srun.with("SLURM_JOB_ID", "-5"), {},
         "ddp: SLURM_JOB_ID='-5' (from Slurm srun) is not a job number, so the store port (29500 + SLURM_JOB_ID % "
         "1000) cannot be derived. Export MASTER_PORT or pass --master-port."},
        {"srun: MASTER_PORT out of range", srun.with("MASTER_PORT", "99999"), {},
         "ddp: MASTER_PORT='99999' (from Slurm srun) is not a TCP port; use a number from 1 to 65535."},
        {"sbatch script without srun, 8 tasks", sbatch_allocation(), {},
         "ddp: this process runs in the batch script of Slurm job 123456 (SLURM_PROCID is set but SLURM_STEP_ID is "
         "not: it is not an srun task), and the job has SLURM_NTASKS=8 tasks, which would wait for ranks nobody "
         "starts. Start the program with srun in the script (`srun ./prog`, one rank per task; see "
         "examples/slurm/ddp.sbatch), or run torchrun there, or export RANK, WORLD_SIZE, MASTER_ADDR and "
         "MASTER_PORT (env://)."},
        {"srun --ntasks-per-node: count not a number", srun_uniform_rank5().with("SLURM_NTASKS_PER_NODE", "4x"), {},
         "ddp: SLURM_NTASKS_PER_NODE='4x' (from Slurm srun) is not an integer."},
        {"srun --ntasks-per-node: SLURM_LOCALID beyond it", srun_uniform_rank5().with("SLURM_LOCALID", "4"), {},
         "ddp: SLURM_LOCALID=4 (from Slurm srun) is out of range: it must be in [0, 4) since "
         "SLURM_NTASKS_PER_NODE=4." + kWhy},

        // ---- launch flags alone (no launcher) ----
        {"flags: negative --rank", Env{}, {"--rank=-1", "--world-size=2"},
         "ddp: --rank=-1 (from command-line flags) is out of range: it must be in [0, 2) since --world-size=2." + kWhy},
        {"flags: --rank == --world-size", Env{}, {"--rank", "2", "--world-size", "2"},
         "ddp: --rank=2 (from command-line flags) is out of range: it must be in [0, 2) since --world-size=2." + kWhy},
        {"flags: --world-size 0", Env{}, {"--rank=0", "--world-size=0"},
         "ddp: --world-size=0 (from command-line flags) must be at least 1." + kWhy},
        {"flags: --local-world-size 0", Env{}, {"--rank=0", "--world-size=2", "--local-world-size=0"},
         "ddp: --local-world-size=0 (from command-line flags) must be at least 1." + kWhy},
        {"flags: --local-rank beyond --local-world-size", Env{},
         {"--rank=0", "--world-size=4", "--local-rank=2", "--local-world-size=2"},
         "ddp: --local-rank=2 (from command-line flags) is out of range: it must be in [0, 2) since "
         "--local-world-size=2." + kWhy},
        {"flags: --rank without --world-size", Env{}, {"--rank=1"},
         "ddp: --rank=1 was given without --world-size and no launcher was detected (no TORCHELASTIC_RUN_ID, RANK, "
         "OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_* or SLURM_PROCID). Pass both flags to every process, or start it "
         "with a launcher."},
        {"flags: --world-size without --rank", Env{}, {"--world-size=4"},
         "ddp: --world-size=4 was given without --rank and no launcher was detected (no TORCHELASTIC_RUN_ID, RANK, "
         "OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_* or SLURM_PROCID). Pass both flags to every process, or start it "
         "with a launcher."},
        {"flags: --local-world-size > --world-size", Env{}, {"--rank=0", "--world-size=2", "--local-world-size=4"},
         "ddp: --local-world-size=4 (from command-line flags) exceeds --world-size=2." + kWhy},
        {"flags: negative --master-port", Env{}, {"--master-port=-1"},
         "ddp: --master-port='-1' is not a TCP port; use a number from 1 to 65535."},
        {"flags: --master-port not a number", Env{}, {"--master-port", "http"},
         "ddp: --master-port='http' is not a TCP port; use a number from 1 to 65535."},
        {"flags: --rank not a number (space form)", Env{}, {"--rank", "1x", "--world-size=2"},
         "ddp: --rank='1x' is not an integer."},
        {"flags: legacy --local_rank without a value", Env{}, {"--local_rank"},
         "ddp: --local_rank needs a value, e.g. --local_rank=0."},
        {"flags: --rank twice, different values", Env{}, {"--rank=1", "--world-size=2", "--rank", "0"},
         "ddp: --rank was given twice with different values (1 and 0); pass it once."},
        {"flags: --local-rank with LOCAL_RANK garbage", Env::from({{"LOCAL_RANK", "x"}}),
         {"--rank=0", "--world-size=1", "--local-rank=0"},
         "ddp: LOCAL_RANK='x' (from the environment) is not an integer."},

        // ---- contradictory flags over a launcher ----
        {"torchrun + --rank beyond WORLD_SIZE", torchrun, {"--rank=8"},
         "ddp: --rank=8 (from torchrun and command-line flags) is out of range: it must be in [0, 8) since "
         "WORLD_SIZE=8." + kWhy},
        {"torchrun + --world-size below RANK", torchrun, {"--world-size=4"},
         "ddp: RANK=5 (from torchrun and command-line flags) is out of range: it must be in [0, 4) since "
         "--world-size=4." + kWhy},
        {"torchrun + --local-rank contradicting LOCAL_RANK", torchrun, {"--local-rank=2"},
         "ddp: --local-rank=2 contradicts LOCAL_RANK=1 (from torchrun). Both give this process's rank on its node; "
         "drop the flag or fix the variable."},
        {"Open MPI + --world-size below the rank", openmpi_rank1(), {"--world-size=1"},
         "ddp: OMPI_COMM_WORLD_RANK=1 (from Open MPI mpirun and command-line flags) is out of range: it must be in "
         "[0, 1) since --world-size=1." + kWhy},
        {"Open MPI + --local-rank beyond the local size", ompi, {"--local-rank=5"},
         "ddp: --local-rank=5 (from Open MPI mpirun and command-line flags) is out of range: it must be in [0, 2) "
         "since OMPI_COMM_WORLD_LOCAL_SIZE=2." + kWhy},
        {"Hydra + --local-world-size beyond PMI_SIZE", hydra, {"--local-world-size=8"},
         "ddp: --local-world-size=8 (from MPICH/Intel MPI mpiexec (PMI) and command-line flags) exceeds PMI_SIZE=4." +
             kWhy},
        {"MVAPICH2 + empty --master-addr", mv2, {"--master-addr="},
         "ddp: --master-addr is empty; pass the host of rank 0, e.g. --master-addr=10.0.0.1."},
        {"srun + --rank beyond the tasks", srun, {"--rank=7"},
         "ddp: --rank=7 (from Slurm srun and command-line flags) is out of range: it must be in [0, 7) since "
         "SLURM_STEP_NUM_TASKS=7." + kWhy},
        {"env:// + --world-size below RANK", env_url, {"--world-size=2"},
         "ddp: RANK=3 (from env:// variables and command-line flags) is out of range: it must be in [0, 2) since "
         "--world-size=2." + kWhy},
        {"env:// + only --master-port, tcp backend, no MASTER_ADDR", env_url.with("MASTER_ADDR", std::nullopt),
         {"--master-port=29501"},
         "ddp: launched by env:// variables and command-line flags (WORLD_SIZE=4) but MASTER_ADDR is not set; "
         "--backend tcp needs it. Export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port> for every rank, or "
         "pass --master-addr and --master-port.",
         tcp},
    };
    for (const auto& r : rows) {
      const std::string row = r.name;
      CAPTURE(row);
      auto run = [&] {
        std::vector<std::string> argv{"./prog"};
        argv.insert(argv.end(), r.args.begin(), r.args.end());
        return de::detect(r.env, de::extract_launch_flags(argv), r.opts);
      };
      CHECK_THROWS_WITH_AS(run(), r.message.c_str(), ConfigError);
    }
  }
}
