#!/usr/bin/python3
"""Runs `bench_allreduce --backend mpi` (or, with --ours tcp, our tcp backend's shared-memory all-reduce on
forked ranks) and Open MPI's own MPI_Allreduce (mpi4py_allreduce.py, `mpirun -np N --bind-to none`) side by
side, alternating --reps times, and prints one JSON line per size with the medians and the ratio
Open MPI's time / ours (> 1: ours is faster), and the same for each side's best run (ratio_best). Needs
python3-mpi4py (Debian).

Why both (docs/decisions/0059, with the measurements): on the 2-vCPU VM each run lands in a fast or a slow
state of the host, held for seconds to minutes, so the medians of a few alternating runs can set one side's slow
runs against the other's fast ones. The best run of each side compares the two in the same (fast) state; the
median says what a run typically gets.

Usage: /usr/bin/python3 bench/allreduce/compare_mpi.py <path to bench_allreduce> [--ours mpi|tcp] [--np 2]
       [--reps 3] [--min-bytes 1024] [--max-bytes 268435456] [--check-fingerprints 1] [--shm 1]
--shm 0 keeps the mpi backend's all-reduce on MPI messages (the path across hosts) instead of shared memory
(docs/decisions/0055).
"""
import argparse, json, os, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (rc {out.returncode}):\n{out.stderr}")
    return {r["bytes"]: r for r in (json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{"))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("--ours", choices=["mpi", "tcp"], default="mpi")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--check-fingerprints", default="1")
    ap.add_argument("--shm", choices=["0", "1"], default="1")
    a = ap.parse_args()
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(a.np), "--bind-to", "none"]
    sizes = ["--min-bytes", str(a.min_bytes), "--max-bytes", str(a.max_bytes)]
    if a.ours == "mpi":
        ours_cmd = mpirun + [a.bench, "--backend", "mpi", "--check-fingerprints", a.check_fingerprints, "--shm", a.shm] + sizes
    else:  # tcp: bench_allreduce forks its ranks itself (store on a free loopback port)
        ours_cmd = [a.bench, "--nproc", str(a.np)] + sizes
    ours, ref = [], []
    for _ in range(a.reps):  # alternate, so that a noisy neighbour hits both
        ours.append(run(ours_cmd))
        ref.append(run(mpirun + [sys.executable, os.path.join(HERE, "mpi4py_allreduce.py")] + sizes))
    for b in sorted(ours[0]):
        ours_us, ref_us = [r[b]["time_us"] for r in ours], [r[b]["time_us"] for r in ref]
        o, m = statistics.median(ours_us), statistics.median(ref_us)
        ob, mb = min(ours_us), min(ref_us)
        bus = lambda us: round(b / us / 1e3 * 2 * (a.np - 1) / a.np, 3)
        row = {"ours_backend": a.ours, "ours_shm": a.shm == "1" or a.ours == "tcp", "ranks": a.np, "bytes": b,
               "ours_us": round(o, 1), "openmpi_us": round(m, 1), "ours_busbw_GBps": bus(o),
               "openmpi_busbw_GBps": bus(m), "ratio": round(m / o, 2),
               "ours_best_us": round(ob, 1), "openmpi_best_us": round(mb, 1), "ratio_best": round(mb / ob, 2),
               "ours_runs_us": ours_us, "openmpi_runs_us": ref_us}
        runs = [r[b] for r in ours if r[b].get("copy_us", 0) > 0]
        if runs:  # the memory-traffic bound, measured in our runs (bench_allreduce's copy_us): each run's own
            # copy time over its own all-reduce time, so that both sides of the ratio share the host's state
            row |= {"copy_bound_us": round(statistics.median(r["copy_us"] for r in runs), 1),
                    "of_copy_bound": round(statistics.median(r["copy_us"] / r["time_us"] for r in runs), 2)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
