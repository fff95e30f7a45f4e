# The multinode tutorial job in PyTorch DDP (gloo, CPU): Linear(20, 1), 2048 samples, batch 32, SGD lr 1e-3,
# DistributedSampler, MSE. Run under torchrun; rank 0 appends one JSON line per step to --metrics-file.
# SPDX-License-Identifier: MIT
import argparse, json, time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=5)
p.add_argument("--metrics-file", default="")
a = p.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
ds = TensorDataset(torch.rand(2048, 20), torch.rand(2048, 1))
sampler = DistributedSampler(ds)
loader = DataLoader(ds, batch_size=32, sampler=sampler)
model = DDP(torch.nn.Linear(20, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
rank = dist.get_rank()
out = open(a.metrics_file, "a") if (a.metrics_file and rank == 0) else None
t0 = time.perf_counter()
for epoch in range(a.epochs):
    sampler.set_epoch(epoch)
    for step, (x, y) in enumerate(loader):
        ts = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if out:
            out.write(json.dumps({"epoch": epoch, "step": step, "loss": loss.item(),
                                  "step_ms": (time.perf_counter() - ts) * 1e3}) + "\n")
if rank == 0:
    print(f"Training took {time.perf_counter() - t0:.4f} s", flush=True)
dist.destroy_process_group()
