#!/usr/bin/python3
# custom_model's PyTorch twin: main.cpp's residual CNN, data, optimizer and hyper-parameters in PyTorch DDP.
# SPDX-License-Identifier: MIT
#
#   torchrun --standalone --nproc_per_node 2 examples/custom_model/twin.py --data-dir digits
#   ddprun --nproc-per-node 2 --standalone /usr/bin/python3 examples/custom_model/twin.py --data-dir digits
import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


def digits(path):  # CIFAR-format records: 1 label byte, 8x8 pixel bytes
    records = torch.from_numpy(np.fromfile(path, dtype=np.uint8).reshape(-1, 1 + 8 * 8))
    images = (records[:, 1:].float().view(-1, 1, 8, 8) / 255 - 0.306) / 0.376
    return TensorDataset(images, records[:, 0].long())


class Net(nn.Module):  # conv-bn-relu -> relu(x + conv-bn-relu-conv-bn(x)) -> flatten -> linear
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        x = self.stem(x)
        return self.head(F.relu(x + self.body(x)).flatten(1))


def main():
    ap = argparse.ArgumentParser(description="A residual CNN of one's own on scikit-learn's digits")
    ap.add_argument("--data-dir", default="digits")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    train_set, test_set = digits(f"{args.data_dir}/digits_train.bin"), digits(f"{args.data_dir}/digits_test.bin")
    sampler = DistributedSampler(train_set, seed=args.seed)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), world)), batch_size=256)

    torch.manual_seed(args.seed)
    net = Net()
    model = DDP(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        start = time.perf_counter()
        net.train()
        sampler.set_epoch(epoch)
        for images, labels in loader:
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()
        seconds = time.perf_counter() - start

        net.eval()
        counts = torch.zeros(2, dtype=torch.float64)  # correct, images
        with torch.no_grad():
            for images, labels in test_loader:
                counts += torch.tensor([(net(images).argmax(1) == labels).sum().item(), len(labels)])
        dist.all_reduce(counts)
        correct, n = counts.tolist()
        if rank == 0:
            print(f"epoch {epoch} test accuracy {correct / n:g} ({correct:g}/{n:g}) train time {seconds:g} s",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
