#!/usr/bin/env python3
"""Draws a --trace file (Chrome trace JSON from train/trace.hpp) as a PNG timeline, one band per rank.

Usage: plot_trace.py TRACE --out PNG [--step N] [--width-in 16]

Each rank's band has one row per nesting depth of its training thread (the step, then the model, its layers, their
blocks, ...) and one row per all-reduce lane below them, so the overlap of backward and the buckets' all-reduces
shows at a glance. --step N draws only step N (the trace's "step N" span on every rank, and everything inside).
Colours: forward blue, backward green, all-reduce teal, optimizer red, data wait orange, DDP's wait for the
all-reduces brown, loss purple. Span names are written where they fit. Needs matplotlib (Debian's
python3-matplotlib). The same file opens in chrome://tracing or ui.perfetto.dev where those are reachable.
Prints "<png>: <spans> spans, <ranks> ranks, <rows> rows".
"""
import argparse
import json
import sys
from collections import defaultdict

COLOURS = {"step": "#d9d9d9", "data": "#f39c12", "forward": "#3b7dd8", "backward": "#2ca25f",
           "allreduce": "#17becf", "optimizer": "#d62728", "ddp": "#8c564b", "loss": "#9467bd"}


def load(path, step):
    try:
        doc = json.load(open(path))
        events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot_trace.py: {path} is not a --trace file: {e}")
    if step is not None:
        windows = {e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "step" and int(e["args"].get("step", -1)) == step}
        if not windows:
            sys.exit(f"plot_trace.py: {path} has no 'step {step}' span; pick one of its traced steps with --step")
        events = [e for e in events if e["pid"] in windows and
                  windows[e["pid"]][0] <= e["ts"] and e["ts"] + e["dur"] <= windows[e["pid"]][1] + 1e-3]
    return events


def rows_of(events):
    """(pid, row) per event: depth on the training thread (tid 0), then one row per all-reduce lane."""
    placed = []
    depth_rows = defaultdict(int)  # pid -> rows used by tid 0
    by_thread = defaultdict(list)
    for e in events:
        by_thread[(e["pid"], e["tid"])].append(e)
    for (pid, tid), spans in by_thread.items():
        if tid != 0:
            continue
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in spans:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + 1e-3:
                stack.pop()
            placed.append((e, pid, len(stack)))
            depth_rows[pid] = max(depth_rows[pid], len(stack) + 1)
            stack.append(e)
    for (pid, tid), spans in by_thread.items():
        if tid != 0:
            placed.extend((e, pid, depth_rows[pid] + tid - 1) for e in spans)
    lanes = defaultdict(int)
    for (pid, tid) in by_thread:
        lanes[pid] = max(lanes[pid], tid)
    return placed, depth_rows, lanes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--step", type=int, default=None, help="draw only this step")
    ap.add_argument("--width-in", type=float, default=16.0)
    a = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = load(a.trace, a.step)
    if not events:
        sys.exit(f"plot_trace.py: {a.trace} has no spans to draw")
    placed, depth_rows, lanes = rows_of(events)
    pids = sorted(set(depth_rows) | set(lanes))
    base, y, ticks, labels = {}, 0, [], []
    for pid in pids:  # rank 0 on top
        base[pid] = y
        for d in range(depth_rows[pid]):
            ticks.append(y + d)
            labels.append(f"rank {pid} " + ("step" if d == 0 else f"depth {d}"))
        for t in range(lanes[pid]):
            ticks.append(y + depth_rows[pid] + t)
            labels.append(f"rank {pid} all-reduce" + (f" {t + 1}" if t else ""))
        y += depth_rows[pid] + lanes[pid] + 1
    t0 = min(e["ts"] for e in events)
    span_ms = (max(e["ts"] + e["dur"] for e in events) - t0) / 1000.0
    fig, ax = plt.subplots(figsize=(a.width_in, max(3.0, 0.28 * y + 1.2)), dpi=100)
    for e, pid, row in placed:
        x = (e["ts"] - t0) / 1000.0
        w = max(e["dur"] / 1000.0, span_ms / 4000.0)  # at least a hairline
        yy = base[pid] + row
        ax.broken_barh([(x, w)], (yy - 0.4, 0.8), facecolors=COLOURS.get(e.get("cat"), "#7f7f7f"),
                       edgecolor="white", linewidth=0.3)
        if w > span_ms * 0.04:
            name = e["name"] if e.get("cat") != "allreduce" else e["name"].replace("all-reduce ", "")
            ax.text(x + w / 2, yy, name, ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(y - 0.5, -0.8)
    ax.set_xlim(0, span_ms * 1.01)
    ax.set_xlabel("ms")
    title = f"{a.trace}" + (f", step {a.step}" if a.step is not None else "")
    ax.set_title(title, fontsize=9)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], fontsize=7, ncol=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.08 if y > 12 else -0.18), frameon=False)
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"{a.out}: {len(events)} spans, {len(pids)} ranks, {y - 1} rows")


if __name__ == "__main__":
    main()
