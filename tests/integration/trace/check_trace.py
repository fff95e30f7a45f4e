#!/usr/bin/env python3
"""Checks a --trace file (train/trace.hpp) against the run that wrote it.

Usage: check_trace.py TRACE SNAPSHOT FIRST:LAST WORLD

What must hold, each checked against something the tracer did not produce:
- the file is JSON with "traceEvents"; every complete event has ts >= 0 and dur >= 0;
- one process per rank (pid 0..WORLD-1), named "rank <pid>";
- on every (pid, tid) the spans nest: two spans either do not overlap or one contains the other;
- every rank has a "step N" span for each N in FIRST..LAST and no other, and inside each: its data wait, the
  forward and backward of the model, and the optimizer;
- every module that owns parameters in SNAPSHOT (the safetensors file the run saved: its state_dict keys, less
  BatchNorm's buffers and the optimizer's state) has a forward and a backward span in every traced step of every
  rank;
- every traced step of every rank holds (from launch to completion) all-reduce buckets 0..B-1, each once, with B
  the same everywhere, on all-reduce threads (tid >= 1), and their bytes add up to 4 x the parameter count of
  SNAPSHOT (float32).
Prints one "ok: ..." line, or every problem found and exits 1.
"""
import json
import struct
import sys
from collections import defaultdict

BUFFERS = ("running_mean", "running_var", "num_batches_tracked")
EPS = 1e-3  # microseconds: ts and dur are printed as doubles


def parameters(snapshot):
    with open(snapshot, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    out = {}
    for key, info in header.items():
        if key == "__metadata__" or key.startswith("optimizer.") or key.rsplit(".", 1)[-1] in BUFFERS:
            continue
        count = 1
        for d in info["shape"]:
            count *= d
        out[key] = count
    return out


def module_of(key):
    return key.rsplit(".", 1)[0] if "." in key else "model"


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    path, snapshot, steps_arg, world = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    first, last = (int(x) for x in steps_arg.split(":"))
    steps = set(range(first, last + 1))
    params = parameters(snapshot)
    modules = {module_of(k) for k in params}
    doc = json.load(open(path))
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    bad = []

    for e in events:
        if e["ts"] < 0 or e["dur"] < 0:
            bad.append(f"negative time: {e}")
    pids = {e["pid"] for e in events}
    if pids != set(range(world)):
        bad.append(f"processes {sorted(pids)}, expected ranks 0..{world - 1}")
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    for r in range(world):
        if names.get(r) != f"rank {r}":
            bad.append(f"process {r} is named {names.get(r)!r}")

    # Nesting, per thread.
    by_thread = defaultdict(list)
    for e in events:
        by_thread[(e["pid"], e["tid"])].append(e)
    for key, spans in by_thread.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in spans:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + EPS:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + EPS:
                bad.append(f"pid {key[0]} tid {key[1]}: '{e['name']}' [{e['ts']:.1f}, +{e['dur']:.1f}] overlaps "
                           f"'{stack[-1]['name']}' [{stack[-1]['ts']:.1f}, +{stack[-1]['dur']:.1f}] without nesting")
            stack.append(e)

    def within(inner, outer):
        return outer["ts"] - EPS <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + EPS

    bucket_counts = set()
    for r in range(world):
        mine = [e for e in events if e["pid"] == r]
        step_spans = {int(e["args"]["step"]): e for e in mine if e["cat"] == "step"}
        if set(step_spans) != steps:
            bad.append(f"rank {r}: step spans {sorted(step_spans)}, expected {sorted(steps)}")
        for n, step in step_spans.items():
            inside = [e for e in mine if e["tid"] == 0 and e is not step and within(e, step)]
            seen = {(e["cat"], e["name"]) for e in inside}
            for want in [("data", "data wait"), ("forward", "model"), ("backward", "model"), ("optimizer", "optimizer")]:
                if want not in seen:
                    bad.append(f"rank {r} step {n}: no {want[0]} span '{want[1]}' inside it")
            for m in sorted(modules):
                for phase in ("forward", "backward"):
                    if (phase, m) not in seen:
                        bad.append(f"rank {r} step {n}: no {phase} span of module '{m}'")
        buckets = defaultdict(list)  # by the step span that holds the all-reduce from launch to completion
        for e in mine:
            if e["cat"] == "allreduce":
                if e["tid"] < 1:
                    bad.append(f"rank {r}: all-reduce on thread {e['tid']}")
                holders = [n for n, step in step_spans.items() if within(e, step)]
                if len(holders) != 1:
                    bad.append(f"rank {r}: '{e['name']}' lies in step spans {holders}, expected exactly one")
                    continue
                buckets[holders[0]].append(e)
        if set(buckets) != steps:
            bad.append(f"rank {r}: all-reduces in steps {sorted(buckets)}, expected {sorted(steps)}")
        for n, bs in buckets.items():
            idx = sorted(int(e["args"]["bucket"]) for e in bs)
            if idx != list(range(len(idx))):
                bad.append(f"rank {r} step {n}: buckets {idx}, expected 0..{len(idx) - 1} once each")
            total = sum(int(e["args"]["bytes"]) for e in bs)
            if total != 4 * sum(params.values()):
                bad.append(f"rank {r} step {n}: buckets carry {total} bytes, the snapshot's parameters are "
                           f"{4 * sum(params.values())}")
            bucket_counts.add(len(idx))
    if len(bucket_counts) > 1:
        bad.append(f"bucket counts differ between ranks or steps: {sorted(bucket_counts)}")

    if bad:
        print("\n".join(bad[:40]))
        sys.exit(1)
    print(f"ok: {path}: {len(events)} spans, {world} ranks, steps {first}..{last}, {len(modules)} modules with "
          f"parameters, {bucket_counts.pop() if bucket_counts else 0} buckets per step")


if __name__ == "__main__":
    main()
