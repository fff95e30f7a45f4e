#!/usr/bin/python3
"""bench/data: images/s decoded and augmented at 224 px by ddp's ImageFolder DataLoader (bench_data, W threads)
against torchvision's ImageFolder + torch DataLoader (torch_loader.py, W worker processes), on the same JPEGs,
in the same run. Writes an ImageNet-like ImageFolder tree with PIL, then for each repetition and worker count
runs ours then torchvision's (interleaved, so a neighbour's load hits both alike) and prints their JSON lines
and one ratio line per pair:
  {"bench":"data","impl":"ddp"|"torchvision","workers":W,...,"images_per_sec":..,"images_per_sec_per_core":..}
  {"bench":"data","workers":W,"ddp_images_per_sec":..,"torchvision_images_per_sec":..,"ratio":ours/theirs}
ratio > 1: ours faster. Per core = images/s / W for both (W threads vs W processes; see main.cpp).

Usage: /usr/bin/python3 bench/data/compare.py <build>/bench/data/bench_data [--workers 1,2] [--epochs 3]
                                              [--repeats 1] [--images 400] [--tree DIR]
--tree DIR keeps the generated tree there (default: a temporary directory, removed afterwards).
"""
# SPDX-License-Identifier: MIT
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

here = os.path.dirname(os.path.abspath(__file__))
# (height, width) of ImageNet-like photos: most are 500 px on the long side, landscape 4:3 the commonest.
kSizes = [(375, 500), (375, 500), (375, 500), (333, 500), (500, 375), (500, 333), (400, 500), (500, 500)]
kClasses = 4


def make_tree(root, images, seed=18):
    """images JPEGs (quality 90, 4:2:0, PIL's defaults otherwise) in kClasses classes under root/<class>/.
    Content: a coarse random colour field upscaled bicubically (smooth regions, soft edges) plus Gaussian grain
    (sigma 18), which gives files of ~100 KiB on average, about ImageNet's, so entropy decoding costs
    what it does on photos. Returns the total bytes written."""
    rng = np.random.default_rng(seed)
    total = 0
    for i in range(images):
        h, w = kSizes[rng.integers(len(kSizes))]
        coarse = rng.integers(0, 256, (h // 24, w // 24, 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC), dtype=np.float32)
        pixels = np.clip(smooth + rng.normal(0, 18, (h, w, 3)), 0, 255).astype(np.uint8)
        d = os.path.join(root, f"class{i % kClasses}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"img{i:05d}.jpg")
        Image.fromarray(pixels).save(path, quality=90)
        total += os.path.getsize(path)
    return total


def run_json(cmd):
    """The JSON lines a child prints (exits with its message when it fails)."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"compare.py: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench_data")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--tree", default="")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = a.tree or os.path.join(tmp, "tree")
        size = make_tree(tree, a.images)
        print(f"compare.py: {a.images} JPEGs, {size / a.images / 1024:.0f} KiB each on average, in {tree}",
              file=sys.stderr)
        common = ["--data_dir", tree, "--epochs", str(a.epochs)]
        for _ in range(a.repeats):
            for w in a.workers.split(","):
                ours = run_json([a.bench_data, *common, "--workers", w])[0]
                theirs = run_json([sys.executable, os.path.join(here, "torch_loader.py"), *common, "--workers", w])[0]
                for row in (ours, theirs):
                    print(json.dumps(row), flush=True)
                print(json.dumps({"bench": "data", "workers": int(w), "ddp_images_per_sec": ours["images_per_sec"],
                                  "torchvision_images_per_sec": theirs["images_per_sec"],
                                  "ratio": ours["images_per_sec"] / theirs["images_per_sec"]}), flush=True)


if __name__ == "__main__":
    main()
