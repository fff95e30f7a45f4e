#!/usr/bin/python3
# PyTorch side of tests/interop/torch_join: torch's DistributedDataParallel inside its join context (`with model.join():`,
# torch.distributed.algorithms.Join with DDP's join hook) on gloo, where rank r trains on its own number of batches;
# writes what each rank ends with so that test_torch_join.cpp can run ddp's join on the same weights and data.
# SPDX-License-Identifier: MIT
#
# Usage (Debian's /usr/bin/python3 with python3-torch; exits 77 when torch is missing):
#   join_torch_reference.py WORLD OUT_DIR
# Model, data, optimizer and init.safetensors: tests/interop/torch_ddp/ddp_torch_reference.py (imported). Per scenario and
# rank, OUT_DIR/<scenario>_w<WORLD>_r<rank>.safetensors holds every parameter and buffer after the loop and join,
# with the scenario in the metadata: `steps` (batches per rank, ','-separated), `modes` (heads per rank, '|'), and
# `find_unused`. Rank r's step s reads samples [(s * WORLD + r) * B, ... + B).
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch_ddp"))
import ddp_torch_reference as ref  # exits 77 without torch

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

# name: (find_unused_parameters, heads per rank ('|'-separated, the last repeats), {world: steps per rank})
SCENARIOS = {
    "rank0_first": (0, "ab", {2: [2, 4], 4: [2, 4, 3, 5]}),  # rank 0 has the fewest batches
    "rank0_last": (0, "ab", {2: [4, 1], 4: [5, 3, 1, 2]}),
    "rank0_empty": (0, "ab", {2: [0, 3], 4: [0, 2, 3, 1]}),  # rank 0 shadows the first step (bucket rebuild)
    # head b is used on ranks >= 1 only; each step some rank still training uses it.
    "find_unused": (1, "a|ab", {2: [2, 4], 4: [3, 4, 1, 2]}),
    # only rank 0 uses head b, and it joins first: then no rank still training uses b
    "find_unused_idle": (1, "ab|a", {2: [1, 3], 4: [1, 3, 2, 3]}),
}


def run_scenario(rank, world, name, state, x, labels, out_dir):
    find_unused, modes, steps = SCENARIOS[name]
    steps = steps[world]
    mode_list = modes.split("|")
    net = ref.Net()
    net.load_state_dict(state)
    net.mode = mode_list[min(rank, len(mode_list) - 1)]
    model = DDP(net, find_unused_parameters=bool(find_unused))
    opt = torch.optim.SGD(net.parameters(), **ref.SGD)
    with model.join():
        for s in range(steps[rank]):
            lo = (s * world + rank) * ref.B
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[lo:lo + ref.B]), labels[lo:lo + ref.B]).backward()
            opt.step()
    tensors = {f"param.{n}": p.detach().clone() for n, p in net.named_parameters()}
    tensors.update({f"buffer.{n}": b.detach().clone() for n, b in net.named_buffers()})
    meta = {"find_unused": str(find_unused), "modes": modes, "steps": ",".join(map(str, steps))}
    ref.save_file(tensors, os.path.join(out_dir, f"{name}_w{world}_r{rank}.safetensors"), meta)


def worker(rank, world, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    state, x, labels = ref.initial_state()
    for name in SCENARIOS:
        run_scenario(rank, world, name, state, x, labels, out_dir)
        dist.barrier()


def main():
    world, out_dir = int(sys.argv[1]), sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    state, x, labels = ref.initial_state()
    ref.save_file({**state, "x_nhwc": x.permute(0, 2, 3, 1).contiguous(), "labels": labels},
                  os.path.join(out_dir, "init.safetensors"),
                  {"batch": ref.B, "sgd": f"{ref.SGD['lr']},{ref.SGD['momentum']},{ref.SGD['weight_decay']}",
                   "scenarios": ",".join(SCENARIOS)})
    # fork: the workers inherit the imported torch instead of importing it again (most of the run time)
    mp.start_processes(worker, args=(world, ref.free_port(), out_dir), nprocs=world, start_method="fork")


if __name__ == "__main__":
    main()
