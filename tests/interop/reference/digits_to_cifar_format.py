#!/usr/bin/python3
"""Convert scikit-learn's 8x8 handwritten digits (python3-sklearn) into CIFAR-format binary files.

Each record is 1 label byte + C*S*S pixel bytes, channel-major (like CIFAR-10's data_batch_N.bin), so
ddp::data::CifarBinaryDataset reads it with RecordFormat{.height = S, .width = S, .channels = C,
.num_classes = 10}. Pixels 0..16 are scaled to 0..255 (round(v * 255 / 16)); --size S > 8 upsamples by
nearest neighbour (S must be a multiple of 8); --channels 3 repeats the grey channel.

Usage: digits_to_cifar_format.py OUT_DIR [--size 8] [--channels 1] [--test-fraction 0.2] [--seed 0]
Writes OUT_DIR/digits_train.bin, OUT_DIR/digits_test.bin and OUT_DIR/digits_meta.json (shape, counts,
per-channel mean/std of the training pixels in [0, 1], for normalisation).
"""
import argparse
import json
import os

import numpy as np
from sklearn.datasets import load_digits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--size", type=int, default=8)
    ap.add_argument("--channels", type=int, default=1, choices=[1, 3])
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.size % 8:
        ap.error("--size must be a multiple of 8")
    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)  # (1797, 8, 8)
    rep = a.size // 8
    images = images.repeat(rep, axis=1).repeat(rep, axis=2)                     # (n, S, S)
    images = np.repeat(images[:, None], a.channels, axis=1)                      # (n, C, S, S)
    labels = d.target.astype(np.uint8)
    order = np.random.RandomState(a.seed).permutation(len(labels))
    n_test = int(round(len(labels) * a.test_fraction))
    splits = {"test": order[:n_test], "train": order[n_test:]}
    os.makedirs(a.out_dir, exist_ok=True)
    for name, idx in splits.items():
        rec = np.concatenate([labels[idx, None], images[idx].reshape(len(idx), -1)], axis=1)
        rec.astype(np.uint8).tofile(os.path.join(a.out_dir, f"digits_{name}.bin"))
    train = images[splits["train"]].astype(np.float64) / 255.0
    meta = {"height": a.size, "width": a.size, "channels": a.channels, "num_classes": 10,
            "record_bytes": 1 + a.channels * a.size * a.size,
            "train": int(len(splits["train"])), "test": int(len(splits["test"])),
            "mean": [float(train[:, c].mean()) for c in range(a.channels)],
            "std": [float(train[:, c].std()) for c in range(a.channels)]}
    with open(os.path.join(a.out_dir, "digits_meta.json"), "w") as f:
        json.dump(meta, f)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
