#!/usr/bin/python3
# Multi-node jobs on one machine (issue 8): every "node" is a network namespace of its own, joined to the
# others by a veth pair to a bridge that lives in a further namespace, so that ranks on different nodes
# reach each other only over a real (virtual) NIC with a private address and cannot take the loopback
# shortcut. Cases: ddprun with one ddprun per node (message_passing, multinode, resnet, shared memory,
# restarts), real torchrun with static and c10d rendezvous, elastic torchrun (--nnodes=1:2: a node lost, a
# node joining; issue 16), mpirun with a launch agent that enters the namespaces, and the socket-interface
# knob (DDP_SOCKET_IFNAME and the default route-based choice).
# Run by CTest: netns_tests.py CASE --ddprun PATH --message-passing PATH --multinode PATH --resnet PATH.
# Exit 0 pass, 1 fail, 77 skip (not root, or `ip netns add` refused, or the launcher is missing).
# SPDX-License-Identifier: MIT
#
# Containment: namespaces are named ddpnetns-<driver pid>-<random>-<role>, so parallel runs never clash
# (each has its own bridge, addresses and ports), and a later run deletes what a crashed (SIGKILLed) run
# left behind: namespaces whose driver pid is no longer a netns_tests.py, with their /etc/netns/<ns>
# hosts files and /tmp work directories. Teardown (try/finally, atexit, SIGTERM and the SIGALRM budget
# raise) kills every process still inside our namespaces, then deletes them; deleting a namespace deletes
# its veth ends and the bridge, so no interface is ever created in the root namespace. The 10.213.7.0/24
# and 10.213.8.0/24 addresses exist only inside the namespaces and are only ever used from inside them
# (the root namespace has no route there).
import argparse
import atexit
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from driver import PY, SKIP, Skip, expect  # noqa: E402
PREFIX = "ddpnetns-"
SUBNET = "10.213.{}.{}"  # node k's address on its n-th interface ddp<n>: 10.213.(7+n).(k+1)/24
IFNAME = "ddp0"          # the node's end of its first veth pair (the other end, v<k>n0, sits on the bridge)
PORT = "29500"           # fresh namespaces: nothing else listens there, so a fixed port cannot clash
BUDGET_S = 100           # the whole case, including teardown, stays under the CTest TIMEOUT (120 s)


class Timeout(Exception):
    pass


def sh(*cmd, check=True):
    """Runs a short setup command (ip ...) and returns its stdout; raises with its stderr on failure."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=20)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def pid_is_driver(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        return b"netns_tests.py" in cmdline or b"fault_matrix.py" in cmdline  # tests/integration/faults imports this module
    except OSError:
        return False


def kill_inside(ns):
    """SIGKILLs every process in namespace ns (ip netns pids lists them by their network namespace)."""
    for _ in range(5):
        pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split()]
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def delete_leftovers():
    """Deletes what a previous run of this driver left behind when it was SIGKILLed (its pid is gone):
    namespaces (killing what still runs inside), /etc/netns/<ns> and work directories."""
    for line in sh("ip", "netns", "list", check=False).splitlines():
        m = re.match(rf"({re.escape(PREFIX)}(\d+)-\S+)", line)
        if m and int(m.group(2)) != os.getpid() and not pid_is_driver(int(m.group(2))):
            print(f"deleting leftover namespace {m.group(1)}")
            kill_inside(m.group(1))
            sh("ip", "netns", "del", m.group(1), check=False)
    for parent in ("/etc/netns", tempfile.gettempdir()):  # its hosts files and work directories
        for d in os.listdir(parent) if os.path.isdir(parent) else []:
            m = re.match(rf"{re.escape(PREFIX)}(\d+)-", d)
            if m and int(m.group(1)) != os.getpid() and not pid_is_driver(int(m.group(1))):
                shutil.rmtree(os.path.join(parent, d), ignore_errors=True)


def hostname_of(k):
    return f"ddpnode{k}"


class Cluster:
    """n node namespaces, each with lo and `nics` veth interfaces ddp0, ddp1, ... (10.213.7.(k+1)/24,
    10.213.8.(k+1)/24, ...), all on one bridge in a namespace of its own.

    Every command started in node k also gets a UTS namespace with hostname ddpnode<k>, and the node's
    /etc/hosts (ip netns exec bind-mounts /etc/netns/<ns>/hosts) resolves every ddpnode<j> to its address:
    to the launchers and to ddp each node is a separate host, as on a real cluster. With private_shm the
    node also gets its own /dev/shm (a tmpfs in the mount namespace ip netns exec makes)."""

    def __init__(self, nodes, nics=1):
        self.nics = nics
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.bridge = f"{self.tag}-br"
        self.nodes = [f"{self.tag}-n{k}" for k in range(nodes)]
        self.made = []
        self.procs = []
        self.work = tempfile.mkdtemp(prefix=f"{self.tag}.")  # /tmp/ddpnetns-<pid>-<random>.XXXX

    def addr(self, k, nic=0):
        return SUBNET.format(7 + nic, k + 1)

    def up(self):
        """Builds the namespaces and links; Skip when this kernel or sandbox cannot (no netns, veth, bridge)."""
        try:
            return self.build()
        except RuntimeError as e:
            raise Skip(f"cannot build the namespaces here: {e}")

    def build(self):
        for ns in [self.bridge, *self.nodes]:
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.bridge, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.addr(k)} {hostname_of(k)}\n" for k in range(len(self.nodes)))
        for k, ns in enumerate(self.nodes):
            for n in range(self.nics):
                # Both ends are created inside namespaces: the root namespace never holds one.
                sh("ip", "-n", self.bridge, "link", "add", f"v{k}n{n}", "type", "veth", "peer", "name", f"ddp{n}",
                   "netns", ns)
                sh("ip", "-n", self.bridge, "link", "set", f"v{k}n{n}", "master", "br0", "up")
                sh("ip", "-n", ns, "addr", "add", f"{self.addr(k, n)}/24", "dev", f"ddp{n}")
                sh("ip", "-n", ns, "link", "set", f"ddp{n}", "up")
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(hosts)
        return self

    def node_cmd(self, k, cmd, private_shm=False, same_hostname=False):
        """cmd wrapped to run in node k: its network namespace, its hostname, optionally its own /dev/shm."""
        setup = 'mount -t tmpfs -o size=64m ddpshm /dev/shm && ' if private_shm else ''
        setup += ':' if same_hostname else 'hostname "$0"'
        return ["ip", "netns", "exec", self.nodes[k], "unshare", "--uts", "sh", "-c", setup + ' && exec "$@"',
                hostname_of(k), *cmd]

    def start(self, k, cmd, env=None, **how):
        """Starts cmd inside node k (own session, output to files); returns the Popen."""
        out = open(os.path.join(self.work, f"{len(self.procs)}.out"), "w+")
        err = open(os.path.join(self.work, f"{len(self.procs)}.err"), "w+")
        full_env = dict(os.environ)
        full_env.update(env or {})
        p = subprocess.Popen(self.node_cmd(k, cmd, **how), stdout=out, stderr=err, env=full_env,
                             start_new_session=True, cwd=self.work)
        p.files = (out, err)
        self.procs.append(p)
        return p

    def wait(self, procs, timeout=60):
        """Waits for procs; returns [(rc, stdout, stderr)]. A timeout raises with everyone's output."""
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"timed out after {timeout} s:\n" + self.dump(procs))
        return [self.result(p) for p in procs]

    def result(self, p):
        out, err = p.files
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read()

    def dump(self, procs):
        text = []
        for p in procs:
            rc, out, err = self.result(p)
            text.append(f"$ {' '.join(p.args)}\nrc={rc}\nstdout:\n{out}\nstderr:\n{err}")
        return "\n".join(text)

    def run_nodes(self, cmds, timeout=60, env=None, **how):
        """Starts cmds[k] in node k (all at once) and waits for all; expects exit 0 from each.
        Returns (stdout, stderr) of all nodes, concatenated in node order; self.errs has each node's stderr."""
        procs = [self.start(k, c, env, **how) for k, c in enumerate(cmds)]
        res = self.wait(procs, timeout)
        expect(all(rc == 0 for rc, _, _ in res), f"exit codes {[rc for rc, _, _ in res]}", self.dump(procs))
        self.errs = [e for _, _, e in res]  # per node, for check_mesh
        return "".join(o for _, o, _ in res), "".join(self.errs)

    def down(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in self.made:
            kill_inside(ns)  # also what left our process groups (orted, setsid'd children)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for f in p.files:
                f.close()
        self.procs = []
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns, check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        self.made = []
        shutil.rmtree(self.work, ignore_errors=True)


# ---------------------------------------------------------------- checks shared by the cases

def check_message_passing(out, world):
    for r in range(1, world):
        expect(f"Rank 0 sent data to Rank {r}" in out, f"missing 'Rank 0 sent data to Rank {r}'", out)
        expect(f"Rank {r} has received data from rank 0" in out, f"missing receive line of rank {r}", out)
    print(f"  message_passing: rank 0 sent to and ranks 1..{world - 1} received from rank 0")


def check_multinode(out, world, epochs):
    steps = 2048 // world // 32  # 2048 samples split by the DistributedSampler, batch 32
    for r in range(world):
        for e in range(epochs):
            expect(f"[Rank {r}] Epoch {e} | Batchsize: 32 | Steps: {steps}" in out,
                   f"multinode: no epoch {e} line of rank {r}", out)
    expect("Training took" in out, "multinode: no 'Training took'", out)
    print(f"  multinode: {world} ranks x {epochs} epoch(s) of {steps} steps, 'Training took' seen")


def mesh_lines(err):
    """{rank: (listen address, shared memory on|off)} from the tcp backend's DDP_LOG_LEVEL=debug line
    "ddp[rank r/n]: tcp mesh ready, listening on <ip> (store prefix ...; shared memory on|off)"; the
    listen address is also what the rank publishes for its peers (<prefix>addr/<r> = ip:port)."""
    return {int(r): (ip, shm) for r, ip, shm in
            re.findall(r"ddp\[rank (\d+)/\d+\]: tcp mesh ready, listening on (\S+) \(store prefix [^;]*; "
                       r"shared memory (on|off)\)", err)}


def check_mesh(c, errs, world, shm="off", nic=0):
    """Every rank must listen on the veth address of the node it runs on (by default: the interface that
    routes to MASTER_ADDR) and use shared memory only as expected. errs: each node's stderr, so a rank
    runs on the node that printed its line; or one stream (mpirun's), where rank r runs on node r."""
    found = {}
    for k, err in enumerate(errs):
        for r, (ip, on) in mesh_lines(err).items():
            found[r] = (ip, on, k if len(errs) > 1 else r)
    expect(sorted(found) == list(range(world)), f"tcp mesh debug lines for ranks {sorted(found)}, expected "
           f"0..{world - 1} (did DDP_LOG_LEVEL=debug reach the ranks?)", *errs)
    for r, (ip, on, k) in sorted(found.items()):
        expect(ip == c.addr(k, nic), f"rank {r} listens on {ip}, expected {c.addr(k, nic)} (node {k})", *errs)
        expect(on == shm, f"rank {r}: shared memory {on}, expected {shm}", *errs)
    ranks = [f"rank {r} on node {k} {ip} (shm {on})" for r, (ip, on, k) in sorted(found.items())]
    print(f"  tcp mesh: {', '.join(ranks)}")


DEBUG = {"DDP_LOG_LEVEL": "debug", "DDP_TIMEOUT_MS": "30000"}
NO_SHM_WARNING = "no shared memory between local ranks"


def ddprun_nodes(a, c, nproc, program):
    return [[a.ddprun, "--nnodes", str(len(c.nodes)), "--node-rank", str(k), "--nproc-per-node", str(nproc),
             "--master-addr", c.addr(0), "--master-port", PORT, *program] for k in range(len(c.nodes))]


# ---------------------------------------------------------------- ddprun, one per node

def case_ddprun_message_passing(a, c):
    # 2 nodes x 2 ranks: ranks on one node are local to each other, but the communicator spans both
    # nodes, so no shared memory; each rank listens on its node's veth address.
    out, err = c.run_nodes(ddprun_nodes(a, c, 2, [a.message_passing, "--backend", "tcp"]), env=DEBUG)
    check_message_passing(out, 4)
    check_mesh(c, c.errs, 4)
    expect(NO_SHM_WARNING not in err, "shared memory was tried across nodes", err)


def case_ddprun_multinode(a, c):
    out, err = c.run_nodes(ddprun_nodes(a, c, 1, [a.multinode, "2", "1", "--snapshot_path", "s.safetensors"]),
                           env=DEBUG)
    check_multinode(out, 2, 2)
    check_mesh(c, c.errs, 2)
    expect("Epoch 1 | Training snapshot saved at s.safetensors" in out, "no snapshot line", out)


RESNET_TINY = ["--backend", "gloo", "--use_syn", "--device", "cpu", "--arch", "resnet18", "--batch_size", "4",
               "--image_size", "32", "--steps_syn", "3", "--width", "8", "--num_classes", "10", "--threads", "1"]


def case_ddprun_resnet(a, c):
    out, err = c.run_nodes(ddprun_nodes(a, c, 1, [a.resnet, *RESNET_TINY, "--model_dir", "models"]), env=DEBUG)
    expect("epoch 0 step 3/3 loss" in out and "samples_per_sec" in out, "resnet progress/throughput lines", out, err)
    check_mesh(c, c.errs, 2)
    print("  resnet: 3 steps, " + next(ln for ln in out.splitlines() if "samples_per_sec" in ln).strip())


def case_ddprun_shm(a, c):
    # The tcp backend's shared-memory path (DDP_SHM default on) between ranks on different nodes; multinode
    # all-reduces every step, so a wrong choice would hang or fail the job, not pass it silently.
    def job(run):  # a snapshot file per run: each must train from epoch 0
        return ddprun_nodes(a, c, 1, [a.multinode, "1", "1", "--snapshot_path", f"{run}.safetensors"])
    # Separate hosts (own hostname, own /dev/shm): the host identities differ, so shared memory is not
    # even tried (no warning) and all traffic goes over the veth.
    out, err = c.run_nodes(job("hosts"), env=DEBUG, private_shm=True)
    check_multinode(out, 2, 1)
    check_mesh(c, c.errs, 2, shm="off")
    expect(NO_SHM_WARNING not in err, "shared memory was tried between different hosts", err)
    # Same hostname (and boot id), separate /dev/shm, like two containers with one hostname on one kernel:
    # rank 1 cannot open rank 0's segment; all ranks agree on TCP with a warning and the job works.
    out, err = c.run_nodes(job("containers"), env=DEBUG, private_shm=True, same_hostname=True)
    check_multinode(out, 2, 1)
    check_mesh(c, c.errs, 2, shm="off")
    expect(NO_SHM_WARNING in err and "a separate /dev/shm" in err, "no fallback warning", err)
    print("  same hostname, separate /dev/shm: " + next(ln for ln in err.splitlines() if NO_SHM_WARNING in ln).strip())
    # Same hostname and the same /dev/shm: one kernel, one memory, only the network differs, so the
    # segment really is shared and using it is right (the network namespace does not matter to memory).
    out, err = c.run_nodes(job("netns"), env=DEBUG, same_hostname=True)
    check_multinode(out, 2, 1)
    check_mesh(c, c.errs, 2, shm="on")
    # DDP_SHM=0 turns it off there too.
    out, err = c.run_nodes(job("off"), env={**DEBUG, "DDP_SHM": "0"}, same_hostname=True)
    check_multinode(out, 2, 1)
    check_mesh(c, c.errs, 2, shm="off")


# ---------------------------------------------------------------- torchrun (torch 1.13), one per node

def have_torch():
    p = subprocess.run([PY, "-c", "import torch.distributed.run"], capture_output=True, timeout=60)
    if p.returncode != 0:
        raise Skip("/usr/bin/python3 has no torch.distributed.run (install python3-torch)")


def torchrun_cmd(k, nnodes, launch, program, runner=("-m", "torch.distributed.run")):
    # torch 1.13 spells the flags with "_"; --redirects/--tee 9:1 as in tests/integration/launch (this environment needs
    # them; they name local rank 9 only, so the workers keep writing to this torchrun's stdout and stderr).
    return [PY, *runner, "--redirects", "9:1", "--tee", "9:1", "--log_dir", f"logs{k}", "--nnodes", nnodes,
            "--nproc_per_node", "1", *launch, "--no_python", *program]


def torchrun_nodes(c, rdzv, program):
    return [torchrun_cmd(k, str(len(c.nodes)), rdzv(k), program) for k in range(len(c.nodes))]


def torchrun_case(a, c, rdzv):
    have_torch()
    out, err = c.run_nodes(torchrun_nodes(c, rdzv, [a.message_passing, "--backend", "tcp"]), env=DEBUG, timeout=80)
    check_message_passing(out, 2)
    check_mesh(c, c.errs, 2)
    out, err = c.run_nodes(torchrun_nodes(c, rdzv, [a.multinode, "1", "1", "--snapshot_path", "s.safetensors"]),
                           env=DEBUG, timeout=80)
    check_multinode(out, 2, 1)
    check_mesh(c, c.errs, 2)


def case_torchrun_static(a, c):
    torchrun_case(a, c, lambda k: ["--node_rank", str(k), "--master_addr", c.addr(0), "--master_port", PORT])


def case_torchrun_c10d(a, c):
    # No node rank given: torch's c10d rendezvous assigns them (check_mesh finds each rank's node from the
    # node's own output). Node 0 hosts the store because the endpoint address is its own: torch resolves
    # the hostname ddpnode0 through the node's /etc/hosts and finds 10.213.7.1.
    torchrun_case(a, c, lambda k: ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{c.addr(0)}:{PORT}",
                                   "--rdzv_id", f"netns{os.getpid()}"])


# ---------------------------------------------------------------- elastic torchrun: a node lost, a node joining

# torchrun --nnodes=1:2 with torch 1.13's c10d rendezvous (hosted by node 0's agent: the endpoint is its
# address, and its hostname ddpnode0 sorts first, so it is always group rank 0 and our rank 0 - the one that
# reads and writes the snapshot - runs there). A snapshot every epoch; batch 256 gives 4 steps per epoch with
# two ranks and 8 with one (the DistributedSampler's share of 2048), so "Steps: N" shows the world size each
# epoch ran with. Each node names its own snapshot file; only n0.safetensors may ever exist, so node 1's rank
# got the joined state from rank 0's broadcast, not from a file. Each epoch costs about the same (a few ms,
# mostly the snapshot's fsync) with one or two ranks, so the job's length does not depend on when a node
# comes or goes. torch 1.13 keeps its keep-alive fixed (a heartbeat every 5 s, dead after 3 missed): a lost
# node leaves the rendezvous 10-15 s after it died, which dominates the time to resume.
ELASTIC_EPOCHS = 500
def elastic_launch(c, max_restarts, last_call=1):
    """torchrun's elastic flags. last_call: seconds a round with fewer than the maximum nodes waits for more
    (torch's default is 30; 1 lets a single node start at once). A round completes as soon as both nodes
    are in, so a longer last call costs time only when a node is missing."""
    return ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{c.addr(0)}:{PORT}", "--rdzv_id", f"elastic{os.getpid()}",
            "--rdzv_conf", f"join_timeout=40,last_call_timeout={last_call}", "--max_restarts", str(max_restarts),
            "--monitor_interval", "0.2"]


def elastic_program(a, k):
    return [a.multinode, str(ELASTIC_EPOCHS), "1", "--batch_size", "256", "--snapshot_path", f"n{k}.safetensors"]


# torchrun whose import (seconds on a loaded CI machine) is done before it starts: it touches `ready`, then
# waits for the file `trigger` and runs main(), which is what `python3 -m torch.distributed.run` runs. So
# the test decides when an agent reaches the rendezvous to within a fraction of a second: two nodes start
# together (not one after the other's last_call_timeout), and a joining node arrives while node 0 is
# certainly still training.
LATE_AGENT = ("import os, sys, time\nimport torch.distributed.run as run\nready, trigger = sys.argv.pop(1), "
              "sys.argv.pop(1)\nopen(ready, 'w').close()\nwhile not os.path.exists(trigger):\n    time.sleep(0.01)\n"
              "run.main()\n")


def start_late_agent(a, c, k, max_restarts, trigger, last_call=1):
    """Starts node k's torchrun as LATE_AGENT; returns (Popen, its ready file)."""
    ready = os.path.join(c.work, f"ready{k}")
    cmd = torchrun_cmd(k, "1:2", elastic_launch(c, max_restarts, last_call), elastic_program(a, k),
                       runner=("-c", LATE_AGENT, ready, trigger))
    return c.start(k, cmd, env=DEBUG), ready


class Tail:
    """The growing output file of a process started by Cluster.start, read by the driver while it runs."""

    def __init__(self, p, stream=0):
        self.f = open(p.files[stream].name)
        self.text = ""

    def read(self):
        self.text += self.f.read()
        return self.text


def poll_until(cond, timeout, what, c, procs):
    """Calls cond() every 10 ms until it returns true; raises with everyone's output after timeout s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s\n" + c.dump(procs))
        time.sleep(0.01)
    return time.monotonic()


def node_pids(c, k, exe):
    """Processes in node k running the executable exe (our workers, whose parent is torchrun)."""
    pids = []
    for p in sh("ip", "netns", "pids", c.nodes[k], check=False).split():
        try:
            if os.readlink(f"/proc/{p}/exe") == os.path.realpath(exe):
                pids.append(int(p))
        except OSError:
            pass
    return pids


def running(pid):
    """True until pid has exited (a zombie waiting for torchrun to reap it counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


EPOCH_LINE = re.compile(r"\[Rank (\d+)\] Epoch (\d+) \| Batchsize: 256 \| Steps: (\d+)")
SAVED_LINE = re.compile(r"^Epoch (\d+) \| Training snapshot saved at n0\.safetensors$", re.M)
RESUME_LINE = re.compile(r"^Resuming training from snapshot at Epoch (\d+)$", re.M)


def check_elastic_resume(out0, before, after, c, procs):
    """Node 0's stdout out0: the epochs ran with `before` ranks (4 steps if 2), then a restart resumed with
    `after` ranks at the epoch after the last snapshot written before it, and training finished.
    Returns the resume epoch."""
    resumes = RESUME_LINE.findall(out0)
    expect(len(resumes) == 1, f"expected one 'Resuming training' line, got {resumes}", c.dump(procs))
    cut = RESUME_LINE.search(out0).start()
    head, tail = out0[:cut], out0[cut:]
    saved = SAVED_LINE.findall(head)
    expect(saved, "no snapshot written before the restart", c.dump(procs))
    resume = int(resumes[0])
    first = [m for m in EPOCH_LINE.findall(head) if m[0] == "0"]
    expect(resume == int(saved[-1]) + 1, f"resumed at epoch {resume}, the last snapshot line before the restart "
           f"was epoch {saved[-1]}'s", c.dump(procs))
    steps = {1: "8", 2: "4"}
    expect(first and all(s == steps[before] for _, _, s in first),
           f"before the restart rank 0's epochs should have {steps[before]} steps ({before} rank(s))", head)
    later = [m for m in EPOCH_LINE.findall(tail) if m[0] == "0"]
    expect([int(e) for _, e, _ in later] == list(range(resume, ELASTIC_EPOCHS)),
           f"after the restart rank 0 should run epochs {resume}..{ELASTIC_EPOCHS - 1} once each", tail)
    expect(all(s == steps[after] for _, _, s in later),
           f"after the restart the sampler should give {steps[after]} steps per epoch ({after} rank(s))", tail)
    expect(f"Epoch {ELASTIC_EPOCHS - 1} | Training snapshot saved at n0.safetensors" in tail and
           "Training took" in tail, "training did not finish after the restart", tail)
    return resume


def check_world_sizes(err0, sizes, c, procs):
    """Rank 0's DDP_LOG_LEVEL=debug mesh lines on node 0, one per communicator, in order: the world sizes."""
    seen = [int(n) for n in re.findall(r"ddp\[rank 0/(\d+)\]: tcp mesh ready", err0)]
    expect(seen == sizes, f"rank 0's communicators had world sizes {seen}, expected {sizes}", c.dump(procs))


def case_torchrun_elastic_lose(a, c):
    # Two nodes train; node 1 is lost (its torchrun agent and its worker SIGKILLed, as when the machine dies).
    # Node 0's worker fails fast naming rank 1 (docs/ARCHITECTURE.md §4), its agent restarts the group (one
    # of --max_restarts), waits in the rendezvous until torch declares node 1 dead, and starts our worker
    # again with WORLD_SIZE=1: it resumes from rank 0's last snapshot with the sampler's one-rank share.
    have_torch()
    trigger = os.path.join(c.work, "go")
    # last_call 5: under load node 1's agent may reach the first round more than 1 s after node 0's, which
    # would then start alone (seen: "node 1 has no worker to lose"); both in, the round completes at once.
    procs, ready = zip(*[start_late_agent(a, c, k, 3, trigger, last_call=5) for k in range(2)])
    poll_until(lambda: all(os.path.exists(r) for r in ready), 60, "torch imported on both nodes", c, procs)
    open(trigger, "w").close()
    out0 = Tail(procs[0])
    poll_until(lambda: "Epoch 30 | Training snapshot saved" in out0.read(), 60, "epoch 30 with two nodes", c, procs)
    [survivor] = node_pids(c, 0, a.multinode)
    expect(node_pids(c, 1, a.multinode), "node 1 has no worker to lose", c.dump(procs))
    mark = len(out0.read())
    t_fault = time.monotonic()
    kill_inside(c.nodes[1])  # node 1's agent and worker, SIGKILL
    resumed = re.compile(r"\[Rank 0\] Epoch \d+ \| Batchsize: 256 \| Steps: 8")
    t_exit = poll_until(lambda: not running(survivor), 30, "exit of node 0's worker", c, procs)
    t_resume = poll_until(lambda: resumed.search(out0.read(), mark), 40, "epoch with one rank", c, procs)
    [(rc, out, err)] = c.wait(procs[:1], timeout=40)
    expect(rc == 0, f"node 0's torchrun exited {rc}", c.dump(procs))
    # The survivor named the lost rank (tcp: the peer's socket closed; or its report through the store).
    expect(re.search(r"ddp\[rank 0/2\][^\n]*rank 1", err), "node 0's worker did not name rank 1", err)
    check_world_sizes(err, [2, 1], c, procs)
    resume = check_elastic_resume(out, 2, 1, c, procs)
    expect(not os.path.exists(os.path.join(c.work, "n1.safetensors")), "node 1 wrote a snapshot", out)
    failure = next(ln for ln in err.splitlines() if re.search(r"ddp\[rank 0/2\].*rank 1", ln))
    print(f"  node 0's worker: {failure.strip()[:200]}")
    print(f"  world size 2 -> 1, resumed at epoch {resume} (last snapshot epoch {resume - 1}), steps per epoch "
          f"4 -> 8, epochs {resume}..{ELASTIC_EPOCHS - 1} done")
    print(f"  timings: fault -> node 0's worker exited {t_exit - t_fault:.2f} s; fault -> training resumed "
          f"(first epoch with one rank) {t_resume - t_fault:.2f} s")


def case_torchrun_elastic_join(a, c):
    # Node 0 trains alone (--nnodes=1:2 lets one node complete the rendezvous after last_call_timeout); node
    # 1's torchrun then arrives. Its agent waits for the next round; node 0's agent sees a node waiting,
    # stops its worker (SIGTERM; not counted as a restart) and both join the next round: two ranks, resumed
    # from rank 0's snapshot, the sampler's two-rank share. The lone worker waits after epoch 20's snapshot
    # (--await-join-after-epoch): alone, it would otherwise finish all epochs in well under a second, before
    # the join (seen in CI).
    have_torch()
    trigger = os.path.join(c.work, "join")
    p0 = c.start(0, torchrun_cmd(0, "1:2", elastic_launch(c, 0),
                                 elastic_program(a, 0) + ["--await-join-after-epoch", "20"]), env=DEBUG)
    p1, ready = start_late_agent(a, c, 1, 0, trigger)
    procs = [p0, p1]
    out0, out1 = Tail(p0), Tail(p1)
    poll_until(lambda: os.path.exists(ready), 60, "torch imported on node 1", c, procs)
    poll_until(lambda: "Epoch 20 | waiting for a node to join" in out0.read(), 60, "epoch 20 with one node", c, procs)
    expect(p1.poll() is None, "node 1's agent ended before joining", c.dump(procs))
    t_join = time.monotonic()
    open(trigger, "w").close()
    t_resume = poll_until(lambda: EPOCH_LINE.search(out1.read()), 40, "epoch on node 1", c, procs)
    res = c.wait(procs, timeout=40)
    expect(all(rc == 0 for rc, _, _ in res), f"exit codes {[rc for rc, _, _ in res]}", c.dump(procs))
    (_, out, err), (_, out_1, err_1) = res
    check_world_sizes(err, [1, 2], c, procs)
    resume = check_elastic_resume(out, 1, 2, c, procs)
    ranks1 = [(r, int(e), s) for r, e, s in EPOCH_LINE.findall(out_1)]
    expect(ranks1 == [("1", e, "4") for e in range(resume, ELASTIC_EPOCHS)],
           f"node 1 should run rank 1's epochs {resume}..{ELASTIC_EPOCHS - 1} with 4 steps", out_1)
    expect(not os.path.exists(os.path.join(c.work, "n1.safetensors")), "node 1 wrote a snapshot", out_1)
    print(f"  world size 1 -> 2, both ranks resumed at epoch {resume} (rank 0's snapshot, broadcast), steps per "
          f"epoch 8 -> 4, epochs {resume}..{ELASTIC_EPOCHS - 1} done on both nodes")
    print(f"  timings: join -> training resumed with two ranks (node 1's first epoch) {t_resume - t_join:.2f} s")


def unprefixed(text):
    """ddprun's output without its "[rankN]: " line prefixes, to be checked like torchrun's."""
    return re.sub(r"^\[rank\d+\]: ", "", text, flags=re.M)


def case_ddprun_restart(a, c):
    # ddprun's restarts where they apply, and where they do not (docs/decisions/0036). ddprun's membership
    # is static (--nnodes M, node 0's store outlives every attempt) and each node restarts its own workers.
    # 1) A worker dies, its node survives: node 1's worker is SIGKILLed; node 0's worker fails fast naming rank
    #    1; each ddprun restarts its worker (restart 1 of --max-restarts 1), the two meet again in node 0's
    #    store (the communicator numbers its attempts there, docs/ARCHITECTURE.md §4) with world size 2, and
    #    training resumes from rank 0's snapshot.
    launch = ["--nproc-per-node", "1", "--max-restarts", "1", "--master-addr", c.addr(0), "--master-port", PORT]
    env = {**DEBUG, "DDP_TIMEOUT_MS": "4000"}
    procs = [c.start(k, [a.ddprun, "--nnodes", "2", "--node-rank", str(k), *launch, *elastic_program(a, k)], env=env)
             for k in range(2)]
    out0 = Tail(procs[0])
    poll_until(lambda: "Epoch 30 | Training snapshot saved" in out0.read(), 60, "epoch 30", c, procs)
    [victim] = node_pids(c, 1, a.multinode)
    mark = len(out0.read())
    t_fault = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    t_resume = poll_until(lambda: RESUME_LINE.search(unprefixed(out0.read()[mark:])), 30, "resume", c, procs)
    res = c.wait(procs, timeout=40)
    expect(all(rc == 0 for rc, _, _ in res), f"exit codes {[rc for rc, _, _ in res]}", c.dump(procs))
    (_, out, err), (_, out_1, err_1) = res
    expect(re.search(r"ddp\[rank 0/2\][^\n]*rank 1 closed its connection", err), "rank 0 did not name rank 1", err)
    for k, e in enumerate((err, err_1)):
        expect("ddprun: restarting all 1 workers (restart 1 of 1" in e, f"node {k}'s ddprun did not restart", e)
    check_world_sizes(err, [2, 2], c, procs)
    resume = check_elastic_resume(unprefixed(out), 2, 2, c, procs)
    print(f"  worker lost: both ddpruns restarted, world size 2 again, resumed at epoch {resume}; fault -> "
          f"training resumed {t_resume - t_fault:.2f} s")
    # 2) A node is lost: node 1's ddprun and worker are SIGKILLed. Node 0's ddprun restarts its worker with
    #    the same world size 2 (no elastic membership); rank 1 never comes, so the worker fails at the
    #    rendezvous after DDP_TIMEOUT_MS naming rank 1, and the job fails instead of going on with one node.
    os.unlink(os.path.join(c.work, "n0.safetensors"))
    procs = [c.start(k, [a.ddprun, "--nnodes", "2", "--node-rank", str(k), *launch, *elastic_program(a, k)], env=env)
             for k in range(2)]
    out0, err0 = Tail(procs[0]), Tail(procs[0], 1)
    poll_until(lambda: "Epoch 30 | Training snapshot saved" in out0.read(), 60, "epoch 30", c, procs)
    t_fault = time.monotonic()
    kill_inside(c.nodes[1])
    gave_up = "ddprun: giving up after 1 restart(s)"
    t_fail = poll_until(lambda: gave_up in err0.read(), 30, "node 0's ddprun giving up", c, procs)
    text = err0.read()
    expect(re.search(r"ddp\[rank 0/2\][^\n]*rank 1", text[text.index("restarting all 1 workers"):]),
           "node 0's restarted worker did not name rank 1", text)
    # Node 0's ddprun now waits in its exit barrier for node 1 (up to 300 s, as torchrun's agent does):
    # SIGTERM ends it at once, with the workers' failure as its exit code.
    procs[0].send_signal(signal.SIGTERM)
    [(rc, _, _)] = c.wait(procs[:1], timeout=10)
    expect(rc != 0, "node 0's ddprun exited 0 after losing node 1", c.dump(procs))
    failure = next(ln for ln in text[text.index("restarting all 1 workers"):].splitlines()
                   if re.search(r"ddp\[rank 0/2\].*rank 1", ln))
    print(f"  node lost: node 0's restarted worker: {failure.strip()[:200]}")
    print(f"  node lost: fault -> node 0's ddprun gave up {t_fail - t_fault:.2f} s (DDP_TIMEOUT_MS=4000); exit {rc}")


# ---------------------------------------------------------------- mpirun with a launch agent

AGENT = """#!/bin/sh
# OpenMPI's launch agent (--mca plm_rsh_agent): called like ssh as <host> <command...>; runs the command
# in that host's node (network namespace, hostname) the way ssh's remote shell would.
host=$1; shift
echo "$host $*" >> "$(dirname "$0")/agent.log"
case $host in
{cases}
*) echo "agent: unknown host $host" >&2; exit 255;;
esac
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def mpirun_node0(a, c, program, env=()):
    """mpirun in node 0, one rank per node; ddpnode0 is local to it, the others start through the agent."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise Skip("mpirun not found (install openmpi-bin)")
    agent = os.path.join(c.work, "agent.sh")
    with open(agent, "w") as f:
        f.write(AGENT.format(cases="\n".join(f"{hostname_of(k)}) ns={ns};;" for k, ns in enumerate(c.nodes))))
    os.chmod(agent, 0o755)
    hosts = ",".join(f"{hostname_of(k)}:1" for k in range(len(c.nodes)))
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(len(c.nodes)), "--host", hosts,
           "--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", IFNAME, "--mca", "btl", "self,tcp",
           "--mca", "btl_tcp_if_include", IFNAME, "--mca", "pml", "ob1", "-bind-to", "none", "-x", "PATH",
           "-x", "DDP_LOG_LEVEL", "-x", "DDP_TIMEOUT_MS"]
    for e in env:
        cmd += ["-x", e]
    p = c.start(0, [*cmd, *program], env=DEBUG)
    [(rc, out, err)] = c.wait([p], timeout=60)
    expect(rc == 0, f"mpirun rc={rc}", c.dump([p]))
    # ddpnode0 is mpirun's own host; every other node's daemon came up through the agent.
    with open(os.path.join(c.work, "agent.log")) as f:
        started = sorted(ln.split()[0] for ln in f if "orted" in ln)
    expect(started == [hostname_of(k) for k in range(1, len(c.nodes))], f"agent started orted on {started}")
    os.unlink(os.path.join(c.work, "agent.log"))
    print(f"  mpirun: orted started through the agent on {started}")
    return out, err


def case_mpirun_tcp(a, c):
    out, err = mpirun_node0(a, c, [a.message_passing, "--backend", "tcp"],
                            env=[f"MASTER_ADDR={c.addr(0)}", f"MASTER_PORT={PORT}"])
    check_message_passing(out, 2)
    check_mesh(c, [err], 2)


def case_mpirun_mpi(a, c):
    out, err = mpirun_node0(a, c, [a.message_passing, "--backend", "mpi"])
    check_message_passing(out, 2)
    out, err = mpirun_node0(a, c, [a.multinode, "1", "1", "--backend", "mpi", "--snapshot_path", "s.safetensors"])
    check_multinode(out, 2, 1)


# ---------------------------------------------------------------- the socket-interface knob

def case_socket_ifname(a, c):
    # Each node has two interfaces on the bridge: ddp0 (10.213.7.x, where MASTER_ADDR is) and ddp1
    # (10.213.8.x), so that the choice is visible in the address each rank listens on and publishes.
    job = ddprun_nodes(a, c, 1, [a.message_passing, "--backend", "tcp"])
    # Default: the interface that routes to MASTER_ADDR (for node 0 its own address, still not 127.0.0.1).
    out, _ = c.run_nodes(job, env=DEBUG)
    check_message_passing(out, 2)
    check_mesh(c, c.errs, 2, nic=0)
    # Named: DDP_SOCKET_IFNAME=ddp1 and --socket-ifname ddp1 move the mesh to the other subnet (the store
    # stays on MASTER_ADDR).
    out, _ = c.run_nodes(job, env={**DEBUG, "DDP_SOCKET_IFNAME": "ddp1"})
    check_message_passing(out, 2)
    check_mesh(c, c.errs, 2, nic=1)
    out, _ = c.run_nodes([[*cmd, "--socket-ifname", "ddp1"] for cmd in job], env=DEBUG)
    check_message_passing(out, 2)
    check_mesh(c, c.errs, 2, nic=1)
    # The default follows MASTER_ADDR: with node 0's ddp1 address as MASTER_ADDR, ddp1 is chosen.
    out, _ = c.run_nodes([[x if x != c.addr(0) else c.addr(0, 1) for x in cmd] for cmd in job], env=DEBUG)
    check_message_passing(out, 2)
    check_mesh(c, c.errs, 2, nic=1)
    # A name that does not exist: every rank fails at once with a message naming the knob and listing
    # the interfaces there are.
    procs = [c.start(k, cmd, env={**DEBUG, "DDP_SOCKET_IFNAME": "nosuch0"}) for k, cmd in enumerate(job)]
    res = c.wait(procs, timeout=30)
    expect(all(rc != 0 for rc, _, _ in res), f"exit codes {[rc for rc, _, _ in res]} with a bad interface",
           c.dump(procs))
    for k, (_, _, err) in enumerate(res):
        want = ("DDP_SOCKET_IFNAME/--socket-ifname='nosuch0' is not an interface with an IPv4 address here; "
                f"interfaces: lo=127.0.0.1, ddp0={c.addr(k)}, ddp1={c.addr(k, 1)}.")
        expect(want in err, f"node {k}: no message naming DDP_SOCKET_IFNAME", err, want)
    print(f"  DDP_SOCKET_IFNAME=nosuch0: both nodes fail with: ...{want}")


case_socket_ifname.nics = 2


CASES = {k[5:]: v for k, v in dict(globals()).items() if k.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--message-passing", dest="message_passing", required=True)
    ap.add_argument("--multinode", required=True)
    ap.add_argument("--resnet", required=True)
    a = ap.parse_args()
    for k in ("ddprun", "message_passing", "multinode", "resnet"):
        setattr(a, k, os.path.abspath(getattr(a, k)))  # the jobs run in a temporary directory
    if os.geteuid() != 0:
        print("skipped: network namespaces need root")
        return SKIP
    if shutil.which("ip") is None:
        print("skipped: no `ip` (install iproute2)")
        return SKIP

    def on_signal(signum, _frame):
        raise Timeout(f"the case ran past {BUDGET_S} s" if signum == signal.SIGALRM else "interrupted by SIGTERM")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGALRM, on_signal)
    signal.alarm(BUDGET_S)
    delete_leftovers()
    c = Cluster(2, getattr(CASES[a.case], "nics", 1))  # two nodes (plus the bridge's namespace)
    atexit.register(c.down)  # a backstop for exits that skip the finally below; down() is idempotent
    t0 = time.monotonic()
    try:
        c.up()
        print(f"{a.case}: nodes {c.nodes} at {[c.addr(k) for k in range(len(c.nodes))]} on bridge {c.bridge}")
        CASES[a.case](a, c)
    except Skip as e:
        print(f"skipped: {e}")
        return SKIP
    except (AssertionError, Timeout, RuntimeError) as e:
        print(f"FAILED {a.case}: {e}")
        return 1
    finally:
        signal.alarm(0)
        c.down()
    print(f"PASS {a.case} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
