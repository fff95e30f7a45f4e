#!/usr/bin/python3
# PyTorch side of tests/interop/torch_zero: torch DDP + torch.distributed.optim.ZeroRedundancyOptimizer (gloo, CPU) on
# tests/interop/torch_ddp's model and data, so that test_torch_zero.cpp can run ddp's DDP + ZeroRedundancyOptimizer on
# the same weights, data and plan and compare.
# SPDX-License-Identifier: MIT
#
# Usage (Debian's /usr/bin/python3 with python3-torch; exits 77 when torch is missing):
#   zero_torch_reference.py OUT_DIR
# runs world 2 (ranks 0 and 1, a subgroup) and world 4 in one set of 4 processes (one torch start-up: the test
# stays short) and writes OUT_DIR/init.safetensors (as tests/interop/torch_ddp's) and per scenario and world
# OUT_DIR/<scenario>_w<WORLD>.safetensors
# from rank 0: every parameter after the plan (`param.<name>`), the optimizer state consolidated to rank 0
# (consolidate_state_dict(to=0); `state.<state name>.<param name>`, AdamW's step as a float64 scalar), and in
# the metadata the optimizer, its options, the parameter groups ("decay": rank >= 2, the rest "no_decay") and
# torch's partition (`partition`: the owner rank of each parameter, in named_parameters() order).
# Plan: STEPS steps; step k: zero_grad(set_to_none=True), forward + backward of rank r's samples
# [(k * WORLD + r) * B, ... + B) with both heads, optimizer.step().
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch_ddp"))
import ddp_torch_reference as ref  # exits 77 when torch is missing; sets up safetensors_py's path

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from safetensors_py import save_file  # noqa: E402

STEPS = 5
# name: (optimizer class, options, weight decay of the "decay" group or None for one group)
SCENARIOS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01), None),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0), 0.05),
}


def param_groups(net, decay):
    if decay is None:
        return list(net.parameters())
    params = list(net.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def run_scenario(rank, world, group, name, state, x, labels, out_dir):
    cls, options, decay = SCENARIOS[name]
    net = ref.Net()
    net.load_state_dict(state)
    model = DDP(net, process_group=group)
    opt = ZeroRedundancyOptimizer(param_groups(net, decay), optimizer_class=cls, process_group=group, **options)
    for k in range(STEPS):
        opt.zero_grad(set_to_none=True)
        lo = (k * world + rank) * ref.B
        F.cross_entropy(model(x[lo:lo + ref.B]), labels[lo:lo + ref.B]).backward()
        opt.step()
    opt.consolidate_state_dict(to=0)
    if rank != 0:
        return
    names = [n for n, _ in net.named_parameters()]
    by_param = {p: n for n, p in net.named_parameters()}
    order = [p for g in opt.param_groups for p in g["params"]]  # the state dict's parameter indices
    owner = {p: r for p, r in opt._param_to_rank.items()}
    tensors = {f"param.{n}": p.detach().clone() for n, p in net.named_parameters()}
    for index, st in opt.state_dict()["state"].items():
        pname = by_param[order[index]]
        for key, value in st.items():
            value = torch.as_tensor(value)
            tensors[f"state.{key}.{pname}"] = value.to(torch.float64) if key == "step" else value.clone()
    meta = {"optimizer": name, "steps": STEPS,
            "options": ",".join(f"{k}={v}" for k, v in options.items() if k != "betas"),
            "decay": "" if decay is None else str(decay),
            "partition": ",".join(str(owner[p]) for p in net.parameters()),
            "names": ",".join(names)}
    save_file(tensors, os.path.join(out_dir, f"{name}_w{world}.safetensors"), meta)


def worker(rank, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    pair = dist.new_group([0, 1])  # every rank takes part in creating it
    state, x, labels = ref.initial_state()
    for world, group in ((2, pair), (4, dist.group.WORLD)):
        if rank < world:
            for name in SCENARIOS:
                run_scenario(rank, world, group, name, state, x, labels, out_dir)
        dist.barrier()


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    state, x, labels = ref.initial_state()
    save_file({**state, "x_nhwc": x.permute(0, 2, 3, 1).contiguous(), "labels": labels},
              os.path.join(out_dir, "init.safetensors"),
              {"batch": ref.B, "scenarios": ",".join(SCENARIOS)})
    mp.spawn(worker, args=(ref.free_port(), out_dir), nprocs=4)


if __name__ == "__main__":
    main()
