#!/usr/bin/python3
# Jobs under a real Slurm (issue 16): every case brings up a Slurm cluster of its own on this machine (munged,
# slurmctld and slurmd of Debian's slurm-wlm 22.05 with a generated slurm.conf) and runs our programs through
# srun, sbatch and scancel the way users do. Cases:
#   srun_message_passing  srun -N1 -n2 message_passing --backend tcp: the Slurm policy (SLURM_* variables)
#   srun_resnet           srun -n2 resnet --use_syn (tiny): ranks, local ranks, store address and port
#   srun_mingpt           srun -n2 mingpt (a tiny GPT, 3 steps): each task trains as its rank, rank 0 snapshots
#   srun_torchrun         srun -N1 -n1 torchrun --nproc_per_node 2 (one agent per node, as PyTorch's
#                         multinode tutorial does): torchrun's variables win over SLURM_*
#   sbatch_templates      sbatch of examples/slurm/ddp.sbatch and torchrun.sbatch, waited for, output checked
#   scancel               scancel of a running 2-rank job: every rank exits; prints scancel -> last exit
#   srun_env              srun -n2 env (the captured set is tests/unit/env's srun table) and probe's launch info;
#                         a batch script that starts a program without srun is refused
#   two_nodes             two nodes (network namespaces of tests/integration/netns, a slurmd each): srun -N2 -n3 env,
#                         message_passing across the veth, probe
# Run by CTest: slurm_tests.py CASE --message-passing PATH --resnet PATH --probe PATH --mingpt PATH --examples DIR.
# Exit 0 pass, 1 fail, 77 skip (not root, Slurm or munge not installed, daemons refuse to start).
# SPDX-License-Identifier: MIT
#
# The cluster (docs/decisions/0034). Everything lives in a private directory /tmp/ddpslurm-<driver pid>-
# <random>: a munge key and munged's socket (AuthInfo=socket=... points Slurm at it, so the machine's own
# munged and /etc/munge are never used), slurm.conf (free loopback ports, state, spool, logs and pid files
# inside the directory, NodeAddr=127.0.0.1, CPUs as `slurmd -C` reports them, proctrack/linuxproc,
# task/none, no cgroups, select/cons_tres), and the jobs' output. Clients (srun, sbatch, squeue, scancel)
# find it through SLURM_CONF; every other SLURM_* variable of the driver's own environment is dropped, so
# the suite also runs inside a Slurm job.
# Containment: each daemon runs as PID 1 of its own PID namespace (`unshare --pid --fork --kill-child
# --mount-proc`; the private /proc lets proctrack/linuxproc see the namespace's own pids), and that unshare
# gets PR_SET_PDEATHSIG=SIGKILL from the driver. If the driver dies, even by SIGKILL, the kernel kills
# unshare, unshare's --kill-child kills the daemon, and a dying PID 1 takes every process of its namespace
# with it: slurmstepd and every task of every job. A later run deletes directories whose driver is gone.
import argparse
import atexit
import ctypes
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "netns"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
import netns_tests as netns  # noqa: E402  (network namespaces for the two-node case, shared checks)
from netns_tests import RESNET_TINY, check_message_passing  # noqa: E402
from driver import PY, SKIP, Skip, expect  # noqa: E402
PREFIX = "ddpslurm-"
BUDGET_S = 100           # the whole case, including teardown, stays under the CTest TIMEOUT (120 s)
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "squeue", "scancel", "sinfo", "scontrol")
PR_SET_PDEATHSIG = 1
# tests/integration/netns names its namespaces <prefix><driver pid>-... and deletes those whose driver is no
# netns_tests.py; ours get a prefix of their own and our driver test, so neither suite deletes the other's.
NETNS_PREFIX = "ddpslurmns-"


class Timeout(Exception):
    pass


def die_with_parent():
    """preexec_fn: SIGKILL this child when the driver dies (the kernel sends it, even after SIGKILL)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def pid_is_driver(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"slurm_tests.py" in f.read()
    except OSError:
        return False


netns.PREFIX = NETNS_PREFIX
netns.pid_is_driver = pid_is_driver


def delete_leftovers():
    """Deletes the directories of earlier runs whose driver is gone (SIGKILLed): their daemons died with it."""
    tmp = tempfile.gettempdir()
    for d in os.listdir(tmp):
        m = re.match(rf"{re.escape(PREFIX)}(\d+)-", d)
        if m and int(m.group(1)) != os.getpid() and not pid_is_driver(int(m.group(1))):
            print(f"deleting leftover {os.path.join(tmp, d)}")
            shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)


def free_ports(n):
    """n distinct loopback ports that are free now (bound together, so they differ, then released)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def first_job_id(jobs=6):
    """A FirstJobId whose jobs' store ports are free now. The Slurm policy's port rule, 29500 + job % 1000, is
    the same on every cluster, and every fresh cluster would start at job 1 (port 29501): tests running side
    by side (ctest -j), or anything else on 29501, would collide. So the ids start where the next `jobs`
    ports (and the ids themselves) are free on this machine."""
    starts = list(range(29500, 30500 - jobs))
    random.shuffle(starts)
    for start in starts:
        socks = []
        try:
            for port in range(start, start + jobs):
                s = socket.socket()
                socks.append(s)
                s.bind(("0.0.0.0", port))  # rank 0's store binds the wildcard address
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return 1000 * random.randint(1, 999) + start - 29500
    raise Skip(f"no {jobs} consecutive free ports in 29500..30499")


def node_name():
    """The short hostname when it resolves (then the node list names a real host, as on a cluster: the
    Slurm policy's store address is the first host of SLURM_STEP_NODELIST); else localhost."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        print(f"note: hostname {name!r} does not resolve; the node is called localhost")
        return "localhost"


def slurmd_hardware():
    """`slurmd -C`'s CPU topology words (CPUs=2 Boards=1 ... ThreadsPerCore=1), so slurmd accepts the config."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    words = [w for w in out.split() if re.match(r"(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=", w)]
    if not any(w.startswith("CPUs=") for w in words):
        raise Skip(f"`slurmd -C` reports no CPUs: {out.strip()!r}")
    return words


CONF = """# Generated by tests/integration/slurm/slurm_tests.py: a one-node cluster in {d}
ClusterName=ddptest
SlurmctldHost={ctld}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={d}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
# scancel: SIGTERM, then SIGKILL after KillWait seconds (default 30)
KillWait=5
InactiveLimit=0
MinJobAge=300
FirstJobId={first_job}
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
    """munged, slurmctld and slurmd of a one-node cluster in a private directory (see the header).

    With nodes > 1 every node is a network namespace of tests/integration/netns (ddpnode<k> at 10.213.7.<k+1>, on one
    bridge) running a slurmd of its own (`slurmd -N ddpnode<k>`); slurmctld and the clients run in node 0,
    munged in the root namespace (its socket is a file, reachable from every namespace). The nodes are
    entered with nsenter --net plus a mount namespace of our own (for the node's /etc/hosts) rather than
    `ip netns exec`, whose fresh /sys hides /sys/fs/cgroup, without which slurmd 22.05 refuses to start
    even with proctrack/linuxproc and task/none."""

    def __init__(self, nodes=1):
        self.nodes = nodes
        self.net = None  # the netns cluster when nodes > 1
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.dir = tempfile.mkdtemp(prefix=f"{self.tag}.")
        os.chmod(self.dir, 0o755)  # munged insists that everyone may traverse its socket's directories
        self.daemons = []
        self.conf = os.path.join(self.dir, "slurm.conf")

    def env(self, extra=None):
        """The driver's environment without its own SLURM_* (the suite may run inside a job) plus SLURM_CONF."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = self.conf
        env.update(extra or {})
        return env

    def node_prefix(self, k):
        """The command prefix that runs in node k: nothing on one node."""
        if self.net is None or k is None:
            return []
        ns = self.net.nodes[k]
        return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--uts", "sh", "-c",
                f'mount --bind /etc/netns/{ns}/hosts /etc/hosts && hostname "$0" && exec "$@"',
                netns.hostname_of(k)]

    def start_daemon(self, name, cmd, node=None):
        log = open(os.path.join(self.dir, f"{name}.out"), "w")
        p = subprocess.Popen([*self.node_prefix(node), "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                              *cmd], stdout=log,
                             stderr=subprocess.STDOUT, env=self.env(), cwd=self.dir, start_new_session=True,
                             preexec_fn=die_with_parent)
        p.log, p.name = log, name
        self.daemons.append(p)
        return p

    def daemon_output(self):
        text = []
        for p in self.daemons:
            with open(os.path.join(self.dir, f"{p.name}.out")) as f:
                text.append(f"{p.name} (rc {p.poll()}):\n{f.read()[-3000:]}")
        return "\n".join(text)

    def wait_for(self, what, ready, timeout=20):
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p.name for p in self.daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"not ready after {timeout} s"
                raise Skip(f"{what}: {why}\n{self.daemon_output()}")
            time.sleep(0.1)

    def up(self):
        t0 = time.monotonic()
        d = self.dir
        for sub in ("munge", "state", "spool"):
            os.makedirs(os.path.join(d, sub))
        os.chmod(os.path.join(d, "munge"), 0o755)
        key = os.path.join(d, "munge", "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:  # munged accepts only mode 0600
            f.write(os.urandom(128))
        sock = os.path.join(d, "munge", "munge.socket")
        self.start_daemon("munged", ["munged", "-F", f"--key-file={key}", f"--socket={sock}",
                                     f"--pid-file={d}/munge/munged.pid", f"--seed-file={d}/munge/seed",
                                     f"--log-file={d}/munge/munged.log", "--num-threads=2"])
        self.wait_for("munged", lambda: os.path.exists(sock))
        hw = " ".join(slurmd_hardware())
        if self.nodes == 1:
            self.names, self.addrs = [node_name()], ["127.0.0.1"]
            ctld_port, slurmd_port = free_ports(2)
        else:
            self.net = netns.Cluster(self.nodes).up()  # its Skip is driver.Skip too
            self.names = [netns.hostname_of(k) for k in range(self.nodes)]
            self.addrs = [self.net.addr(k) for k in range(self.nodes)]
            ctld_port, slurmd_port = 6817, 6818  # Slurm's defaults: fresh namespaces have nothing listening
        self.node = self.names[0]  # the first node: rank 0's, the store's
        for name in self.names:
            os.makedirs(os.path.join(d, "spool", name))
        with open(self.conf, "w") as f:
            f.write(CONF.format(d=d, ctld=f"{self.node}({self.addrs[0]})", ctld_port=ctld_port, slurmd_port=slurmd_port,
                                node_lines="\n".join(f"NodeName={n} NodeAddr={a} {hw} State=UNKNOWN"
                                                     for n, a in zip(self.names, self.addrs)),
                                first_job=first_job_id()))
        open(os.path.join(d, "plugstack.conf"), "w").close()  # not /etc/slurm's SPANK plugins
        self.start_daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf], node=0 if self.net else None)
        for k, name in enumerate(self.names):
            self.start_daemon(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", self.conf],
                              node=k if self.net else None)

        def idle():
            p = self.client(["sinfo", "-h", "-N", "-o", "%T"], check=False, timeout=10)
            return p.returncode == 0 and p.stdout.split() == ["idle"] * self.nodes
        self.wait_for("slurmctld/slurmd (nodes idle in sinfo)", idle)
        self.cpus = int(next(w for w in slurmd_hardware() if w.startswith("CPUs="))[5:])
        print(f"cluster up in {time.monotonic() - t0:.1f} s: nodes {' '.join(self.names)} at {' '.join(self.addrs)} "
              f"({self.cpus} CPUs each), {self.conf}")

    def client(self, cmd, check=True, timeout=60, env=None):
        """Runs a Slurm client command against this cluster; returns the CompletedProcess."""
        # die_with_parent: an srun whose driver was SIGKILLed would otherwise wait for a dead slurmd.
        p = subprocess.run([*self.node_prefix(0), *cmd], capture_output=True, text=True, timeout=timeout, env=self.env(env), cwd=self.dir,
                           preexec_fn=die_with_parent)
        if check and p.returncode != 0:
            raise AssertionError(f"$ {' '.join(cmd)}\nrc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def down(self):
        for p in self.daemons:  # unshare and its daemon share the session; the namespace dies with the daemon
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.daemons:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            p.log.close()
        self.daemons = []
        if self.net is not None:
            self.net.down()  # kills what is left inside the namespaces, deletes them
            self.net = None
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- helpers

DEBUG = {"DDP_LOG_LEVEL": "debug", "DDP_TIMEOUT_MS": "30000"}


def job_port(job_id):
    """The Slurm policy's port rule, computed here independently (include/ddp/env/slurm.hpp)."""
    return 29500 + int(job_id) % 1000


def last_job(c):
    """The id of the newest job this cluster ran (finished jobs stay in scontrol for MinJobAge seconds)."""
    jobs = re.findall(r"JobId=(\d+)", c.client(["scontrol", "-o", "show", "jobs"]).stdout)
    expect(bool(jobs), "scontrol shows no job")
    return max(jobs, key=int)


def check_slurm_ranks(c, err, world, job, node_of=None):
    """What the Slurm policy made of srun's variables, from the ranks' DDP_LOG_LEVEL=debug lines (srun -l
    prefixes task t's lines with "t: "): task t is rank t of `world` (SLURM_PROCID, SLURM_STEP_NUM_TASKS),
    every rank's store client dials the first node at 29500 + job % 1000, rank 0 hosts the store there. On
    one node the tcp mesh uses shared memory, which needs every rank local (SLURM_LOCALID,
    SLURM_STEP_TASKS_PER_NODE); on several (node_of[t]: task t's node) each rank listens on its node's
    address and shared memory is off."""
    port = job_port(job)
    expect(f"0: ddp[rank 0/{world}] INFO: store server listening on 0.0.0.0:{port}" in err,
           f"rank 0 does not host the store at port {port} (job {job})", err)
    for t in range(world):
        want = f"{t}: ddp[rank {t}/{world}] DEBUG: store client {c.node}:{port} speaks"
        expect(want in err, f"task {t}: no '{want}'", err)
        ip, shm = (r"\S+", "on") if node_of is None else (re.escape(c.addrs[node_of[t]]), "off")
        expect(re.search(rf"^{t}: .*tcp mesh ready, listening on {ip} \(store prefix [^;]*; shared memory {shm}\)",
                         err, re.M) is not None, f"task {t}: no tcp mesh line with {ip}, shared memory {shm}", err)
    where = "all ranks local (shared memory on)" if node_of is None else \
        "ranks on nodes " + ",".join(str(k) for k in node_of) + ", each listening on its node's address (shm off)"
    print(f"  job {job}: tasks 0..{world - 1} are ranks 0..{world - 1}/{world}, store {c.node}:{port} "
          f"(29500 + {job} % 1000) hosted by rank 0, {where}")


def srun(c, args, timeout=60, env=None):
    p = c.client(["srun", *args], check=False, timeout=timeout, env={**DEBUG, **(env or {})})
    expect(p.returncode == 0, f"srun {' '.join(args)}: rc={p.returncode}", p.stdout, p.stderr)
    return p.stdout, p.stderr


# ---------------------------------------------------------------- cases

def case_srun_message_passing(a, c):
    # --job-name names the job for squeue; -l prefixes every line with the task id.
    out, err = srun(c, ["-N1", "-n2", "-l", "--kill-on-bad-exit=1", a.message_passing, "--backend", "tcp"])
    check_message_passing(out, 2)
    expect(re.search(r"^0: Rank 0 sent data to Rank 1", out, re.M) is not None, "task 0 is not rank 0", out)
    expect(re.search(r"^1: Rank 1 has received", out, re.M) is not None, "task 1 is not rank 1", out)
    check_slurm_ranks(c, err, 2, last_job(c))


def case_srun_resnet(a, c):
    out, err = srun(c, ["-n2", "-l", "--kill-on-bad-exit=1", a.resnet, *RESNET_TINY, "--model_dir", "models"])
    expect("epoch 0 step 3/3 loss" in out and "samples_per_sec" in out, "resnet progress/throughput lines", out, err)
    check_slurm_ranks(c, err, 2, last_job(c))
    print("  " + next(ln for ln in out.splitlines() if "samples_per_sec" in ln).strip())


def case_srun_mingpt(a, c):
    # The DDP tutorial's minGPT job (issue 19) under srun: 2 tasks, 3 steps of a tiny GPT on a text every Debian
    # machine has, a snapshot by global rank 0.
    out, err = srun(c, ["-n2", "-l", "--kill-on-bad-exit=1", a.mingpt, "--data_path", "/usr/share/common-licenses/GPL-3",
                        "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "8", "--batch_size", "4",
                        "--max_epochs", "1", "--max_iters", "3", "--log_every", "1", "--train_split", "1",
                        "--snapshot_path", "models/gpt.safetensors"])
    for task in (0, 1):
        expect(re.search(rf"^{task}: \[GPU{task}\] Epoch 1 \| Iter 2 \| Train Loss [0-9.]+$", out, re.M) is not None,
               f"task {task} is not rank {task}, or it did not train 3 steps", out, err)
    expect(re.search(r"^0: Snapshot saved at epoch 1$", out, re.M) is not None, "no snapshot from rank 0", out, err)
    check_slurm_ranks(c, err, 2, last_job(c))


def have_torch():
    p = subprocess.run([PY, "-c", "import torch.distributed.run"], capture_output=True, timeout=60)
    if p.returncode != 0:
        raise Skip("/usr/bin/python3 has no torch.distributed.run (install python3-torch)")


def probes(out):
    """{rank: launch info} from probe's "probe: {json}" lines."""
    infos = [json.loads(m) for m in re.findall(r"probe: (\{.*\})", out)]
    return {i["rank"]: i for i in infos}


# torch 1.13 spells the flags with "_"; --redirects/--tee 9:1 as in tests/integration/netns (they name local rank 9 only,
# so the workers keep writing to the agent's stdout and stderr, which srun collects).
# --monitor_interval 0.5: the agent notices its workers' exit after 0.5 s instead of 5 s (CI time).
TORCHRUN = [PY, "-m", "torch.distributed.run", "--redirects", "9:1", "--tee", "9:1", "--log_dir", "tlogs",
            "--monitor_interval", "0.5"]


def case_srun_torchrun(a, c):
    # One torchrun agent per node (srun -N1 -n1; -c gives the agent the node's CPUs for its 2 workers); the
    # workers see torchrun's RANK/LOCAL_RANK/... and srun's SLURM_PROCID=0 SLURM_NTASKS=1 together.
    have_torch()
    port = free_ports(1)[0]
    torchrun = [*TORCHRUN, "--nnodes", "1", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", f"slurm{os.getpid()}", "--no_python"]
    out, err = srun(c, ["-N1", "-n1", f"-c{c.cpus}", *torchrun, a.probe], timeout=90)
    found = probes(out)
    expect(sorted(found) == [0, 1], f"probe lines of ranks {sorted(found)}, expected [0, 1]", out, err)
    for r, info in found.items():
        expect(info["source"] == "torchrun" and info["world_size"] == 2 and info["local_rank"] == r and
               info["run_id"] == f"slurm{os.getpid()}", f"rank {r}: not torchrun's launch", info)
        expect(f"probe: rank {r} sees 2 ranks" in out, f"rank {r} did not rendezvous", out)
    print(f"  probe rank 0 under srun+torchrun: {json.dumps(found[0])}")


def wait_job(c, job, timeout):
    """Polls the job's state until it ends (sbatch --wait polls only every 10 s); returns the final state."""
    deadline = time.monotonic() + timeout
    while True:
        m = re.search(r"JobState=(\S+)", c.client(["scontrol", "-o", "show", "job", job]).stdout)
        state = m.group(1) if m else "?"
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "?"):
            return state
        expect(time.monotonic() < deadline, f"job {job} still {state} after {timeout} s")
        time.sleep(0.1)


def sbatch(c, template, args, env, timeout=60):
    """Submits template and waits for the job to end; returns (job id, its output file's text)."""
    t0 = time.monotonic()
    out = os.path.join(c.dir, f"{os.path.basename(template)}.out")
    job = c.client(["sbatch", "--parsable", f"--output={out}", *args, template], env=env).stdout.strip().split(";")[0]
    state = wait_job(c, job, timeout)
    text = open(out).read() if os.path.exists(out) else ""
    expect(state == "COMPLETED", f"sbatch {template}: job {job} {state}", text)
    print(f"  sbatch {os.path.basename(template)}: job {job} {state} after {time.monotonic() - t0:.1f} s")
    return job, text


def case_sbatch_templates(a, c):
    # The shipped templates as users submit them; their #SBATCH lines ask for 2 nodes, which this cluster
    # lacks, so the command line (which wins over #SBATCH) asks for 1 node and the machine's CPUs.
    have_torch()
    one_node = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--time=2"]
    job, text = sbatch(c, os.path.join(a.examples, "ddp.sbatch"), one_node,
                       {"DDP_PROGRAM": a.resnet, "DDP_ARGS": " ".join([*RESNET_TINY, "--model_dir", "models"]),
                        "SLURM_LABELIO": "1", **DEBUG})  # srun -l: task-labelled lines
    expect("epoch 0 step 3/3 loss" in text and "samples_per_sec" in text, "ddp.sbatch: no resnet output", text)
    check_slurm_ranks(c, text, 2, job)
    print("  ddp.sbatch: " + next(ln for ln in text.splitlines() if "samples_per_sec" in ln).strip())
    job, text = sbatch(c, os.path.join(a.examples, "torchrun.sbatch"),
                       ["--nodes=1", "--ntasks-per-node=1", f"--cpus-per-task={c.cpus}", "--time=2"],
                       {"DDP_PROGRAM": a.probe, "DDP_ARGS": "", "NPROC_PER_NODE": "2",
                        "TORCHRUN": " ".join(TORCHRUN), **DEBUG})
    found = probes(text)
    expect(sorted(found) == [0, 1], f"torchrun.sbatch: probe lines of ranks {sorted(found)}", text)
    expect(all(i["source"] == "torchrun" and i["world_size"] == 2 and i["run_id"] == job for i in found.values()),
           f"torchrun.sbatch: not torchrun's launch with --rdzv_id {job}", text)
    print(f"  torchrun.sbatch job {job}: rank 0 {json.dumps(found[0])}")


def task_pids(job):
    """Host pids of the processes that belong to Slurm job `job` (SLURM_JOB_ID=<job> in their environment)."""
    want = f"\0SLURM_JOB_ID={job}\0".encode()
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if want in b"\0" + f.read():
                    pids.append(int(p))
        except OSError:
            pass
    return pids


def case_scancel(a, c):
    # A 2-rank resnet job with far more steps than it can run in the budget, submitted with sbatch so that
    # scancel (not a dying srun) ends it; it is cancelled once both ranks train (rank 0 logged a step).
    long_run = [x if x != "3" else "100000" for x in RESNET_TINY]  # --steps_syn 3 -> 100000
    script = os.path.join(c.dir, "long.sbatch")
    with open(script, "w") as f:
        f.write("#!/bin/sh\nexec srun -l " + " ".join([a.resnet, *long_run, "--model_dir", "models"]) + "\n")
    out = os.path.join(c.dir, "long.out")
    job = c.client(["sbatch", "--parsable", "-N1", "-n2", f"--output={out}", script], env=DEBUG).stdout.strip()

    def text():
        return open(out).read() if os.path.exists(out) else ""
    deadline = time.monotonic() + 40
    while re.search(r"epoch 0 step [1-9]\d*/100000", text()) is None:
        expect(time.monotonic() < deadline, f"job {job}: no training step after 40 s", text())
        time.sleep(0.1)
    ranks = [p for p in task_pids(job) if os.path.realpath(f"/proc/{p}/exe") == os.path.realpath(a.resnet)]
    expect(len(ranks) == 2, f"job {job}: {len(ranks)} resnet tasks running, expected 2", text())

    def alive(pid):  # a zombie has exited; its parent (slurmstepd) has not collected it yet
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    t0 = time.monotonic()
    c.client(["scancel", job])
    while any(alive(p) for p in ranks):
        expect(time.monotonic() - t0 < 30, f"ranks {[p for p in ranks if alive(p)]} alive 30 s after scancel")
        time.sleep(0.01)
    dt = time.monotonic() - t0
    while c.client(["squeue", "-h", "-j", job], check=False).stdout.strip():
        expect(time.monotonic() - t0 < 30, f"job {job} still in squeue 30 s after scancel")
        time.sleep(0.1)
    left = [p for p in task_pids(job) if alive(p)]
    expect(not left, f"processes of job {job} left after scancel: {left}")
    print(f"  scancel: the last of {len(ranks)} ranks exited {dt:.2f} s after scancel; job {job} left squeue "
          f"after {time.monotonic() - t0:.2f} s; no process with SLURM_JOB_ID={job} remains")


def case_srun_env(a, c):
    out, _ = srun(c, ["-N1", "-n2", "-l", "env"])
    tasks = {0: {}, 1: {}}
    for ln in out.splitlines():
        m = re.match(r"(\d+): (SLURM\w*)=(.*)", ln)
        if m:
            tasks[int(m.group(1))][m.group(2)] = m.group(3)
    print("  captured `srun -N1 -n2 env` (task 1; SLURM_* only):")
    for k, v in sorted(tasks[1].items()):
        print(f"    {k}={v}")
    # What the Slurm policy reads (include/ddp/env/slurm.hpp): every name present, with srun's values.
    for r, env in tasks.items():
        want = {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": c.node,
                "SLURM_STEP_ID": "0"}
        for k, v in want.items():
            expect(env.get(k) == v, f"task {r}: {k}={env.get(k)!r}, expected {v!r}", out)
        expect(env.get("SLURM_JOB_ID", "").isdigit(), f"task {r}: SLURM_JOB_ID", out)
    # The policy on the same step: probe prints what detect() made of it.
    out, _ = srun(c, ["-N1", "-n2", a.probe])
    found = probes(out)
    expect(sorted(found) == [0, 1], f"probe lines of ranks {sorted(found)}", out)
    for r, info in found.items():
        job = info["run_id"]
        expect({k: info[k] for k in ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "nnodes",
                                     "master_addr", "master_port", "source")} ==
               {"rank": r, "world_size": 2, "local_rank": r, "local_world_size": 2, "node_rank": 0, "nnodes": 1,
                "master_addr": c.node, "master_port": job_port(job), "source": "slurm"},
               f"probe rank {r}: {info}")
        expect(f"probe: rank {r} sees 2 ranks" in out, f"rank {r} did not rendezvous", out)
    print(f"  probe rank 1: {json.dumps(found[1])}")
    # The batch script itself (no srun) also has SLURM_PROCID=0 and the job's SLURM_NTASKS, but no
    # SLURM_STEP_ID: the policy refuses it with a message that names srun, instead of waiting for ranks
    # that nobody starts.
    script = os.path.join(c.dir, "direct.sbatch")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\nenv | grep ^SLURM_ | sort | sed 's/^/batch: /'\n{a.probe} --timeout-ms 2000\n"
                f"echo probe exit $?\n")
    job, text = sbatch(c, script, ["-N1", "-n2"], DEBUG)
    expect("batch: SLURM_PROCID=0" in text and "batch: SLURM_STEP_ID" not in text,
           "batch script: SLURM_PROCID=0 without SLURM_STEP_ID", text)
    expect("probe exit 1" in text and "not an srun task" in text, "probe in the batch script: no refusal", text)
    print("  batch script without srun: " + next(ln for ln in text.splitlines() if "not an srun task" in ln).strip())


def case_two_nodes(a, c):
    # srun -N2 -n3: block distribution puts tasks 0,1 on ddpnode0 and task 2 on ddpnode1 (2,1 per node).
    out, _ = srun(c, ["-N2", "-n3", "-l", "env"])
    tasks = {t: dict(re.findall(rf"^{t}: (SLURM\w*)=(.*)$", out, re.M)) for t in range(3)}
    print("  captured `srun -N2 -n3 env` (task 2, on the second node; SLURM_* only):")
    for k, v in sorted(tasks[2].items()):
        print(f"    {k}={v}")
    for t, (node, local) in enumerate([(0, 0), (0, 1), (1, 0)]):
        want = {"SLURM_PROCID": str(t), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
                "SLURMD_NODENAME": c.names[node], "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NUM_NODES": "2",
                "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NODELIST": "ddpnode[0-1]", "SLURM_STEP_ID": "0"}
        for k, v in want.items():
            expect(tasks[t].get(k) == v, f"task {t}: {k}={tasks[t].get(k)!r}, expected {v!r}", out)
    out, err = srun(c, ["-N2", "-n3", "-l", "--kill-on-bad-exit=1", a.message_passing, "--backend", "tcp"])
    check_message_passing(out, 3)
    check_slurm_ranks(c, err, 3, last_job(c), node_of=[0, 0, 1])
    out, _ = srun(c, ["-N2", "-n3", a.probe])
    found = probes(out)
    expect(sorted(found) == [0, 1, 2], f"probe lines of ranks {sorted(found)}", out)
    expect({k: found[2][k] for k in ("local_rank", "local_world_size", "node_rank", "nnodes", "master_addr")} ==
           {"local_rank": 0, "local_world_size": 1, "node_rank": 1, "nnodes": 2, "master_addr": "ddpnode0"},
           f"probe rank 2: {found[2]}")
    print(f"  probe rank 2: {json.dumps(found[2])}")


case_two_nodes.nodes = 2


CASES = {k[5:]: v for k, v in dict(globals()).items() if k.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--message-passing", dest="message_passing", required=True)
    ap.add_argument("--resnet", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--mingpt", required=True)
    ap.add_argument("--examples", required=True, help="examples/slurm (the sbatch templates)")
    a = ap.parse_args()
    for k in ("message_passing", "resnet", "probe", "mingpt", "examples"):
        setattr(a, k, os.path.abspath(getattr(a, k)))  # the jobs run in the cluster's directory
    if os.geteuid() != 0:
        print("skipped: slurmd and munged need root here (they run tasks as other users)")
        return SKIP
    missing = [b for b in (*DAEMONS, *CLIENTS, "unshare") if shutil.which(b) is None]
    if missing:
        print(f"skipped: {', '.join(missing)} not found (install slurm-wlm (slurmctld, slurmd, slurm-client) and "
              f"munge)")
        return SKIP

    def on_signal(signum, _frame):
        raise Timeout(f"the case ran past {BUDGET_S} s" if signum == signal.SIGALRM else "interrupted by SIGTERM")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGALRM, on_signal)
    signal.alarm(BUDGET_S)
    delete_leftovers()
    netns.delete_leftovers()  # namespaces of two-node runs whose driver is gone (see NETNS_PREFIX)
    c = Cluster(getattr(CASES[a.case], "nodes", 1))
    atexit.register(c.down)  # a backstop for exits that skip the finally below; down() is idempotent
    t0 = time.monotonic()
    try:
        c.up()
        t1 = time.monotonic()
        CASES[a.case](a, c)
    except Skip as e:
        print(f"skipped: {e}")
        return SKIP
    except (AssertionError, Timeout, subprocess.TimeoutExpired) as e:
        print(f"FAILED {a.case}: {e}")
        return 1
    finally:
        signal.alarm(0)
        c.down()
    print(f"PASS {a.case} ({time.monotonic() - t0:.1f} s, of which the case {time.monotonic() - t1:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
