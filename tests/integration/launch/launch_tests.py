#!/usr/bin/python3
# Launcher tests: ddprun's supervision (exit codes, restarts, signals, no process left, rank-prefixed
# lines), ddprun's environment against real torchrun's, and the probe example under ddprun, torchrun and
# mpirun. Run by CTest: launch_tests.py CASE --ddprun PATH [--probe PATH]. Exit 0 pass, 1 fail, 77 skip.
# SPDX-License-Identifier: MIT
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from driver import PY, SKIP, Skip, expect, free_port, run  # noqa: E402


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def assert_all_gone(pids, context):
    deadline = time.monotonic() + 1.0  # ddprun reaps before it exits; allow the kernel a moment
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    expect(not left, f"processes left behind: {left}", context)


def pids_from(out):
    return [int(x) for x in re.findall(r"pid=(\d+)", out)]


# ---------------------------------------------------------------- ddprun supervision
# Every ddprun here uses --standalone (a free port) so that tests can run in parallel (ctest -j).

def case_exit_code(a):
    # Rank 1 exits 3; ranks 0 and 2 ignore SIGTERM (so SIGKILL is needed) and each leaves a background
    # child in its process group. ddprun must exit 3 after about the grace period, with nothing left.
    script = ('[ "$RANK" != 1 ] && trap "" TERM; sleep 30 & echo "pid=$$ pid=$!"; '
              'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; wait')
    t0 = time.monotonic()
    rc, out, err = run([a.ddprun, "--standalone", "--nproc-per-node", "3", "--grace-period", "1", "sh", "-c", script])
    elapsed = time.monotonic() - t0
    print(f"exit_code: rc={rc} elapsed={elapsed:.2f}s")
    expect(rc == 3, f"ddprun exit code {rc}, expected 3", out, err)
    expect(1.0 <= elapsed < 1.0 + 2.5, f"took {elapsed:.2f}s; grace period 1 s, then SIGKILL", err)
    expect("grace period of 1000 ms over; sending SIGKILL" in err, "no SIGKILL escalation reported", err)
    expect("worker rank 1 (pid" in err and "failed with exit code 3" in err, "failure not reported", err)
    pids = pids_from(out)
    expect(len(pids) == 6, f"expected 6 pids (3 workers + 3 children), got {pids}", out)
    assert_all_gone(pids, out)


def case_fast_exit(a):
    # Workers that end on SIGTERM: ddprun must not wait for the grace period.
    t0 = time.monotonic()
    rc, out, err = run([a.ddprun, "--standalone", "--nproc-per-node", "2", "--grace-period", "10", "sh", "-c",
                        'echo "pid=$$"; [ "$RANK" = 1 ] && exit 3; exec sleep 30'])
    elapsed = time.monotonic() - t0
    print(f"fast_exit: rc={rc} elapsed={elapsed:.2f}s")
    expect(rc == 3 and elapsed < 3.0, f"rc={rc} elapsed={elapsed:.2f}s", err)
    assert_all_gone(pids_from(out), out)


def case_signal_exit(a):
    # A worker killed by a signal: exit code 128 + n, as a shell reports it.
    rc, out, err = run([a.ddprun, "--standalone", "--nproc-per-node", "2", "sh", "-c",
                        '[ "$RANK" = 0 ] && kill -KILL $$; exec sleep 30'])
    print(f"signal_exit: rc={rc}")
    expect(rc == 137, f"rc={rc}, expected 137 (SIGKILL)", err)
    expect("failed with signal 9 (SIGKILL)" in err, "signal not named", err)


def case_restart(a):
    # Rank 1 fails on the first attempt only; with --max-restarts 2 the job succeeds on the second. Rank 1 fails
    # only once rank 0 has printed (the marker file): otherwise the stop could reach rank 0 before its echo.
    marker = os.path.join(tempfile.mkdtemp(prefix="ddp_restart_"), "rank0_printed")
    script = ('echo "count=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS"; '
              'if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then '
              f'while [ ! -e {marker} ]; do sleep 0.01; done; exit 5; fi; '
              'if [ "$RANK" = 0 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then '
              f'touch {marker}; exec sleep 30; fi')
    try:
        rc, out, err = run([a.ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "sh", "-c",
                            script])
    finally:
        shutil.rmtree(os.path.dirname(marker), ignore_errors=True)
    print(f"restart: rc={rc}\n{out}")
    expect(rc == 0, f"rc={rc}, expected 0 after one restart", out, err)
    lines = sorted(out.splitlines())
    expect(lines == ["[rank0]: count=0 max=2", "[rank0]: count=1 max=2", "[rank1]: count=0 max=2",
                     "[rank1]: count=1 max=2"], "unexpected attempts", out, err)
    expect("restarting all 2 workers (restart 1 of 2)" in err, "restart not reported", err)


def case_restart_exhausted(a):
    rc, out, err = run([a.ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "sh", "-c",
                        'echo "count=$TORCHELASTIC_RESTART_COUNT"; exit 4'])
    print(f"restart_exhausted: rc={rc}")
    expect(rc == 4, f"rc={rc}, expected 4", out, err)
    counts = sorted(re.findall(r"count=(\d)", out))
    expect(counts[-1] == "2" and len(counts) >= 3, f"attempts seen: {counts}", out)
    expect("giving up after 2 restart(s)" in err, "give-up not reported", err)


def case_sigterm(a):
    # SIGTERM to ddprun reaches every worker; ddprun exits 143 and leaves nothing.
    p = subprocess.Popen([a.ddprun, "--standalone", "--nproc-per-node", "2", "--grace-period", "2", "sh", "-c",
                          'trap "echo got-TERM; exit 0" TERM; echo "pid=$$ ready"; sleep 30 & wait'],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        seen = []
        while len(seen) < 2:
            line = p.stdout.readline()
            expect(line != "", "ddprun ended before the workers were ready")
            if "ready" in line:
                seen.append(line)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    out = "".join(seen) + out
    print(f"sigterm: rc={p.returncode}\n{out}")
    expect(p.returncode == 128 + signal.SIGTERM, f"rc={p.returncode}, expected 143", out, err)
    expect(out.count("got-TERM") == 2, "SIGTERM not forwarded to both workers", out, err)
    assert_all_gone(pids_from(out), out)


def case_kill9(a):
    # ddprun killed with SIGKILL cannot clean up: PR_SET_PDEATHSIG makes the kernel kill the workers.
    p = subprocess.Popen([a.ddprun, "--standalone", "--nproc-per-node", "2", "sh", "-c",
                          'echo "pid=$$ ready"; exec sleep 30'],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    seen = []
    try:
        while len(seen) < 2:
            line = p.stdout.readline()
            expect(line != "", "ddprun ended before the workers were ready")
            seen.append(line)
        p.kill()
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    pids = pids_from("".join(seen))
    expect(len(pids) == 2, f"pids {pids}")
    assert_all_gone(pids, "".join(seen))
    print(f"kill9: workers {pids} gone after ddprun was SIGKILLed")


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def case_root_cause(a):
    # Several workers failed before ddprun looked (a rank killed, its peers failing on their own right after,
    # naming it): ddprun must name the one killed by a signal, not the lowest rank (waitpid(-1) returns the
    # oldest child first). Made deterministic by stopping ddprun (SIGSTOP) while all three workers end, so
    # that they are all zombies when it next looks: ranks 0 and 1 exit 1, rank 2 is SIGKILLed.
    with tempfile.TemporaryDirectory() as tmp:
        go = os.path.join(tmp, "go")
        script = ('echo "pid=$$ ready"; while [ ! -e "$GO" ]; do sleep 0.01; done; '
                  '[ "$RANK" = 2 ] && kill -KILL $$; exit 1')
        p = subprocess.Popen([a.ddprun, "--standalone", "--nproc-per-node", "3", "sh", "-c", script],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env=dict(os.environ, GO=go))
        try:
            seen = []
            while len(seen) < 3:
                line = p.stdout.readline()
                if line == "":
                    expect(False, "ddprun ended before the workers were ready", "".join(seen), p.stderr.read())
                seen.append(line)
            pids = pids_from("".join(seen))
            expect(len(pids) == 3, f"pids {pids}", "".join(seen))
            os.kill(p.pid, signal.SIGSTOP)
            open(go, "w").close()
            deadline = time.monotonic() + 10
            while not all(zombie(q) for q in pids):
                expect(time.monotonic() < deadline, "the workers did not all end within 10 s",
                       [(q, zombie(q)) for q in pids])
                time.sleep(0.01)
            os.kill(p.pid, signal.SIGCONT)
            out, err = p.communicate(timeout=20)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    print(f"root_cause: rc={p.returncode}")
    expect("worker rank 2 (pid" in err and "failed with signal 9 (SIGKILL)" in err,
           "ddprun did not name rank 2, the one killed by a signal", err)
    expect(p.returncode == 137, f"rc={p.returncode}, expected 137 (rank 2's SIGKILL)", err)


def case_prefix(a):
    # Two workers write long lines in small unflushed-then-flushed pieces at the same time: every output
    # line must be exactly one worker line with that worker's prefix (no mid-line interleaving).
    worker = ("import os,sys\n"
              "r=os.environ['RANK']\n"
              "for i in range(300):\n"
              "    line=f'R{r}-{i}-'+'x'*(1000+i)+'\\n'\n"
              "    for k in range(0,len(line),97):\n"
              "        sys.stdout.write(line[k:k+97]); sys.stdout.flush()\n"
              "sys.stderr.write(f'err-from-{r}'); sys.stderr.flush()\n")
    rc, out, err = run([a.ddprun, "--standalone", "--nproc-per-node", "2", PY, "-c", worker])
    expect(rc == 0, f"rc={rc}", err)
    lines = out.splitlines()
    expect(len(lines) == 600, f"{len(lines)} lines, expected 600")
    for ln in lines:
        m = re.fullmatch(r"\[rank(\d)\]: R(\d)-(\d+)-(x+)", ln)
        expect(m is not None and m.group(1) == m.group(2) and len(m.group(4)) == 1000 + int(m.group(3)),
               f"bad line: {ln[:80]}...")
    for r in (0, 1):
        expect(f"[rank{r}]: err-from-{r}\n" in err, f"stderr tail of rank {r} missing", err)
    print("prefix: 600 lines, all whole and correctly prefixed")


def case_exit_barrier(a):
    # Two nodes on this host: node 0's worker ends at once, node 1 starts later. Node 0 must keep its
    # store up (and not exit) until node 1 is done, then both exit 0.
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    n0 = subprocess.Popen([a.ddprun, *common, "--node-rank", "0", "true"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(0.5)  # let node 0 finish its worker first: that is the situation under test
        expect(n0.poll() is None, "node 0 exited before node 1 joined")
        rc1, _, err1 = run([a.ddprun, *common, "--node-rank", "1", "sleep", "0.3"], timeout=20)
        t1 = time.monotonic()
        _, err0 = n0.communicate(timeout=10)
        t0 = time.monotonic()
    finally:
        if n0.poll() is None:
            os.killpg(n0.pid, signal.SIGKILL)
            n0.wait()
    print(f"exit_barrier: node1 rc={rc1}, node0 rc={n0.returncode}, node 0 exited {t0 - t1:.2f}s after node 1")
    expect(rc1 == 0 and n0.returncode == 0, "exit codes", err0, err1)
    expect("exit barrier: all 2 nodes done" in err0, "barrier not reported", err0)


PINNED = {
    ("--nproc-per-node", "two", "true"): "ddp: ddprun: --nproc-per-node='two' is not an integer.",
    ("--bogus", "true"): "ddp: ddprun: unknown flag '--bogus'. Valid flags: --nproc-per-node, --nnodes, "
                         "--node-rank, --master-addr, --master-port, --standalone, --max-restarts, --run-id, "
                         "--monitor-interval, --grace-period, --no-python, --redirects, --tee, --log-dir, --help. "
                         "Flags go before PROGRAM; run ddprun --help.",
    ("--nproc-per-node", "2"): "ddp: ddprun: no PROGRAM given. Usage: ddprun [flags] PROGRAM [ARGS...]; "
                               "run ddprun --help.",
    ("./no-such-program-xyz",): "ddp: ddprun: cannot execute './no-such-program-xyz': not an executable file. "
                                "Check the path and its x permission.",
    ("no-such-program-xyz",): "ddp: ddprun: program 'no-such-program-xyz' not found in PATH. Give a path such as "
                              "./no-such-program-xyz.",
}


def case_bad_flags(a):
    for args, msg in PINNED.items():
        rc, out, err = run([a.ddprun, *args], timeout=10)
        expect(rc == 1 and err.strip() == msg, f"ddprun {' '.join(args)}: rc={rc}", f"got: {err}", f"want: {msg}")
    # A port that is already taken: ddprun names its flag, then the store server's diagnosis.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, out, err = run([a.ddprun, "--master-port", str(port), "true"], timeout=10)
    want = (f"ddp: ddprun: node 0 cannot host the store on --master-port {port} (--standalone picks a free port): "
            f"cannot listen on 127.0.0.1:{port}: Address already in use")
    expect(rc == 1 and err.strip().splitlines()[-1].startswith(want), f"port in use: rc={rc}", err, want)
    rc, out, _ = run([a.ddprun, "--help"], timeout=10)
    expect(rc == 0 and "--nproc-per-node N" in out, "--help")
    print(f"bad_flags: {len(PINNED)} pinned messages")


def env_of(out, rank):
    env = {}
    for ln in out.splitlines():
        ln = re.sub(r"^\[rank\d\]: ", "", ln) if ln.startswith("[rank") else ln
        k, sep, v = ln.partition("=")
        if sep:
            env.setdefault(k, []).append(v)
    return env


def case_env_vs_torchrun(a):
    # Each worker dumps its environment into <dir>/<RANK>.json; compare what ddprun and torchrun add to
    # the parent's environment, rank by rank (same --master-port for both, run one after the other).
    have_torch()
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "_")}
    dump = (f'{PY} -c "import os,json,sys; json.dump(dict(os.environ), '
            f'open(sys.argv[1] + \'/\' + os.environ[\'RANK\'] + \'.json\', \'w\'))"')

    def added(d):
        envs = {r: json.load(open(f"{d}/{r}.json")) for r in ("0", "1")}
        return {r: {k: v for k, v in e.items() if base.get(k) != v and k != "_"} for r, e in envs.items()}
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2, \
            tempfile.TemporaryDirectory() as logs:
        rc1, out1, err1 = run([a.ddprun, "--nproc-per-node", "2", "--master-port", str(port), "sh", "-c",
                               dump + ' "$0"', d1], env=base)
        expect(rc1 == 0, f"ddprun rc={rc1}", out1, err1)
        rc2, out2, err2 = run([PY, "-m", "torch.distributed.run", "--redirects", "9:1", "--tee", "9:1", "--log_dir",
                               logs, "--nproc_per_node=2", f"--master_port={port}", "--no_python", "sh", "-c",
                               dump + ' "$0"', d2], env=base, timeout=60)
        expect(rc2 == 0, f"torchrun rc={rc2}", out2, err2)
        ours, theirs = added(d1), added(d2)
    for rank in ("0", "1"):
        t = dict(theirs[rank])
        t.pop("TORCHELASTIC_ERROR_FILE", None)  # torchrun's per-worker error file; ddprun writes none
        expect(ours[rank] == t, f"rank {rank}: ddprun vs torchrun differ",
               f"ddprun:   {sorted(ours[rank].items())}", f"torchrun: {sorted(t.items())}")
    notice = "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"
    expect(notice in err1 and notice in err2, "OMP notice missing", err1, err2)
    print("env_vs_torchrun: identical for both ranks; rank 1 gets", sorted(ours["1"].items()))


# ---------------------------------------------------------------- probe under three launchers

def have_torch():
    rc, _, _ = run([PY, "-c", "import torch.distributed.run"], timeout=60)
    if rc != 0:
        raise Skip("/usr/bin/python3 has no torch.distributed.run (install python3-torch)")


def check_probe(out, err, source, owns_store, world=2, local_world=2):
    infos = [json.loads(m) for m in re.findall(r"probe: (\{.*\})", out)]
    expect(len(infos) == world, f"expected {world} probe JSON lines, got {len(infos)}", out, err)
    ranks = sorted(i["rank"] for i in infos)
    local = sorted(i["local_rank"] for i in infos)
    expect(ranks == list(range(world)), f"ranks {ranks}", out)
    expect(local == sorted(list(range(local_world)) * (world // local_world)), f"local ranks {local}", out)
    for i in infos:
        expect(i["world_size"] == world and i["local_world_size"] == local_world, "world sizes", i)
        expect(i["source"] == source, f"source {i['source']!r}, expected {source!r}", i)
        expect(i["launcher_owns_store"] is owns_store, f"launcher_owns_store {i['launcher_owns_store']}", i)
    sees = re.findall(r"probe: rank (\d+) sees (\d+) ranks", out)
    expect(sorted(sees) == sorted((str(r), str(world)) for r in range(world)), f"rendezvous lines: {sees}", out, err)
    print(f"probe under {source}: ranks {ranks}, local {local}, world {world}, owns_store={owns_store}, rendezvous ok")
    for i in infos:
        print("  ", json.dumps(i))


def case_probe_ddprun(a):
    rc, out, err = run([a.ddprun, "--nproc-per-node", "2", "--standalone", a.probe], timeout=30)
    expect(rc == 0, f"rc={rc}", out, err)
    expect(all(ln.startswith("[rank") for ln in out.splitlines()), "unprefixed line", out)
    check_probe(out, err, "torchrun", True)


def case_probe_ddprun_nnodes(a):
    # Two ddprun "nodes" on this host (static rendezvous): node 0 hosts the store on the given port, node 1
    # only passes MASTER_ADDR/PORT on; the 4 ranks meet in node 0's store.
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    procs = [subprocess.Popen([a.ddprun, *common, "--node-rank", str(n), a.probe], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for n in (1, 0)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=30))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    expect(all(p.returncode == 0 for p in procs), f"rc={[p.returncode for p in procs]}", outs)
    check_probe(outs[0][0] + outs[1][0], outs[0][1] + outs[1][1], "torchrun", True, world=4, local_world=2)


def case_probe_torchrun(a):
    have_torch()
    with tempfile.TemporaryDirectory() as logs:
        rc, out, err = run([PY, "-m", "torch.distributed.run", "--redirects", "9:1", "--tee", "9:1", "--log_dir", logs,
                            "--nproc_per_node=2", f"--master_port={free_port()}", "--no_python", a.probe], timeout=60)
    expect(rc == 0, f"rc={rc}", out, err)
    check_probe(out, err, "torchrun", True)


def case_probe_mpirun(a):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise Skip("mpirun not found (install openmpi-bin)")
    rc, out, err = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "MASTER_ADDR=localhost",
                        "-x", f"MASTER_PORT={free_port()}", "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1",
                        "-mca", "btl", "^openib", a.probe], timeout=60)
    expect(rc == 0, f"rc={rc}", out, err)
    check_probe(out, err, "openmpi", False)


# ---------------------------------------------------------------- message_passing under every launcher

def check_message_passing(rc, out, err, world=2):
    expect(rc == 0, f"rc={rc}", out, err)
    for r in range(1, world):
        expect(f"Rank 0 sent data to Rank {r}" in out, f"missing 'Rank 0 sent data to Rank {r}'", out, err)
        expect(f"Rank {r} has received data from rank 0" in out, f"missing receive line of rank {r}", out, err)
    print(f"message_passing: rc=0, {world} ranks:")
    for ln in out.splitlines():
        if "Rank" in ln:
            print("  ", ln)


def case_mp_ddprun(a):
    rc, out, err = run([a.ddprun, "--nproc-per-node", "2", "--standalone", a.message_passing, "--backend=gloo"],
                       timeout=30)
    check_message_passing(rc, out, err)


def case_mp_torchrun(a):
    have_torch()
    with tempfile.TemporaryDirectory() as logs:
        rc, out, err = run([PY, "-m", "torch.distributed.run", "--redirects", "9:1", "--tee", "9:1", "--log_dir", logs,
                            "--nproc_per_node=2", f"--master_port={free_port()}", "--no_python", a.message_passing,
                            "--backend=gloo"], timeout=90)
    check_message_passing(rc, out, err)


def case_mp_launch_use_env(a):
    have_torch()
    with tempfile.TemporaryDirectory() as logs:
        rc, out, err = run([PY, "-m", "torch.distributed.launch", "-r", "9:1", "-t", "9:1", "--log_dir", logs,
                            "--nproc_per_node=2", f"--master_port={free_port()}", "--use_env", "--no_python",
                            a.message_passing, "--backend=gloo"], timeout=90)
    check_message_passing(rc, out, err)


def case_mp_launch_legacy(a):
    # torch.distributed.launch without --use_env passes --local_rank=N; torch 1.13 refuses --no_python then,
    # so a two-line Python script execs our binary with the arguments it was given (--local_rank=N included).
    have_torch()
    with tempfile.TemporaryDirectory() as tmp:
        shim = os.path.join(tmp, "shim.py")
        with open(shim, "w") as f:
            f.write("import os, sys\nprint('shim argv:', sys.argv[1:], flush=True)\n"
                    f"os.execv({a.message_passing!r}, [{a.message_passing!r}] + sys.argv[1:])\n")
        rc, out, err = run([PY, "-m", "torch.distributed.launch", "-r", "9:1", "-t", "9:1", "--log_dir", tmp,
                            "--nproc_per_node=2", f"--master_port={free_port()}", shim, "--backend=gloo"], timeout=90)
    expect(re.search(r"--local[-_]rank=1", out), "launch did not pass --local_rank=N", out, err)
    check_message_passing(rc, out, err)


def mpirun_seed(a, backend, np=2):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise Skip("mpirun not found (install openmpi-bin)")
    return run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np), "-x", "MASTER_ADDR=localhost",
                "-x", f"MASTER_PORT={free_port()}", "-x", "PATH", "-bind-to", "none", "-map-by", "slot", "-mca", "pml",
                "ob1", "-mca", "btl", "^openib", a.message_passing, f"--backend={backend}"], timeout=60)


def case_mp_mpirun_tcp(a):
    rc, out, err = mpirun_seed(a, "tcp", np=3)
    check_message_passing(rc, out, err, world=3)


def case_mp_mpirun_mpi(a):
    rc, out, err = mpirun_seed(a, "mpi")
    check_message_passing(rc, out, err)


def main():
    cases = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(cases))
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--probe")
    ap.add_argument("--message-passing", dest="message_passing")
    a = ap.parse_args()
    try:
        cases[a.case](a)
    except Skip as e:
        print(f"skipped: {e}")
        return SKIP
    except AssertionError as e:
        print(f"FAILED {a.case}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
