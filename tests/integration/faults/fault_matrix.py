#!/usr/bin/python3
# Fault matrix (issue 8): kill -9 a rank, SIGSTOP a rank, or cut the link between two nodes while a job of the
# tcp or mpi backend (2 and 4 ranks) is in a known phase, and check what the issue expects: every surviving
# rank exits non-zero within its timeout + 5 s with a message naming the rank and the op; no process is left
# behind; a snapshot on disk is the previous or the new one, complete, never torn; under ddprun --max-restarts
# the job resumes from its snapshot and finishes. Prints the matrix: scenario | expected | observed | seconds.
# Run by CTest: fault_matrix.py --select tcp|mpi|link|all --worker PATH --ddprun PATH [--jobs 2] [--only REGEX]
# Exit 0 pass, 1 a row failed, 77 every selected row was skipped (no mpirun / ddp::mpi; not root / no ip netns).
# SPDX-License-Identifier: MIT
#
# How a row runs: fault_worker (this directory) announces its phases on stdout ("fw rank 3: phase allreduce
# iter 2", "fw rank 0: phase snapshot-write epoch 2 start", its pid first); a reader thread per process
# timestamps every line, and the row sends its signal when the target line appears, so the fault lands
# inside the phase, not before or after it:
#   rendezvous  rank k (--hold-rank) stops after joining the store, before the communicator (tcp mesh /
#               MPI_Init); the kill comes once every other rank has joined the store too.
#   allreduce   64 MiB all-reduces in a loop; the kill comes when rank k announces iteration 2.
#   backward    DDP(resnet18) steps; the kill comes when rank k enters backward of step 1 (its gradient
#               buckets all-reduce during backward).
#   snapshot    rank 0 writes a 128 MiB snapshot each epoch; the kill comes once <path>.tmp of epoch 2's write
#               exists on disk (before the rename), then the file is loaded with the library's loader and
#               must be epoch 2 (the previous) or 3 (the new one) with every weight right.
#   stop        SIGSTOP rank k at all-reduce iteration 2: the others must time out naming it; afterwards
#               SIGCONT (tcp: it must then fail by itself too).
#   ddprun      kill -9 under ddprun (no restarts: ddprun names the rank and stops the rest; --max-restarts 1:
#               the job restarts, resumes from the snapshot and ends 0 with the right final snapshot).
#   link        two network-namespace nodes (tests/integration/netns/netns_tests.py's Cluster), one rank each; the
#               bridge-side end of node 1's veth goes down in the middle of the all-reduces.
# tcp ranks are started directly with env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so the
# survivors must fail on their own: ddprun would SIGTERM them within milliseconds of the death (its rows
# check ddprun itself). mpi rows run under mpirun, which ends the whole job when a rank dies; its message names
# the rank, the survivors are killed by it and print nothing of their own (recorded as such).
# Containment: each row gets its own directory /tmp/ddp_faults.<pid>.<row>.XXXX, passed to every process as
# --tag, and every process runs in a session of its own. After a row, any process whose cmdline holds the
# directory (zombies aside) is a leftover: the row fails, and the process is killed.
import argparse
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from driver import SKIP, Skip, free_port  # noqa: E402
TIMEOUT_MS = 4000
SLACK_S = 5.0  # the bound: timeout + 5 s
LIMIT_S = TIMEOUT_MS / 1000 + SLACK_S
HERE = os.path.dirname(os.path.abspath(__file__))
OPS = {  # what the survivors' message must name, per phase
    "rendezvous": r"tcp mesh|store",
    "allreduce": r"all_reduce #\d+",
    "backward": r"all_reduce #\d+",
    "snapshot": r"(barrier|all_reduce|broadcast) #\d+",
    "stop": r"all_reduce #\d+",
    "link": r"all_reduce #\d+",
}


class RowFailed(Exception):
    pass


def names_rank(text, k):
    """True when text names rank k other than in a 'ddp[rank r/n]' prefix: 'rank 3', 'rank(s) 0, 3', or the
    tcp timeout report 'Ranks that never reached all_reduce #5: 3 (...)'."""
    if re.search(rf"(?<!\[)\branks?(?:\(s\))? (?:\d+, )*{k}\b", text):
        return True
    m = re.search(r"Ranks that never reached [^:]*: (.*)", text)
    return bool(m and re.search(rf"(?:^|, ){k} \(", m.group(1)))


class Proc:
    def __init__(self, name, popen):
        self.name, self.popen, self.lines, self.exit_t = name, popen, [], None

    def text(self):
        return "".join(line for _, line in self.lines)


class Job:
    """The processes of one row: own sessions, merged stdout+stderr read line by line with timestamps."""

    def __init__(self, tag):
        self.tag, self.procs, self.cv = tag, [], threading.Condition()

    def start(self, name, cmd, env=None):
        full = dict(os.environ)
        full.update(env or {})
        p = Proc(name, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full, cwd=self.tag,
                                        start_new_session=True, text=True, errors="replace"))
        self.procs.append(p)
        threading.Thread(target=self._read, args=(p,), daemon=True).start()
        return p

    def _read(self, p):
        for line in p.popen.stdout:
            with self.cv:
                p.lines.append((time.monotonic(), line))
                self.cv.notify_all()
        p.popen.wait()
        with self.cv:
            p.exit_t = time.monotonic()
            self.cv.notify_all()

    def wait_for(self, pred, timeout, what):
        """Waits until pred() (called under the lock) is true; RowFailed naming `what` after timeout s."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                r = pred()
                if r:
                    return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RowFailed(f"timed out after {timeout} s waiting for {what}")
                self.cv.wait(min(left, 0.2))

    def line(self, pattern, timeout=60, or_ended=False):
        """Waits for a line matching pattern in any process; returns the match (or, with or_ended, "ended" once
        every process of the job has exited without one)."""
        rx = re.compile(pattern)

        def find():
            for p in self.procs:
                for _, line in p.lines:
                    m = rx.search(line)
                    if m:
                        return m
            ended = or_ended and self.procs and all(p.exit_t is not None for p in self.procs)
            return "ended" if ended else None
        return self.wait_for(find, timeout, repr(pattern))

    def pid_of(self, rank, attempt=0, timeout=60):
        return int(self.line(rf"fw rank {rank}: pid (\d+) world \d+ attempt {attempt}\b", timeout).group(1))

    def exited(self, procs, timeout):
        """Waits until every proc in procs has exited (at most timeout s); returns those still running."""
        try:
            self.wait_for(lambda: all(p.exit_t is not None for p in procs), timeout, "exit")
        except RowFailed:
            pass
        return [p for p in procs if p.exit_t is None]

    def cleanup(self):
        """Kills every process group of the row and any process carrying the row's tag; returns the leftovers
        found before killing them (pid: cmdline)."""
        left = []
        for p in self.procs:
            if p.popen.poll() is None:
                left.append(f"{p.popen.pid}: {p.name}")
        for p in self.procs:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.killpg(p.popen.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.procs:
            try:
                p.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        # Descendants that left our sessions (mpirun's ranks are its children; anything setsid'd) are
        # found by the tag on their command line. Zombies waiting for their parent's exit are not processes
        # left running; give a dying parent (mpirun) a moment to be reaped by init.
        deadline = time.monotonic() + 3
        while True:
            stray = tagged(self.tag)
            if not stray or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # polling for the kernel to finish tearing processes down
        for pid, cmd in stray:
            left.append(f"{pid}: {cmd}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


def tagged(tag):
    """Live (non-zombie) processes whose command line contains tag: [(pid, cmdline)]."""
    found = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag in cmd and state != "Z":
            found.append((int(d), cmd.strip()))
    return found


class Row:
    def __init__(self, name, expected, fn, needs=None):
        self.name, self.expected, self.fn, self.needs = name, expected, fn, needs
        self.status, self.observed, self.secs, self.log = "?", "", None, ""


# ---------------------------------------------------------------- the scenarios

def worker_args(a, tag, *extra):
    return [a.worker, "--tag", tag, "--timeout-ms", str(TIMEOUT_MS), *extra]


def start_tcp(job, a, n, args):
    port = free_port()
    procs = []
    for r in range(n):
        env = {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(job.start(f"rank {r}", worker_args(a, job.tag, "--backend", "tcp", *args), env))
    return procs


def start_mpi(job, a, n, args):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", str(n), "--mca", "btl",
           "self,vader,tcp", *worker_args(a, job.tag, "--backend", "mpi", *args)]
    # Rows run at once; each mpirun gets its own Open MPI session base (tests/CMakeLists.txt ddp_mpi_session).
    session = os.path.join(os.path.abspath(job.tag), "ompi_session")
    return job.start("mpirun", cmd, {"OMPI_MCA_orte_tmpdir_base": session})


PHASE_ARGS = {
    "rendezvous": ["--phase", "rendezvous"],
    "allreduce": ["--phase", "allreduce", "--mib", "64"],
    "backward": ["--phase", "backward"],
    "snapshot": ["--phase", "snapshot", "--model-mb", "128", "--mib", "16", "--epochs", "5",
                 "--snapshot_path", "snap.safetensors"],
    "stop": ["--phase", "allreduce", "--mib", "64"],
}


def reach(job, pattern, timeout=60):
    """Waits for a line matching pattern (where arm injects the fault). Retry when every process of the job ended
    first: no fault was injected (once in CI, 4 ranks on 2 loaded cores timed out their first broadcast), so the
    row has shown nothing yet and runs once more."""
    r = job.line(pattern, timeout, or_ended=True)
    if r == "ended":
        last = next((ln.strip() for p in job.procs for _, ln in reversed(p.lines) if "ddp[" in ln), "(no message)")
        raise Retry(f"the job ended before {pattern!r}, before any fault was injected: {shorten(last)}")
    return r


def arm(job, phase, n, k):
    """Waits until rank k is inside `phase`; returns a note for the observed column."""
    if phase == "rendezvous":
        reach(job, rf"fw rank {k}: phase rendezvous hold")
        for r in range(n):
            if r != k:
                reach(job, rf"fw rank {r}: phase rendezvous store-joined")
        return ""
    if phase in ("allreduce", "stop"):
        reach(job, rf"fw rank {k}: phase allreduce iter 2\b")
        return ""
    if phase == "backward":
        reach(job, rf"fw rank {k}: phase backward step 1 start")
        return ""
    if phase == "snapshot":
        reach(job, r"fw rank 0: phase snapshot-write epoch 2 start")
        tmp = os.path.join(job.tag, "snap.safetensors.tmp")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the write of epoch 2 is under way once .tmp has bytes
            try:
                size = os.stat(tmp).st_size
            except FileNotFoundError:
                size = 0
            if size > 0:
                return f"kill at .tmp={size >> 10} KiB; "
            if any("phase snapshot-write epoch 2 end" in line for p in job.procs for _, line in p.lines):
                raise Retry("the write of epoch 2 finished before the kill")
            time.sleep(0.0005)  # polling the file: it appears ~ms after the start line
        raise RowFailed("epoch 2's snapshot write never started")
    raise ValueError(phase)


class Retry(Exception):
    pass


def check_snapshot(a, job):
    """The snapshot on disk must load with the library's loader, be epoch 2 (previous) or 3 (new), and every
    weight must be right. Returns a note."""
    notes = []
    for name, allowed in (("snap.safetensors", (2, 3)), ("snap.safetensors.prev", (1, 2))):
        path = os.path.join(job.tag, name)
        p = subprocess.run([a.worker, "--verify", path, "--model-mb", "128", "--tag", job.tag], capture_output=True,
                           text=True, timeout=60)
        m = re.search(r"epoch (\d+) ok", p.stdout)
        if p.returncode != 0 or not m or int(m.group(1)) not in allowed:
            raise RowFailed(f"{name}: not an intact epoch {allowed}: rc {p.returncode} {p.stdout}{p.stderr}")
        e = int(m.group(1))
        notes.append(f"file=epoch {e} ({'new' if e == 3 else 'previous'})" if name == "snap.safetensors"
                     else f".prev=epoch {e}")
    return "; ".join(notes) + " intact"


def tcp_fault(phase, n, k):
    """tcp, ranks started directly: kill -9 (or SIGSTOP) rank k in `phase`."""
    def run(a, job):
        extra = ["--hold-rank", str(k)] if phase == "rendezvous" else []
        procs = start_tcp(job, a, n, PHASE_ARGS[phase] + extra)
        note = arm(job, phase, n, k)
        sig = signal.SIGSTOP if phase == "stop" else signal.SIGKILL
        t_fault = time.monotonic()
        os.kill(procs[k].popen.pid, sig)
        survivors = [p for r, p in enumerate(procs) if r != k]
        still = job.exited(survivors, LIMIT_S + 5)
        if still:
            raise RowFailed(f"ranks {[p.name for p in still]} still running {LIMIT_S + 5:.0f} s after the fault")
        secs = max(p.exit_t for p in survivors) - t_fault
        bad = []
        for r, p in enumerate(procs):
            if r == k:
                continue
            text, rc = p.text(), p.popen.returncode
            if rc == 0 or rc < 0:
                bad.append(f"rank {r} rc {rc}")
            if not names_rank(text, k):
                bad.append(f"rank {r} does not name rank {k}")
            if not re.search(OPS[phase], text):
                bad.append(f"rank {r} does not name the op /{OPS[phase]}/")
        if phase == "stop":  # the stopped rank, once continued, must fail by itself as well
            t_cont = time.monotonic()
            os.kill(procs[k].popen.pid, signal.SIGCONT)
            if job.exited([procs[k]], LIMIT_S):
                bad.append(f"stopped rank {k} still running {LIMIT_S:.0f} s after SIGCONT")
            elif procs[k].popen.returncode == 0:
                bad.append(f"stopped rank {k} exited 0 after SIGCONT")
            else:
                note += f"rank {k} after SIGCONT: rc {procs[k].popen.returncode} in {procs[k].exit_t - t_cont:.1f} s; "
        elif job.exited([procs[k]], 10) or procs[k].popen.returncode != -signal.SIGKILL:
            bad.append(f"victim rc {procs[k].popen.returncode}")
        if phase == "snapshot":
            note += check_snapshot(a, job) + "; "
        first = next(p for r, p in enumerate(procs) if r != k)
        msg = next((ln.strip() for _, ln in reversed(first.lines) if ln.startswith("ddp[")), "(no message)")
        rcs = sorted({p.popen.returncode for r, p in enumerate(procs) if r != k})
        observed = f"{note}survivors rc {rcs}; e.g. {shorten(msg)}"
        return bad, observed, secs
    return run


def mpi_fault(phase, n, k):
    """mpi under mpirun: kill -9 (or SIGSTOP) rank k in `phase`."""
    def run(a, job):
        extra = ["--hold-rank", str(k)] if phase == "rendezvous" else []
        mp = start_mpi(job, a, n, PHASE_ARGS[phase] + extra)
        note = arm(job, phase, n, k)
        pid = job.pid_of(k)
        sig = signal.SIGSTOP if phase == "stop" else signal.SIGKILL
        t_fault = time.monotonic()
        os.kill(pid, sig)
        if job.exited([mp], LIMIT_S + 5):
            raise RowFailed(f"mpirun still running {LIMIT_S + 5:.0f} s after the fault")
        secs = mp.exit_t - t_fault
        text, bad = mp.text(), []
        if mp.popen.returncode == 0:
            bad.append("mpirun exited 0")
        survivor_msgs = [ln.split(">:", 1)[-1].strip() for _, ln in mp.lines if "<stderr>:ddp[" in ln]
        if phase == "stop":
            if not survivor_msgs or not re.search(OPS["stop"], " ".join(survivor_msgs)):
                bad.append("no survivor message naming the op")
            # One host: the all-reduce runs in shared memory (docs/decisions/0055), whose wait knows which rank never
            # arrived.
            if not any(f"waiting for rank {k} in shared memory" in m for m in survivor_msgs):
                bad.append(f"no survivor message naming rank {k}")
            # mpirun ends the job on the MPI_Abort; its "MPI_ABORT was invoked" text is usually printed, but
            # OpenMPI 4.1 sometimes logs "ORTE_ERROR_LOG: Out of resource in file .../show_help.c" instead.
            said = "MPI_ABORT was invoked" in text
            observed = f"{len(survivor_msgs)} survivor message(s), e.g. {shorten(survivor_msgs[0]) if survivor_msgs else '-'}; " \
                       f"mpirun rc {mp.popen.returncode}{' (MPI_ABORT text)' if said else ' (no MPI_ABORT text)'}"
        else:
            m = re.search(r"mpirun noticed that process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)", text)
            if not m or int(m.group(1)) != k:
                bad.append(f"mpirun does not name rank {k}")
            observed = (f"{note}mpirun rc {mp.popen.returncode}: 'process rank {m.group(1)} ... exited on signal "
                        f"{m.group(2)}'; survivor messages: {len(survivor_msgs)}" if m else f"{note}mpirun rc {mp.popen.returncode}")
            if survivor_msgs:
                observed += f" (e.g. {shorten(survivor_msgs[0])})"
        if phase == "snapshot":
            observed += "; " + check_snapshot(a, job)
        return bad, observed, secs
    return run


def ddprun_kill(n, k):
    """ddprun without restarts: kill -9 rank k mid all-reduce; ddprun must name it and stop the rest."""
    def run(a, job):
        d = job.start("ddprun", [a.ddprun, "--nproc-per-node", str(n), "--standalone", "--grace-period", "2",
                                 *worker_args(a, job.tag, "--backend", "tcp", *PHASE_ARGS["allreduce"])])
        job.line(rf"fw rank {k}: phase allreduce iter 2\b")
        pid = job.pid_of(k)
        t_fault = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        if job.exited([d], LIMIT_S + 5):
            raise RowFailed("ddprun still running")
        secs, text, bad = d.exit_t - t_fault, d.text(), []
        if d.popen.returncode == 0:
            bad.append("ddprun exited 0")
        if not re.search(rf"ddprun: worker rank {k} \(pid {pid}\) failed", text):
            bad.append(f"ddprun does not name rank {k}")
        own = [r for r in range(n) if r != k and re.search(rf"\[rank{r}\]: ddp\[rank {r}/{n}\]: .*rank {k}\b", text)]
        observed = (f"ddprun rc {d.popen.returncode}, names rank {k}; survivors that failed on their own naming "
                    f"rank {k} before ddprun's SIGTERM: {own or 'none'}")
        return bad, observed, secs
    return run


def ddprun_restart(n, k):
    """ddprun --max-restarts 1: kill -9 rank k in epoch 3; the job restarts, resumes and finishes."""
    def run(a, job):
        d = job.start("ddprun", [a.ddprun, "--nproc-per-node", str(n), "--standalone", "--max-restarts", "1",
                                 "--grace-period", "2",
                                 *worker_args(a, job.tag, "--backend", "tcp", "--phase", "train", "--model-mb", "1",
                                              "--mib", "16", "--epochs", "6", "--snapshot_path", "snap.safetensors")])
        job.line(rf"fw rank {k}: phase train epoch 3\b")
        pid = job.pid_of(k)
        t_fault = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        if job.exited([d], 90):
            raise RowFailed("ddprun still running 90 s after the kill")
        secs, text, bad = d.exit_t - t_fault, d.text(), []
        if d.popen.returncode != 0:
            bad.append(f"ddprun rc {d.popen.returncode}")
        m = re.search(r"fw rank 0: resumed at epoch (\d+)", text)
        if not m or int(m.group(1)) < 3:
            bad.append("no resume at epoch >= 3")
        done = len(re.findall(r"fw rank \d+: done", text))
        if done != n:
            bad.append(f"{done} of {n} ranks finished")
        p = subprocess.run([a.worker, "--verify", os.path.join(job.tag, "snap.safetensors"), "--model-mb", "1",
                            "--tag", job.tag], capture_output=True, text=True, timeout=60)
        if "epoch 6 ok" not in p.stdout:
            bad.append(f"final snapshot: {p.stdout}{p.stderr}")
        observed = (f"ddprun names rank {k}: {bool(re.search(rf'worker rank {k} ', text))}; restarted, "
                    f"resumed at epoch {m.group(1) if m else '?'}, {done}/{n} done, rc {d.popen.returncode}, "
                    f"final snapshot epoch 6 weights exact: {'epoch 6 ok' in p.stdout}")
        return bad, observed, secs
    return run


def link_cut(a, job):
    """Two namespace nodes, one rank each (tcp over the veth); node 1's link to the bridge goes down."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise Skip("network namespaces need root and ip")
    sys.path.insert(0, os.path.join(HERE, "..", "netns"))
    import netns_tests as nt  # the Cluster of the netns tests: namespaces, veths, bridge, teardown
    nt.delete_leftovers()
    c = nt.Cluster(2)
    try:
        try:
            c.up()
        except nt.Skip as e:
            raise Skip(str(e))
        procs = []
        for r in range(2):
            env = {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "MASTER_ADDR": c.addr(0), "MASTER_PORT": nt.PORT}
            procs.append(job.start(f"rank {r}", c.node_cmd(r, worker_args(a, job.tag, "--backend", "tcp", "--phase",
                                                                           "allreduce", "--mib", "4")), env))
        for r in range(2):
            job.line(rf"fw rank {r}: phase allreduce iter 3\b")
        t_fault = time.monotonic()
        nt.sh("ip", "-n", c.bridge, "link", "set", "v1n0", "down")
        still = job.exited(procs, LIMIT_S + 5)
        if still:
            raise RowFailed(f"{[p.name for p in still]} still running {LIMIT_S + 5:.0f} s after the cut")
        secs = max(p.exit_t for p in procs) - t_fault
        bad = []
        for r, p in enumerate(procs):
            text, rc = p.text(), p.popen.returncode
            if rc == 0 or rc < 0:
                bad.append(f"rank {r} rc {rc}")
            if not names_rank(text, 1 - r):
                bad.append(f"rank {r} does not name rank {1 - r}")
            if not re.search(OPS["link"], text):
                bad.append(f"rank {r} does not name the op")
        inside = [ns for ns in c.nodes if nt.sh("ip", "netns", "pids", ns, check=False).split()]
        if inside:
            bad.append(f"processes left in {inside}")
        msgs = [next((ln.strip() for _, ln in reversed(p.lines) if ln.startswith("ddp[")), "-") for p in procs]
        observed = (f"rc {[p.popen.returncode for p in procs]} after {[round(p.exit_t - t_fault, 1) for p in procs]} s; "
                    + " | ".join(shorten(m, 150) for m in msgs))
        return bad, observed, secs
    finally:
        c.down()


def shorten(s, n=170):
    s = re.sub(r"\s+", " ", s)
    return s if len(s) <= n else s[:n - 3] + "..."


# ---------------------------------------------------------------- the matrix

def matrix():
    rows = []
    exp_kill = "survivors rc!=0 <= T+5 s naming rank {k} + op; no process left"
    for n in (2, 4):
        for phase in ("rendezvous", "allreduce", "backward", "snapshot"):
            for k in (0, n - 1):
                e = exp_kill.format(k=k) + ("; file previous or new, intact" if phase == "snapshot" else "")
                rows.append(Row(f"tcp n={n} kill -9 rank {k} in {phase}", e, tcp_fault(phase, n, k), "tcp"))
        for k in (0, n - 1):
            rows.append(Row(f"tcp n={n} SIGSTOP rank {k} in allreduce",
                            f"survivors time out rc!=0 <= T+5 s naming rank {k} + op; rank {k} fails after SIGCONT",
                            tcp_fault("stop", n, k), "tcp"))
    for k in (0, 3):
        rows.append(Row(f"ddprun n=4 kill -9 rank {k} in allreduce",
                        f"ddprun rc!=0 <= T+5 s naming rank {k}; rest stopped; no process left", ddprun_kill(4, k), "tcp"))
    for n, k in ((2, 1), (4, 0)):
        rows.append(Row(f"ddprun --max-restarts 1 n={n} kill -9 rank {k} in epoch 3",
                        "restart, resume from the snapshot, rc 0, final snapshot exact", ddprun_restart(n, k), "tcp"))
    for n in (2, 4):
        for phase in ("rendezvous", "allreduce", "backward", "snapshot"):
            for k in (0, n - 1):
                e = f"mpirun ends the job rc!=0 <= T+5 s naming rank {k}; no process left" + \
                    ("; file previous or new, intact" if phase == "snapshot" else "")
                rows.append(Row(f"mpi n={n} kill -9 rank {k} in {phase}", e, mpi_fault(phase, n, k), "mpi"))
        for k in (0, n - 1):
            rows.append(Row(f"mpi n={n} SIGSTOP rank {k} in allreduce",
                            f"a survivor times out <= T+5 s naming the op and rank {k} (shared memory on one host); "
                            "MPI_Abort ends all", mpi_fault("stop", n, k), "mpi"))
    rows.append(Row("tcp n=2 link cut (veth down) node 1", "both ranks rc!=0 <= T+5 s naming the peer + op; "
                    "no process left", link_cut, "link"))
    return rows


def mpi_prereq(a):
    if shutil.which("mpirun") is None:
        return "mpirun not found (install openmpi-bin)"
    p = subprocess.run([a.worker, "--backend", "mpi", "--phase", "allreduce", "--iters", "1", "--mib", "1"],
                       capture_output=True, text=True, timeout=60)
    if "not built" in p.stdout + p.stderr or "DDP_WITH_MPI" in p.stdout + p.stderr:
        return "fault_worker was built without ddp::mpi"
    return None


def run_row(a, row):
    for attempt in range(2):
        tag = tempfile.mkdtemp(prefix=f"ddp_faults.{os.getpid()}.{re.sub(r'[^a-z0-9]+', '_', row.name)}.")
        job = Job(tag)
        try:
            bad, row.observed, row.secs = row.fn(a, job)
        except Retry as e:
            if attempt == 0:
                job.cleanup()
                shutil.rmtree(tag, ignore_errors=True)
                continue
            bad = [str(e)]
        except Skip as e:
            row.status, row.observed = "SKIP", str(e)
            job.cleanup()
            shutil.rmtree(tag, ignore_errors=True)
            return row
        except (RowFailed, subprocess.SubprocessError, OSError) as e:
            bad = [f"{type(e).__name__}: {e}"]
        left = job.cleanup()
        if left:
            bad.append(f"left behind: {left}")
        if row.secs is not None and row.secs > LIMIT_S and "max-restarts" not in row.name:
            bad.append(f"{row.secs:.1f} s > timeout + 5 s")
        row.status = "FAIL" if bad else "PASS"
        if bad:
            row.observed = "; ".join(bad) + (" | " + row.observed if row.observed else "")
            row.log = "\n".join(f"--- {p.name} (rc {p.popen.returncode}):\n{p.text()[-6000:]}" for p in job.procs)
        shutil.rmtree(tag, ignore_errors=True)
        return row
    return row


def main():
    global TIMEOUT_MS, LIMIT_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--select", choices=["tcp", "mpi", "link", "all"], default="all")
    ap.add_argument("--worker", required=True)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--jobs", type=int, default=2, help="rows run at once")
    ap.add_argument("--only", default="", help="regex: run only the rows whose name matches")
    ap.add_argument("--timeout-ms", type=int, default=TIMEOUT_MS, help="the ranks' --timeout-ms (T)")
    a = ap.parse_args()
    TIMEOUT_MS, LIMIT_S = a.timeout_ms, a.timeout_ms / 1000 + SLACK_S
    a.worker, a.ddprun = os.path.abspath(a.worker), os.path.abspath(a.ddprun)
    rows = [r for r in matrix() if a.select in ("all", r.needs) and re.search(a.only, r.name)]
    skip_why = {}
    if any(r.needs == "mpi" for r in rows):
        why = mpi_prereq(a)
        if why:
            skip_why["mpi"] = why
    for r in rows:
        if r.needs in skip_why:
            r.status, r.observed = "SKIP", skip_why[r.needs]
    t0 = time.monotonic()
    todo = [r for r in rows if r.status == "?"]
    # Link-cut rows build namespaces; run them alone so that their timing is not disturbed by the others.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futs = [pool.submit(run_row, a, r) for r in todo if r.needs != "link"]
        for f in concurrent.futures.as_completed(futs):
            r = f.result()
            print(f"{r.status} {r.name} ({'-' if r.secs is None else f'{r.secs:.2f} s'})", flush=True)
    for r in todo:
        if r.needs == "link":
            run_row(a, r)
            print(f"{r.status} {r.name} ({'-' if r.secs is None else f'{r.secs:.2f} s'})", flush=True)
    wall = time.monotonic() - t0

    for r in rows:
        if r.status == "FAIL" and r.log:
            print(f"\n===== FAILED: {r.name}\n{r.log}")
    w = max(len(r.name) for r in rows)
    print(f"\nFault matrix (T = --timeout-ms {TIMEOUT_MS} ms; bound T + {SLACK_S:.0f} s = {LIMIT_S:.0f} s; "
          f"seconds to exit: the last survivor / launcher after the fault)")
    print(f"{'scenario':<{w}} | {'result':<6} | {'s to exit':>9} | expected | observed")
    for r in rows:
        secs = "-" if r.secs is None else f"{r.secs:.2f}"
        print(f"{r.name:<{w}} | {r.status:<6} | {secs:>9} | {r.expected} | {r.observed}")
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}
    print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in {wall:.1f} s")
    if counts["FAIL"]:
        return 1
    if counts["PASS"] == 0:
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
