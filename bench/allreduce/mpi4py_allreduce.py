#!/usr/bin/python3
"""Open MPI's own MPI_Allreduce through mpi4py: the reference for `bench_allreduce --backend mpi`. Same sizes,
iteration counts, warm-up and JSON lines as bench_allreduce (float32, sum, in place). Needs python3-mpi4py.

Run: mpirun -np 2 --bind-to none /usr/bin/python3 bench/allreduce/mpi4py_allreduce.py [--min-bytes 4] [--max-bytes N]
"""
import argparse, json, sys, time

import numpy as np
from mpi4py import MPI


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-bytes", type=int, default=4)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    n, b = comm.Get_size(), a.min_bytes
    while b <= a.max_bytes:
        v = np.ones(b // 4, dtype=np.float32)
        iters = 200 if b <= (1 << 20) else 20 if b <= (16 << 20) else 5
        for _ in range(3):
            comm.Allreduce(MPI.IN_PLACE, v, op=MPI.SUM)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.Allreduce(MPI.IN_PLACE, v, op=MPI.SUM)
        us = (time.perf_counter() - t0) / iters * 1e6
        algbw = b / us / 1e3
        if comm.Get_rank() == 0:
            print(json.dumps({"backend": "mpi4py", "ranks": n, "bytes": b, "time_us": round(us, 1),
                              "algbw_GBps": round(algbw, 3), "busbw_GBps": round(algbw * 2 * (n - 1) / n, 3)}),
                  flush=True)
        b *= 4
    comm.Free()


if __name__ == "__main__":
    sys.exit(main())
