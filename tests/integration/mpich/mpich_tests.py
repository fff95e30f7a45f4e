#!/usr/bin/python3
# MPICH tests (label mpich): our binaries under the real Hydra (mpiexec.mpich), the captured Hydra
# environment against the PMI policy's tables, and the mpi backend built against MPICH. See CMakeLists.txt.
# Run by CTest: mpich_tests.py CASE --hydra-env PATH [--mpi-comm PATH --mpi-mismatch PATH]
#               [--message-passing PATH --resnet PATH --probe PATH]. Exit 0 pass, 1 fail, 77 skip.
# SPDX-License-Identifier: MIT
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from driver import SKIP, Skip, expect, free_port  # noqa: E402

MPIEXEC = "mpiexec.mpich"  # never plain mpiexec/mpirun: those are Open MPI's (the Debian default)


def mpiexec():
    path = shutil.which(MPIEXEC)
    if path is None:
        raise Skip(f"{MPIEXEC} not found (install Debian's mpich; Open MPI's mpirun stays the default)")
    return path


def run(cmd, timeout=30, env=None):
    """Runs cmd in its own session; on timeout kills the whole group (Hydra's proxies and ranks) and fails.
    Either way, nothing it started is left: the group is killed after it returns too."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"timed out after {timeout} s: {cmd}\nstdout:\n{out}\nstderr:\n{err}")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"  {time.monotonic() - t0:.2f} s: {' '.join(cmd)}")
    return p.returncode, out, err


def clean_env(**extra):
    """PATH and HOME only, so that the ranks see what Hydra adds and nothing of the caller's launcher."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    env.update(extra)
    return env


def check_message_passing(rc, out, err, world=2):
    expect(rc == 0, f"rc={rc}", out, err)
    for r in range(1, world):
        expect(f"Rank 0 sent data to Rank {r}" in out, f"missing 'Rank 0 sent data to Rank {r}'", out, err)
        expect(f"Rank {r} has received data from rank 0" in out, f"missing receive line of rank {r}", out, err)


# ---------------------------------------------------------------- our programs under Hydra

def case_message_passing(a):
    exe = mpiexec()
    # Only MASTER_PORT: Hydra proves one host (MPI_LOCALNRANKS=2 = PMI_SIZE), so the address defaults.
    rc, out, err = run([exe, "-n", "2", "-genv", "MASTER_PORT", str(free_port()), a.message_passing,
                        "--backend=gloo"], timeout=30, env=clean_env())
    check_message_passing(rc, out, err)
    # The defaulting line names the PMI policy's variables: proof that it, and nothing else, read the launch.
    expect("ranks run on this host (MPI_LOCALNRANKS=2 = PMI_SIZE), so the store defaults to 127.0.0.1" in err,
           "the store address was not defaulted from Hydra's local count", out, err)
    print("  message_passing under mpiexec.mpich: pmi policy, " +
          "; ".join(ln.strip() for ln in out.splitlines() if "Rank" in ln))
    # The probe prints what detect() read, and meets through the store.
    rc, out, err = run([exe, "-n", "2", "-genv", "MASTER_ADDR", "127.0.0.1", "-genv", "MASTER_PORT", str(free_port()),
                        a.probe, "--timeout-ms", "10000"], timeout=30, env=clean_env())
    expect(rc == 0, f"probe rc={rc}", out, err)
    infos = sorted((json.loads(ln[len("probe: "):]) for ln in out.splitlines() if ln.startswith("probe: {")),
                   key=lambda i: i["rank"])
    expect([(i["rank"], i["world_size"], i["local_rank"], i["local_world_size"], i["source"]) for i in infos] ==
           [(0, 2, 0, 2, "pmi"), (1, 2, 1, 2, "pmi")], "probe: not ranks 0,1 of 2 from the pmi policy", out, err)
    expect(out.count("sees 2 ranks") == 2, "probe: the store rendezvous failed", out, err)
    print("  probe: " + json.dumps(infos[1]))
    # -pmi-port: the policy's error names a workaround (RANK=$PMI_ID, WORLD_SIZE); it must work.
    rc, out, err = run([exe, "-pmi-port", "-n", "2", "-genv", "WORLD_SIZE", "2", "-genv", "MASTER_ADDR", "127.0.0.1",
                        "-genv", "MASTER_PORT", str(free_port()), "sh", "-c",
                        'RANK=$PMI_ID exec "$0" --backend=gloo', a.message_passing], timeout=30, env=clean_env())
    check_message_passing(rc, out, err)
    print("  -pmi-port with RANK=$PMI_ID WORLD_SIZE=2: env:// policy, message_passing passed")


RESNET_TINY = ["--backend", "gloo", "--use_syn", "--device", "cpu", "--arch", "resnet18", "--batch_size", "4",
               "--image_size", "32", "--steps_syn", "3", "--width", "8", "--num_classes", "10", "--threads", "1"]


def case_resnet(a):
    exe = mpiexec()
    with tempfile.TemporaryDirectory() as tmp:
        rc, out, err = run([exe, "-n", "2", "-genv", "MASTER_ADDR", "127.0.0.1", "-genv", "MASTER_PORT",
                            str(free_port()), a.resnet, *RESNET_TINY, "--model_dir", tmp], timeout=75,
                           env=clean_env())
    expect(rc == 0, f"rc={rc}", out, err)
    # The environment is clean (PATH, HOME and Hydra's variables), so "rank 1/2" can only come from the PMI policy.
    expect("ddp[rank 0/2]" in err and "ddp[rank 1/2]" in err, "the ranks did not log as rank r/2", out, err)
    expect("epoch 0 step 3/3 loss" in out and "samples_per_sec" in out, "resnet progress/throughput lines", out, err)
    print("  resnet: 3 steps, " + next(ln for ln in out.splitlines() if "samples_per_sec" in ln).strip())


# ---------------------------------------------------------------- the real Hydra environment

LAYOUTS = {  # table -> (mpiexec arguments, {host: ranks on it} or None for this machine)
    "local": (["-n", "2"], None),
    "two_hosts": (["-launcher", "fork", "-hosts", "ddp-node-a,ddp-node-b", "-ppn", "2", "-n", "4"],
                  {"ddp-node-a": [0, 1], "ddp-node-b": [2, 3]}),
    "uneven": (["-launcher", "fork", "-hosts", "ddp-node-a:1,ddp-node-b:3", "-n", "4"],
               {"ddp-node-a": [0], "ddp-node-b": [1, 2, 3]}),
}


def case_hydra_env(a):
    exe = mpiexec()
    for table, (args, hosts) in LAYOUTS.items():
        rc, out, err = run([exe, *args, a.hydra_env, table], timeout=20, env=clean_env())
        expect(rc == 0, f"{table}: the real Hydra environment differs from the table (rc={rc})", out, err)
        infos = {}
        for ln in out.splitlines():
            m = re.match(r"hydra_env: host=(\S+) (\{.*\})$", ln)
            expect(m is not None, f"{table}: unexpected line {ln!r}", out, err)
            info = json.loads(m.group(2))
            expect(info["source"] == "pmi", f"{table}: detected {info['source']}, not pmi", ln)
            infos[info["rank"]] = (m.group(1), info)
        world = len(infos)
        expect(sorted(infos) == list(range(world)) and world == int(args[args.index("-n") + 1]),
               f"{table}: ranks {sorted(infos)}", out)
        by_host = {}
        for r, (host, info) in sorted(infos.items()):
            expect(info["world_size"] == world, f"{table}: rank {r} world_size {info['world_size']}", out)
            by_host.setdefault(host, []).append(r)
        if hosts is not None:
            expect(by_host == hosts, f"{table}: ranks per host {by_host}, expected {hosts}", out)
        for host, ranks in by_host.items():
            for i, r in enumerate(ranks):  # Hydra places ranks in blocks; local ranks count within the host
                info = infos[r][1]
                expect(info["local_rank"] == i and info["local_world_size"] == len(ranks),
                       f"{table}: rank {r} on {host}: local {info['local_rank']}/{info['local_world_size']}, "
                       f"expected {i}/{len(ranks)}", out)
        print(f"  {table}: every variable as in the table; ranks per host {by_host}")
    # -pmi-port: same names as its table, and every rank fails with the policy's message (no rank/size).
    rc, out, err = run([exe, "-pmi-port", "-n", "2", a.hydra_env, "pmi_port"], timeout=20, env=clean_env())
    expect(rc == 0, f"pmi_port: the real Hydra environment differs from the table (rc={rc})", out, err)
    errors = [ln for ln in out.splitlines() if ln.startswith("hydra_env: error: ")]
    expect(len(errors) == 2 and all("in -pmi-port mode" in e and "Run mpiexec without -pmi-port" in e for e in errors),
           "pmi_port: every rank must fail with the -pmi-port message", out, err)
    print("  pmi_port: every variable as in the table; both ranks: " + errors[0][len("hydra_env: error: "):][:90] + "...")


# ---------------------------------------------------------------- the mpi backend on MPICH

def mpich_binary(path, what):
    if not path:
        raise Skip(f"{what} was not built: mpicxx.mpich, MPICH's mpi.h or libmpich not found at configure time "
                   "(install libmpich-dev)")
    libs = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    expect("libmpich.so" in libs, f"{path} is not linked to libmpich", libs)
    expect("libmpi.so" not in libs, f"{path} is linked to Open MPI's libmpi too", libs)
    return path


def case_mpi_comm(a):
    exe = mpiexec()
    binary = mpich_binary(a.mpi_comm, "mpi_comm_test_mpich")
    rc, out, err = run([exe, "-n", "4", binary], timeout=100)
    expect(rc == 0 and "mpi backend: 4 ranks, groups of 1..4, 7 dtypes: all passed" in out, f"rc={rc}", out, err)
    print("  " + out.strip().splitlines()[-1])


def mismatch(a, n):
    exe = mpiexec()
    binary = mpich_binary(a.mpi_mismatch, "mpi_mismatch_test_mpich")
    rc, out, err = run([exe, "-n", str(n), binary], timeout=50)
    expect(rc == 0 and f"mpi mismatch checks on {n} ranks: all passed" in out, f"rc={rc}", out, err)
    print("  " + out.strip().splitlines()[-1])


def case_mpi_mismatch_2(a):
    mismatch(a, 2)


def case_mpi_mismatch_4(a):
    mismatch(a, 4)


def main():
    cases = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(cases))
    ap.add_argument("--hydra-env", dest="hydra_env", required=True)
    ap.add_argument("--mpi-comm", dest="mpi_comm")
    ap.add_argument("--mpi-mismatch", dest="mpi_mismatch")
    ap.add_argument("--message-passing", dest="message_passing")
    ap.add_argument("--resnet")
    ap.add_argument("--probe")
    a = ap.parse_args()
    if a.case in ("message_passing", "resnet") and getattr(a, a.case) is None:
        print(f"SKIP: {a.case} not built (DDP_BUILD_EXAMPLES=OFF)")
        return SKIP
    t0 = time.monotonic()
    try:
        cases[a.case](a)
    except Skip as e:
        print(f"SKIP: {e}")
        return SKIP
    except AssertionError as e:
        print(f"FAIL: {e}")
        return 1
    print(f"PASS {a.case} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
