#!/usr/bin/python3
# PyTorch side of bench_resnet_cpu: times one torchvision training step (forward, cross-entropy, backward,
# SGD momentum 0.9) for one configuration and prints {"torch_step_s": median, ...} as one JSON line.
# Usage: torch_step.py ARCH BATCH IMAGE_SIZE THREADS REPEATS       (exits 77 without torch/torchvision)
# SPDX-License-Identifier: MIT
import json
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    import torchvision
except Exception as e:  # depends on the machine
    print(json.dumps({"error": f"torch/torchvision not importable: {e}"}))
    sys.exit(77)

arch, batch, size, threads, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = getattr(torchvision.models, arch)(num_classes=1000)
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(batch, 3, size, size)
y = torch.randint(0, 1000, (batch,))


def step():
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


step()  # warm-up (allocations, oneDNN primitive creation)
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(json.dumps({"torch_step_s": statistics.median(times), "torch_version": torch.__version__,
                  "mkldnn": torch.backends.mkldnn.is_available()}))
