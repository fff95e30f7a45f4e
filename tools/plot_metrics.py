#!/usr/bin/python3
"""Draws a training run's --metrics-file (JSON lines, one record per logged step; train::MetricsWriter) as PNGs.

For each FILE.jsonl, into --out (default: beside the file):
  FILE_loss.png        loss over the global step, and the learning rate on a second axis
  FILE_throughput.png  samples/s over the global step
  FILE_step_time.png   each step's time split into data wait and the rest (forward, backward, all-reduce,
                       optimizer), when the records carry step_ms and data_ms; with comm_exposed_ms also the
                       wait for the all-reduces after backward, and comm_ms (all-reduces in flight) as a line
A chart whose keys no record has is skipped with a message. Prints one line per PNG: its path and the number of
points drawn. Needs matplotlib (Debian: python3-matplotlib).

Usage: /usr/bin/python3 tools/plot_metrics.py [--out DIR] FILE.jsonl...
"""
# SPDX-License-Identifier: MIT
import argparse
import json
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except Exception as e:  # an ImportError, or a broken install
    sys.exit(f"plot_metrics.py: matplotlib is missing ({e}); install python3-matplotlib")


def read_records(path):
    """The file's records in order; exits naming the file and line of anything that is not a JSON object."""
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        sys.exit(f"plot_metrics.py: cannot read {path}: {e.strerror}")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"plot_metrics.py: {path}:{n}: not JSON ({e.msg}); expected a --metrics-file")
        if not isinstance(r, dict):
            sys.exit(f"plot_metrics.py: {path}:{n}: not a JSON object; expected a --metrics-file")
        records.append(r)
    if not records:
        sys.exit(f"plot_metrics.py: {path} has no records")
    return records


def x_of(r, i):
    """The record's global step (--metrics-file writes it); its index when an older file has none."""
    return r.get("global_step", r.get("step", i))


def series(records, key):
    return [(x_of(r, i), r[key]) for i, r in enumerate(records) if isinstance(r.get(key), (int, float))]


def save(fig, path, points):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"{path}: {points} points")


def plot_file(path, out_dir):
    records = read_records(path)
    stem = os.path.join(out_dir, os.path.splitext(os.path.basename(path))[0])
    name = os.path.basename(path)

    loss, lr = series(records, "loss"), series(records, "lr")
    if loss:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.plot([p[0] for p in loss], [p[1] for p in loss], "-", color="tab:blue", label="loss")
        ax.set_xlabel("global step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        if lr:
            ax2 = ax.twinx()
            ax2.plot([p[0] for p in lr], [p[1] for p in lr], "--", color="tab:orange", label="learning rate")
            ax2.set_ylabel("learning rate")
            ax2.legend(loc="upper right")
        ax.legend(loc="upper left")
        ax.set_title(f"{name}: loss")
        save(fig, stem + "_loss.png", len(loss))
    else:
        print(f"plot_metrics.py: {path}: no record has 'loss'; loss chart skipped", file=sys.stderr)

    sps = series(records, "samples_per_sec")
    if sps:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.plot([p[0] for p in sps], [p[1] for p in sps], "-o", markersize=3)
        ax.set_xlabel("global step")
        ax.set_ylabel("samples/s (all ranks, since the start)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(f"{name}: throughput")
        save(fig, stem + "_throughput.png", len(sps))
    else:
        print(f"plot_metrics.py: {path}: no record has 'samples_per_sec'; throughput chart skipped", file=sys.stderr)

    split = [(x_of(r, i), r) for i, r in enumerate(records)
             if isinstance(r.get("step_ms"), (int, float)) and isinstance(r.get("data_ms"), (int, float))]
    if split:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        xs = [p[0] for p in split]
        data = [p[1]["data_ms"] for p in split]
        # DDP's communication where the records have it (train::add_comm_metrics): the part backward did not hide
        # is its own band; the time any all-reduce was in flight is a line (hidden or not).
        comm = all(isinstance(p[1].get("comm_exposed_ms"), (int, float)) for p in split)
        exposed = [p[1]["comm_exposed_ms"] if comm else 0.0 for p in split]
        rest = [max(0.0, p[1]["step_ms"] - d - e) for p, d, e in zip(split, data, exposed)]
        if comm:
            ax.stackplot(xs, data, exposed, rest, alpha=0.8,
                         labels=["data wait", "waiting for all-reduces after backward",
                                 "compute + hidden communication + optimizer"])
            if all(isinstance(p[1].get("comm_ms"), (int, float)) for p in split):
                ax.plot(xs, [p[1]["comm_ms"] for p in split], color="black", linestyle="--", linewidth=1,
                        label="all-reduces in flight")
        else:
            ax.stackplot(xs, data, rest, labels=["data wait", "compute + communication + optimizer"], alpha=0.8)
        ax.set_xlabel("global step")
        ax.set_ylabel("step time (ms)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
        ax.set_title(f"{name}: where each step's time went")
        save(fig, stem + "_step_time.png", len(split))
    else:
        print(f"plot_metrics.py: {path}: no record has both 'step_ms' and 'data_ms'; step-time chart skipped",
              file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description="Draws --metrics-file JSON lines as PNG charts.")
    ap.add_argument("files", nargs="+", metavar="FILE.jsonl")
    ap.add_argument("--out", help="directory for the PNGs (default: beside each file); created if missing")
    a = ap.parse_args()
    for path in a.files:
        out_dir = a.out or os.path.dirname(os.path.abspath(path))
        os.makedirs(out_dir, exist_ok=True)
        plot_file(path, out_dir)


if __name__ == "__main__":
    main()
