#!/usr/bin/python3
# Draws bench_powersgd's JSON lines (stdin or a file) as a PNG: bytes per step by hook (left), digits training
# loss per step, plain all-reduce vs PowerSGD (right). Needs python3-matplotlib.
# SPDX-License-Identifier: MIT
# Usage: plot.py JSONL OUT.png
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except Exception as e:
    print(f"plot.py: matplotlib missing ({e}); install python3-matplotlib", file=sys.stderr)
    sys.exit(77)

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip().startswith("{")]
bytes_rows = [r for r in rows if r.get("kind") == "bytes"]
loss_rows = [r for r in rows if r.get("kind") == "loss"]
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
a.bar([r["hook"] for r in bytes_rows], [r["bytes_per_step"] / 2**20 for r in bytes_rows])
a.set_ylabel("MiB per step (all-reduce payload, one rank)")
a.set_title("resnet18 gradients")
for r in loss_rows:
    b.plot(r["losses"], label=f'{r["hook"]} (final {r["final_loss"]:.3f})')
b.set_xlabel("step")
b.set_ylabel("training loss (mean over ranks)")
b.set_title("sklearn digits, world 2")
b.legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=100)
print(f"plot.py: wrote {sys.argv[2]}")
