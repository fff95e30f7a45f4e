#!/usr/bin/python3
# PyTorch side of tests/interop/torch_powersgd: torch 1.13's DDP with its own powerSGD_hook (gloo, CPU) on the model,
# weights and data of tests/interop/torch_ddp (imported from ddp_torch_reference.py), writing what each rank ends
# with and the initial Q torch drew, so that test_torch_powersgd.cpp can run ddp's PowerSGD hook on the same
# inputs and compare.
# SPDX-License-Identifier: MIT
#
# Usage (Debian's /usr/bin/python3 with python3-torch; exits 77 when torch is missing):
#   powersgd_torch_reference.py WORLD OUT_DIR
# writes OUT_DIR/init.safetensors (as ddp_torch_reference.py) and OUT_DIR/<scenario>_w<WORLD>_r<rank>.safetensors:
# every parameter after STEPS steps (`param.<name>`) and torch's initial Q of every compressed parameter
# (`q0.<name>`, (cols, r) with the rows in ddp's column order: conv weights' (C_in, kH, kW) columns become
# (kH, kW, C_in)), the scenario's options in the metadata.
# Every step: zero_grad, forward with both heads, cross-entropy, backward, SGD step; step k gives rank r the
# samples [(k * WORLD + r) * B, ... + B).
# The initial Q: powerSGD_hook draws it with torch.randn under a seed from its own numpy RNG; we wrap the
# module's `torch` so that each draw is recorded, in the order the hook makes them (compressed tensors grouped
# by shape, in bucket order within a group), and name each draw after its parameter.
import os
import sys
import warnings
from collections import defaultdict

os.environ.setdefault("GLOG_minloglevel", "2")
warnings.filterwarnings("ignore")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "torch_ddp"))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    from safetensors_py import save_file
    import ddp_torch_reference as ref
except Exception as e:  # depends on the machine
    print(f"SKIP: torch not importable by {sys.executable} ({e}); install python3-torch")
    sys.exit(77)

STEPS = 6
# name: (matrix_approximation_rank, start_powerSGD_iter, min_compression_rate). Error feedback and warm start on.
# The model's matrices: conv 4 x 27, a.weight and b.weight 3 x 4; every 1-D tensor stays uncompressed.
#   r1: conv, a.weight, b.weight compressed (Gram-Schmidt in torch)
#   r2: conv only (2 * 31 < 108; a 3 x 4 at r = 2: 14 >= 12) (Gram-Schmidt)
#   r4: conv at r = 4 and a/b.weight at r = 3 (min(3, 4, 4)): torch takes Householder QR (rank > 2)
SCENARIOS = {"r1": (1, 2, 1.0), "r2": (2, 3, 1.0), "r4": (4, 2, 0.5)}


class RecordingTorch:
    """The powerSGD_hook module's `torch`, recording every randn draw (everything else is torch)."""

    def __init__(self):
        self.draws = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def randn(self, *args, **kwargs):
        t = torch.randn(*args, **kwargs)
        self.draws.append(t.clone())
        return t


def to_ddp_rows(name, p, q):
    """q (1, cols, r) in torch's column order -> (cols, r) in ddp's (conv weights: (C_in, kH, kW) -> (kH, kW, C_in))."""
    q = q[0]
    if p.dim() == 4:
        _, c, kh, kw = p.shape
        q = q.reshape(c, kh, kw, -1).permute(1, 2, 0, 3).reshape(c * kh * kw, -1)
    return q.contiguous()


def run_scenario(rank, world, name, state_dict, x, labels, out_dir):
    r, start, rate = SCENARIOS[name]
    net = ref.Net()
    net.load_state_dict(state_dict)
    names = {id(p): n for n, p in net.named_parameters()}
    model = DDP(net)
    st = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=start,
                            min_compression_rate=rate, use_error_feedback=True, warm_start=True, random_seed=0)
    recorder = RecordingTorch()
    q0 = {}

    def hook(state, bucket):
        randomizes = state.iter >= state.start_powerSGD_iter and bucket.index() not in state.p_memory_dict
        order = []  # the parameters whose Q the hook draws now, in its order
        if randomizes:
            groups = defaultdict(list)
            for p, g in zip(bucket.parameters(), bucket.gradients()):
                m = g.view(g.shape[0], -1)
                rank = min(m.shape[0], m.shape[1], state.matrix_approximation_rank)
                if psgd._should_compress(m.shape[0], m.shape[1], rank, state.min_compression_rate)[0]:
                    groups[m.shape].append(p)
            order = [p for ps in groups.values() for p in ps]
        first = len(recorder.draws)
        fut = psgd.powerSGD_hook(state, bucket)
        draws = recorder.draws[first:]
        assert len(draws) == len(order), (len(draws), len(order))
        for p, q in zip(order, draws):
            q0[f"q0.{names[id(p)]}"] = to_ddp_rows(names[id(p)], p, q)
        return fut

    psgd.torch = recorder
    try:
        model.register_comm_hook(st, hook)
        opt = torch.optim.SGD(net.parameters(), **ref.SGD)
        for k in range(STEPS):
            opt.zero_grad(set_to_none=True)
            lo = (k * world + rank) * ref.B
            F.cross_entropy(model(x[lo:lo + ref.B]), labels[lo:lo + ref.B]).backward()
            opt.step()
    finally:
        psgd.torch = torch
    tensors = {f"param.{n}": p.detach().clone() for n, p in net.named_parameters()}
    tensors.update(q0)
    save_file(tensors, os.path.join(out_dir, f"{name}_w{world}_r{rank}.safetensors"),
              {"rank": r, "start_iter": start, "min_compression_rate": rate, "steps": STEPS,
               "compressed": ",".join(sorted(k[3:] for k in q0))})


def worker(rank, world, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    state_dict, x, labels = ref.initial_state()
    for name in SCENARIOS:
        run_scenario(rank, world, name, state_dict, x, labels, out_dir)
        dist.barrier()


def main():
    world, out_dir = int(sys.argv[1]), sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    state_dict, x, labels = ref.initial_state()
    save_file({**state_dict, "x_nhwc": x.permute(0, 2, 3, 1).contiguous(), "labels": labels},
              os.path.join(out_dir, "init.safetensors"),
              {"batch": ref.B, "sgd": f"{ref.SGD['lr']},{ref.SGD['momentum']},{ref.SGD['weight_decay']}",
               "scenarios": ",".join(SCENARIOS), "steps": STEPS})
    mp.spawn(worker, args=(world, ref.free_port(), out_dir), nprocs=world)


if __name__ == "__main__":
    main()
