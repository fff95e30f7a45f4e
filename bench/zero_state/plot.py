#!/usr/bin/python3
# Draws bench_zero_state's JSON lines as a PNG: one panel per (arch, optimizer), the largest per-rank
# optimizer state in MiB at each world size, without ZeRO (grey) and with it (blue). Needs Pillow (python3-pil).
# SPDX-License-Identifier: MIT
# Usage: plot.py zero_state.jsonl zero_state.png
import json
import sys

from PIL import Image, ImageDraw

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip().startswith("{")]
panels = sorted({(r["arch"], r["optimizer"]) for r in rows}, key=lambda p: (p[0], p[1] != "sgd"))
worlds = sorted({r["world_size"] for r in rows})
mib = {(r["arch"], r["optimizer"], r["world_size"], r["zero"]): r["max_state_bytes"] / 2**20 for r in rows}
top = max(mib.values())

W, H, PAD = 300, 260, 40  # one panel
img = Image.new("RGB", (W * len(panels), H + 40), "white")
d = ImageDraw.Draw(img)
d.text((10, H + 10), "largest optimizer state on one rank (MiB); grey: without ZeRO, blue: ZeroRedundancyOptimizer",
       fill="black")
for k, (arch, opt) in enumerate(panels):
    x0 = k * W
    d.text((x0 + PAD, 8), f"{arch} {opt}", fill="black")
    base = H - PAD
    d.line((x0 + PAD, base, x0 + W - 10, base), fill="black")
    slot = (W - PAD - 10) / len(worlds)
    for j, w in enumerate(worlds):
        for z, color in ((False, (150, 150, 150)), (True, (40, 90, 200))):
            v = mib.get((arch, opt, w, z))
            if v is None:
                continue
            bx = x0 + PAD + j * slot + 8 + (slot / 2 - 6) * z
            by = base - (base - 30) * v / top
            d.rectangle((bx, by, bx + slot / 2 - 10, base), fill=color)
            d.text((bx, by - 12), f"{v:.0f}", fill="black")
        d.text((x0 + PAD + j * slot + slot / 2 - 14, base + 6), f"world {w}", fill="black")
img.save(sys.argv[2])
print(f"wrote {sys.argv[2]}")
