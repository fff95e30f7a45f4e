#!/usr/bin/python3
"""Runs bench_allreduce (tcp) and PyTorch's gloo all-reduce on the same sizes, in the same run, and prints
JSON lines with both bus bandwidths and our/gloo ratios. Needs Debian's python3-torch (/usr/bin/python3).

Usage: /usr/bin/python3 bench/allreduce/compare_gloo.py <path to bench_allreduce> [--nproc 2] [--max-bytes N]
"""
import argparse, json, os, socket, subprocess, sys, time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_rank(rank, world, port, sizes, out):
    import torch, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for b in sizes:
        t = torch.ones(b // 4)
        iters = 200 if b <= (1 << 20) else 20 if b <= (16 << 20) else 5
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        us = (time.perf_counter() - t0) / iters * 1e6
        if rank == 0:
            out.put((b, us))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=4)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    a = ap.parse_args()
    ours = {}
    run = subprocess.run([a.bench, "--nproc", str(a.nproc), "--min-bytes", str(a.min_bytes), "--max-bytes",
                          str(a.max_bytes)], capture_output=True, text=True, check=True)
    for line in run.stdout.splitlines():
        row = json.loads(line)
        ours[row["bytes"]] = row
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=gloo_rank, args=(r, a.nproc, port, sorted(ours), q)) for r in range(a.nproc)]
    for p in procs:
        p.start()
    gloo = dict(q.get() for _ in ours)
    for p in procs:
        p.join()
    n = a.nproc
    for b in sorted(ours):
        g_us = gloo[b]
        g_bus = b / g_us / 1e3 * 2 * (n - 1) / n
        o = ours[b]
        print(json.dumps({"ranks": n, "bytes": b, "ours_us": o["time_us"], "gloo_us": round(g_us, 1),
                          "ours_busbw_GBps": o["busbw_GBps"], "gloo_busbw_GBps": round(g_bus, 3),
                          "speedup": round(g_us / o["time_us"], 2)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
