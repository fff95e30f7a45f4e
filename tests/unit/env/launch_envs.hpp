// env tests: realistic environments, as the launchers really export them (see each comment for the source).
// SPDX-License-Identifier: MIT
#pragma once

#include <ddp/env/env.hpp>

namespace ddp_test {

using ddp::env::Env;

// torchrun 1.13, static rendezvous, captured here with
// `torchrun --redirects 9:1 --tee 9:1 --nproc_per_node=2 --master_port=29731 --no_python ./penv.sh`.
inline Env torchrun_local_rank1() {
  return Env::from({{"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "1"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29731"}, {"OMP_NUM_THREADS", "1"}, {"RANK", "1"},
                    {"ROLE_NAME", "default"}, {"ROLE_RANK", "1"}, {"ROLE_WORLD_SIZE", "2"},
                    {"TORCHELASTIC_ERROR_FILE", "/tmp/torchelastic_md3eyaps/none_vgdhzyu1/attempt_0/1/error.json"},
                    {"TORCHELASTIC_MAX_RESTARTS", "0"}, {"TORCHELASTIC_RESTART_COUNT", "0"},
                    {"TORCHELASTIC_RUN_ID", "none"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"WORLD_SIZE", "2"},
                    {"PATH", "/usr/bin:/bin"}});
}

// torchrun --nnodes=2 --node_rank=1 --nproc_per_node=4 --master_addr=10.0.0.1 --master_port=1234
// --max-restarts=3, second node, after one restart (same variables as above, multi-node values).
inline Env torchrun_node1_rank5() {
  return Env::from({{"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                    {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}, {"OMP_NUM_THREADS", "1"}, {"RANK", "5"},
                    {"ROLE_NAME", "default"}, {"ROLE_RANK", "5"}, {"ROLE_WORLD_SIZE", "8"},
                    {"TORCHELASTIC_MAX_RESTARTS", "3"}, {"TORCHELASTIC_RESTART_COUNT", "1"},
                    {"TORCHELASTIC_RUN_ID", "none"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"WORLD_SIZE", "8"}});
}

// torchrun --standalone --nproc_per_node=2, captured here: c10d rendezvous, the agent does not host the
// workers' store (TORCHELASTIC_USE_AGENT_STORE=False) and MASTER_ADDR is "localhost".
inline Env torchrun_standalone_rank0() {
  return Env::from({{"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "52993"}, {"OMP_NUM_THREADS", "1"}, {"RANK", "0"},
                    {"ROLE_NAME", "default"}, {"ROLE_RANK", "0"}, {"ROLE_WORLD_SIZE", "2"},
                    {"TORCHELASTIC_MAX_RESTARTS", "0"}, {"TORCHELASTIC_RESTART_COUNT", "0"},
                    {"TORCHELASTIC_RUN_ID", "cd216613-3c17-4eee-a6fb-94d66c221544"},
                    {"TORCHELASTIC_USE_AGENT_STORE", "False"}, {"WORLD_SIZE", "2"}});
}

// torch.distributed.launch --use_env from PyTorch 1.8 (before it ran torchrun underneath):
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS; no LOCAL_WORLD_SIZE.
inline Env launch_use_env_rank3() {
  return Env::from({{"MASTER_ADDR", "1.2.3.4"}, {"MASTER_PORT", "1234"}, {"WORLD_SIZE", "4"}, {"RANK", "3"},
                    {"LOCAL_RANK", "1"}, {"OMP_NUM_THREADS", "1"}});
}

// Open MPI 4.1.4, captured here with
// `mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=localhost -x MASTER_PORT=29500 env`.
inline Env openmpi_rank1() {
  return Env::from({{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}, {"OMPI_APP_CTX_NUM_PROCS", "2"},
                    {"OMPI_COMMAND", "sh"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                    {"OMPI_COMM_WORLD_NODE_RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"OMPI_FIRST_RANKS", "0"}, {"OMPI_MCA_ess_base_jobid", "1515585537"},
                    {"OMPI_MCA_ess_base_vpid", "1"}, {"OMPI_MCA_orte_app_num", "0"},
                    {"OMPI_MCA_orte_ess_num_procs", "2"}, {"OMPI_MCA_orte_launch", "1"},
                    {"OMPI_MCA_orte_num_nodes", "1"}, {"OMPI_UNIVERSE_SIZE", "2"}, {"PMIX_NAMESPACE", "1515585537"},
                    {"PMIX_RANK", "1"}, {"PMIX_SERVER_URI2", "1515585536.0;tcp4://127.0.0.1:44951"}});
}

// Open MPI 4.1, the tutorial's two-node command, rank 2 (first on the second host):
// `mpirun -np 4 -H 1.2.3.4:2,5.6.7.8:2 -x MASTER_ADDR=1.2.3.4 -x MASTER_PORT=1234 -map-by slot ...`.
// OMPI_COMM_WORLD_NODE_RANK=0 although the process runs on node 1: it is the rank among this node's
// processes (over all app contexts), not a node index.
inline Env openmpi_two_nodes_rank2() {
  return Env::from({{"MASTER_ADDR", "1.2.3.4"}, {"MASTER_PORT", "1234"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_COMM_WORLD_NODE_RANK", "0"},
                    {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_MCA_orte_num_nodes", "2"},
                    {"OMPI_UNIVERSE_SIZE", "4"}, {"PMIX_RANK", "2"}});
}

// MPICH 4.0.2 Hydra (Debian's mpich), captured here; tests/integration/mpich/hydra_env_test.cpp checks these tables
// against the real mpiexec.mpich on every run (the same names; the same values but the descriptors).
// Two "hosts" on one machine: `mpiexec.mpich -launcher fork -hosts ddp-node-a,ddp-node-b -ppn 2 -n 4 env`,
// rank 3 (on ddp-node-b).
inline Env mpich_hydra_rank3() {
  return Env::from({{"GFORTRAN_UNBUFFERED_PRECONNECTED", "y"}, {"HYDI_CONTROL_FD", "9"},
                    {"MPIR_CVAR_CH3_INTERFACE_HOSTNAME", "ddp-node-b"}, {"MPI_LOCALNRANKS", "2"},
                    {"MPI_LOCALRANKID", "1"}, {"PMI_FD", "7"}, {"PMI_RANK", "3"}, {"PMI_SIZE", "4"}});
}

// `mpiexec.mpich -n 2 env` on one host (here named vm), rank 1: no MASTER_* (Hydra exports no address).
inline Env mpich_hydra_local_rank1() {
  return Env::from({{"GFORTRAN_UNBUFFERED_PRECONNECTED", "y"}, {"HYDI_CONTROL_FD", "7"},
                    {"MPIR_CVAR_CH3_INTERFACE_HOSTNAME", "vm"}, {"MPI_LOCALNRANKS", "2"}, {"MPI_LOCALRANKID", "1"},
                    {"PMI_FD", "8"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
}

// `mpiexec.mpich -pmi-port -n 2 env`, rank 1: PMI_ID and PMI_PORT replace PMI_FD, PMI_RANK and PMI_SIZE.
inline Env mpich_hydra_pmi_port_rank1() {
  return Env::from({{"GFORTRAN_UNBUFFERED_PRECONNECTED", "y"}, {"HYDI_CONTROL_FD", "7"},
                    {"MPIR_CVAR_CH3_INTERFACE_HOSTNAME", "vm"}, {"MPI_LOCALNRANKS", "2"}, {"MPI_LOCALRANKID", "1"},
                    {"PMI_ID", "1"}, {"PMI_PORT", "vm:36559"}});
}

// Uneven layout: `mpiexec.mpich -launcher fork -hosts ddp-node-a:1,ddp-node-b:3 -n 4 env`, rank 0, alone on
// ddp-node-a.
inline Env mpich_hydra_uneven_rank0() {
  return Env::from({{"GFORTRAN_UNBUFFERED_PRECONNECTED", "y"}, {"HYDI_CONTROL_FD", "7"},
                    {"MPIR_CVAR_CH3_INTERFACE_HOSTNAME", "ddp-node-a"}, {"MPI_LOCALNRANKS", "1"},
                    {"MPI_LOCALRANKID", "0"}, {"PMI_FD", "6"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "4"}});
}

// HPE Cray PALS: `mpiexec -n 8 --ppn 4 ./prog`, rank 6.
inline Env cray_pals_rank6() {
  return Env::from({{"PMI_RANK", "6"}, {"PMI_SIZE", "8"}, {"PMI_LOCAL_RANK", "2"}, {"PMI_LOCAL_SIZE", "4"},
                    {"PALS_RANKID", "6"}, {"PALS_NODEID", "1"}, {"PALS_APID", "e3b0c442"}});
}

// MVAPICH2 2.3 mpirun_rsh, from MVAPICH2's user guide (MVAPICH is not packaged in Debian, so this table
// cannot be captured here): `mpirun_rsh -np 4 h1 h1 h2 h2 MASTER_ADDR=h1 MASTER_PORT=29500 ./prog`, rank 2.
inline Env mvapich_rank2() {
  return Env::from({{"MV2_COMM_WORLD_RANK", "2"}, {"MV2_COMM_WORLD_SIZE", "4"}, {"MV2_COMM_WORLD_LOCAL_RANK", "0"},
                    {"MV2_COMM_WORLD_LOCAL_SIZE", "2"}, {"MPIRUN_RANK", "2"}, {"MPIRUN_NPROCS", "4"},
                    {"MPIRUN_ID", "12345"}, {"MASTER_ADDR", "h1"}, {"MASTER_PORT", "29500"}});
}

// Real srun, captured: `srun -N1 -n2 -l env` on tests/integration/slurm's one-node cluster (Debian's Slurm 22.05.8, node
// vm, job 1), task 1, every SLURM_* variable (SLURM_LABELIO=1 comes from -l; SLURM_CONF and SLURM_SUBMIT_DIR
// named the test's temporary directory). The policy must read this as is.
inline Env srun_captured_task1() {
  return Env::from({{"SLURMD_NODENAME", "vm"}, {"SLURM_CLUSTER_NAME", "ddptest"}, {"SLURM_CONF", "/tmp/d/slurm.conf"},
                    {"SLURM_CPUS_ON_NODE", "2"}, {"SLURM_GTIDS", "0,1"}, {"SLURM_JOBID", "1"},
                    {"SLURM_JOB_CPUS_PER_NODE", "2"}, {"SLURM_JOB_GID", "0"}, {"SLURM_JOB_ID", "1"},
                    {"SLURM_JOB_NAME", "env"}, {"SLURM_JOB_NODELIST", "vm"}, {"SLURM_JOB_NUM_NODES", "1"},
                    {"SLURM_JOB_PARTITION", "debug"}, {"SLURM_JOB_UID", "0"}, {"SLURM_JOB_USER", "root"},
                    {"SLURM_LABELIO", "1"}, {"SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"}, {"SLURM_LOCALID", "1"},
                    {"SLURM_NNODES", "1"}, {"SLURM_NODEID", "0"}, {"SLURM_NODELIST", "vm"}, {"SLURM_NPROCS", "2"},
                    {"SLURM_NTASKS", "2"}, {"SLURM_PRIO_PROCESS", "0"}, {"SLURM_PROCID", "1"},
                    {"SLURM_SRUN_COMM_HOST", "127.0.0.1"}, {"SLURM_SRUN_COMM_PORT", "40163"}, {"SLURM_STEPID", "0"},
                    {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_LAUNCHER_PORT", "40163"}, {"SLURM_STEP_NODELIST", "vm"},
                    {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2"},
                    {"SLURM_SUBMIT_DIR", "/tmp/d"}, {"SLURM_SUBMIT_HOST", "vm"}, {"SLURM_TASKS_PER_NODE", "2"},
                    {"SLURM_TASK_PID", "12"}, {"SLURM_TOPOLOGY_ADDR", "vm"}, {"SLURM_TOPOLOGY_ADDR_PATTERN", "node"},
                    {"SLURM_UMASK", "0022"}, {"SLURM_WORKING_CLUSTER", "ddptest:127.0.0.1:36817:9728:109"}});
}

// Real srun on two nodes, captured: `srun -N2 -n3 -l env` on tests/integration/slurm's two-node cluster (network
// namespaces ddpnode0/1 at 10.213.7.1/2, job 956467), task 2: the second node's only task (2,1 per node).
inline Env srun_captured_node1_task2() {
  return Env::from({{"SLURMD_NODENAME", "ddpnode1"}, {"SLURM_CLUSTER_NAME", "ddptest"},
                    {"SLURM_CONF", "/tmp/d/slurm.conf"}, {"SLURM_CPUS_ON_NODE", "1"}, {"SLURM_GTIDS", "2"},
                    {"SLURM_JOBID", "956467"}, {"SLURM_JOB_CPUS_PER_NODE", "2,1"}, {"SLURM_JOB_GID", "0"},
                    {"SLURM_JOB_ID", "956467"}, {"SLURM_JOB_NAME", "env"}, {"SLURM_JOB_NODELIST", "ddpnode[0-1]"},
                    {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_JOB_PARTITION", "debug"}, {"SLURM_JOB_UID", "0"},
                    {"SLURM_JOB_USER", "root"}, {"SLURM_LABELIO", "1"}, {"SLURM_LAUNCH_NODE_IPADDR", "10.213.7.1"},
                    {"SLURM_LOCALID", "0"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "1"},
                    {"SLURM_NODELIST", "ddpnode[0-1]"}, {"SLURM_NPROCS", "3"}, {"SLURM_NTASKS", "3"},
                    {"SLURM_PRIO_PROCESS", "0"}, {"SLURM_PROCID", "2"}, {"SLURM_SRUN_COMM_HOST", "10.213.7.1"},
                    {"SLURM_SRUN_COMM_PORT", "33549"}, {"SLURM_STEPID", "0"}, {"SLURM_STEP_ID", "0"},
                    {"SLURM_STEP_LAUNCHER_PORT", "33549"}, {"SLURM_STEP_NODELIST", "ddpnode[0-1]"},
                    {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NUM_TASKS", "3"}, {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
                    {"SLURM_SUBMIT_DIR", "/tmp/d"}, {"SLURM_SUBMIT_HOST", "ddpnode0"}, {"SLURM_TASKS_PER_NODE", "2,1"},
                    {"SLURM_TASK_PID", "11"}, {"SLURM_TOPOLOGY_ADDR", "ddpnode1"},
                    {"SLURM_TOPOLOGY_ADDR_PATTERN", "node"}, {"SLURM_UMASK", "0022"},
                    {"SLURM_WORKING_CLUSTER", "ddptest:10.213.7.1:6817:9728:109"}});
}

// srun -N3 -n7 ./prog on node[01-03] (block distribution 3,2,2), rank 4 on node02: the captured sets above
// (every variable the policy or a fallback reads, and the neighbours that must not confuse it) with the
// values of three nodes, compressed as Slurm writes node and task lists.
inline Env srun_rank4() {
  return Env::from({{"SLURM_CLUSTER_NAME", "c"}, {"SLURM_JOB_ID", "123456"}, {"SLURM_JOBID", "123456"},
                    {"SLURM_JOB_NODELIST", "node[01-03]"}, {"SLURM_NODELIST", "node[01-03]"},
                    {"SLURM_JOB_NUM_NODES", "3"}, {"SLURM_NNODES", "3"}, {"SLURM_NTASKS", "7"}, {"SLURM_NPROCS", "7"},
                    {"SLURM_TASKS_PER_NODE", "3,2(x2)"}, {"SLURM_JOB_CPUS_PER_NODE", "3,2(x2)"},
                    {"SLURM_CPUS_ON_NODE", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEPID", "0"},
                    {"SLURM_STEP_NODELIST", "node[01-03]"}, {"SLURM_STEP_NUM_NODES", "3"},
                    {"SLURM_STEP_NUM_TASKS", "7"}, {"SLURM_STEP_TASKS_PER_NODE", "3,2(x2)"},
                    {"SLURM_PROCID", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"}, {"SLURM_GTIDS", "3,4"},
                    {"SLURM_TASK_PID", "4242"}, {"SLURM_SRUN_COMM_HOST", "10.0.0.9"},
                    {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.9"}, {"SLURM_SUBMIT_HOST", "login1"},
                    {"SLURMD_NODENAME", "node02"}, {"SLURM_TOPOLOGY_ADDR", "node02"}});
}

// The batch script's own environment (sbatch -N2 -n8, no srun), as captured (`sbatch -N1 -n2` on the test
// cluster) with two nodes' values: SLURM_PROCID=0 and the job's counts, but no SLURM_STEP_ID/SLURM_STEP_*.
// Also what `mpirun` started from the script inherits.
inline Env sbatch_allocation() {
  return Env::from({{"SLURM_JOB_ID", "123456"}, {"SLURM_JOBID", "123456"}, {"SLURM_JOB_NODELIST", "node[01-02]"},
                    {"SLURM_NODELIST", "node[01-02]"}, {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_NNODES", "2"},
                    {"SLURM_NTASKS", "8"}, {"SLURM_NPROCS", "8"}, {"SLURM_TASKS_PER_NODE", "4(x2)"},
                    {"SLURM_JOB_CPUS_PER_NODE", "4(x2)"}, {"SLURM_CPUS_ON_NODE", "4"}, {"SLURM_GTIDS", "0"},
                    {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}, {"SLURM_TASK_PID", "25"},
                    {"SLURM_NODE_ALIASES", "(null)"}, {"SLURMD_NODENAME", "node01"}, {"SLURM_TOPOLOGY_ADDR", "node01"}});
}

// Merges `extra` over `base`: a launcher started inside another (srun torchrun, mpirun inside Slurm).
inline Env nested(const Env& base, const Env& extra) {
  Env out = base;
  for (const auto& [k, v] : extra.vars()) out = out.with(k, v);
  return out;
}

}  // namespace ddp_test
