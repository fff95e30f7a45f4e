#!/usr/bin/python3
"""bench/data's reference: images per second that torchvision's ImageFolder through torch.utils.data.DataLoader
decodes and augments with the training transform, per worker count; the JSON shape of bench_data.

Usage: /usr/bin/python3 bench/data/torch_loader.py --data_dir TREE [--workers 1,2] [--epochs 3]
                                                   [--batch_size 32] [--crop 224]
Prints one JSON object per worker count with "impl": "torchvision".
Timing as bench_data (main.cpp): one untimed warm-up epoch (which also forks the workers), then --epochs
epochs end to end. persistent_workers=True so that the timed epochs measure decoding and transforms, not
forking W processes per epoch (ddp's loader starts threads per epoch, which costs microseconds).
Threads: the DataLoader calls torch.set_num_threads(1) in each worker process itself (torch 1.13,
utils/data/_utils/worker.py), so ToTensor/Normalize/collate run on one thread per worker; the main process is
also set to 1 thread, it only receives batches. Per core = images_per_sec / workers: the W worker processes
do the work; the main process only unpickles shared-memory handles (on a 2-core machine it competes with
them, as ddp's consumer thread does, though it does less).
"""
# SPDX-License-Identifier: MIT
import argparse
import json
import sys
import time

try:
    import torch
    import torchvision
    import torchvision.transforms as T
except Exception as e:  # depends on the machine
    sys.exit(f"torch_loader.py: torch/torchvision not importable by {sys.executable} ({e}); "
             "apt-get install python3-torchvision")


def run_epochs(loader, epochs):
    images = 0
    for _ in range(epochs):
        for x, _ in loader:
            images += x.shape[0]
    return images


def measure(ds, a, workers):
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=workers,
                                         persistent_workers=True, generator=torch.Generator().manual_seed(1))
    run_epochs(loader, 1)  # warm-up
    t0 = time.perf_counter()
    images = run_epochs(loader, a.epochs)
    s = time.perf_counter() - t0
    del loader  # ends the workers before the next configuration starts its own
    return {"bench": "data", "impl": "torchvision", "workers": workers, "batch_size": a.batch_size, "crop": a.crop,
            "epochs": a.epochs, "images": images, "seconds": s, "images_per_sec": images / s,
            "images_per_sec_per_core": images / s / workers}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True)
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts, each >= 1")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--crop", type=int, default=224)
    a = p.parse_args()
    workers = [int(w) for w in a.workers.split(",")]
    if a.epochs < 1 or min(workers) < 1:
        p.error("--epochs and every --workers count must be >= 1")
    torch.set_num_threads(1)
    # torchvision's ImageNet training transform (the one ddp's ImageFolder(train=True) implements).
    tf = T.Compose([T.RandomResizedCrop(a.crop), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(a.data_dir, transform=tf)
    for w in workers:
        print(json.dumps(measure(ds, a, w)), flush=True)


if __name__ == "__main__":
    main()
