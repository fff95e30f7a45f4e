#!/usr/bin/python3
# PyTorch side of tests/interop/torch_ddp: runs torch DDP (gloo, CPU) on a small model for every scenario and writes what
# each rank ends with, so that test_torch_ddp.cpp can run ddp's DistributedDataParallel on the same weights, data
# and plan and compare.
# SPDX-License-Identifier: MIT
#
# Usage (Debian's /usr/bin/python3 with python3-torch; exits 77 when torch is missing):
#   ddp_torch_reference.py WORLD OUT_DIR
# writes OUT_DIR/init.safetensors (the model's state_dict, the data as NHWC `x_nhwc` (S, 6, 6, 3), `labels` (S)) and, per
# scenario and rank, OUT_DIR/<scenario>_w<WORLD>_r<rank>.safetensors: every parameter (`param.<name>`) and
# buffer (`buffer.<name>`) after the plan, with the scenario's options and plan in the metadata (the C++ side
# reads them from there, so each scenario is defined once, here).
#
# Model: conv(3->4, 3x3, pad 1, no bias) -> bn -> relu -> mean over H, W -> a(4->3) [+ b(4->3)], cross-entropy.
# Plan: steps separated by ';', a step's passes by ','. A pass is KIND:MODES with KIND S (synchronised training
# pass), N (training pass under no_sync) or E (evaluation: model.eval(), torch.no_grad(), forward only), and
# MODES the heads each rank uses, '|'-separated per rank (the last one repeats), e.g. "a|ab". Every step begins
# with zero_grad(set_to_none=True) and ends with optimizer.step() when it had a training pass. Pass k of the
# whole plan gives rank r the samples [(k * WORLD + r) * B, ... + B), B = 4, so ranks see different data.
# Reference kinds:
#   ddp     torch's DistributedDataParallel itself.
#   manual  torch autograd and gloo all_reduce written out, for what torch 1.13's DDP cannot show:
#           - torch >= 2.0's no_sync + find_unused_parameters rule (1.13's reducer ignores hooks fired under
#             no_sync, so a parameter used only there keeps each rank's own gradient: ranks diverge); the rule:
#             a parameter used on some rank since the last synchronised step gets the average of every rank's
#             gradient (zeros where it has none); one no rank used keeps no gradient;
#           - the bf16 hook (gloo in 1.13 cannot all-reduce bfloat16): (g / W) rounded to bf16, summed in float32,
#             rounded to bf16.
#   raises  every rank's DDP construction must raise (different parameter shapes on rank 1).
import datetime
import os
import socket
import sys
import warnings

os.environ.setdefault("GLOG_minloglevel", "2")  # gloo's "Logging before InitGoogleLogging" lines
warnings.filterwarnings("ignore")  # torch 1.13's deprecation notes on every import

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    from safetensors_py import save_file
except Exception as e:  # depends on the machine
    print(f"SKIP: torch not importable by {sys.executable} ({e}); install python3-torch")
    sys.exit(77)

B, SAMPLES = 4, 160
SGD = dict(lr=0.1, momentum=0.9, weight_decay=0.01)

# name: (reference kind, find_unused_parameters, hook, plan)
SCENARIOS = {
    "plain": ("ddp", 0, "allreduce", "S:ab;S:ab;S:ab;S:ab"),
    # b unused everywhere (steps 0 and 3: no gradient, SGD skips it), unused on rank 0 only (step 1).
    "find_unused": ("ddp", 1, "allreduce", "S:a;S:a|ab;S:ab;S:a"),
    # b used only under no_sync (step 0), on rank 1 only under no_sync (step 1), not at all (step 2).
    "nosync_unused": ("manual", 1, "allreduce", "N:b,S:a;N:a|ab,S:a;S:a;S:ab"),
    # torch's require_forward_param_sync rule: buffers follow rank 0 only after a synchronised forward.
    "buffers": ("ddp", 0, "allreduce", "S:ab;N:ab,S:ab;E:ab;S:ab;S:ab"),
    "fp16": ("ddp", 0, "fp16", "S:ab;S:ab;S:ab;S:ab"),
    "bf16": ("manual", 0, "bf16", "S:ab;S:ab;S:ab;S:ab"),
    "shapes": ("raises", 0, "allreduce", ""),
    # gradient_as_bucket_view: the gradients are the buckets (accumulation under no_sync included).
    "bucket_view": ("ddp", 0, "allreduce", "S:ab;N:ab,S:ab;S:ab;S:ab"),
    "bucket_view_unused": ("ddp", 1, "allreduce", "S:a;S:a|ab;S:ab;S:a"),
    # static_graph: b unused on rank 0 in every step; then b unused everywhere in every step.
    "static_graph": ("ddp", 0, "allreduce", "S:a|ab;S:a|ab;S:a|ab;S:a|ab"),
    "static_graph_unused": ("ddp", 0, "allreduce", "S:a;S:a;S:a"),
}
# Extra DistributedDataParallel arguments per scenario (written to the metadata as 0/1).
DDP_FLAGS = {
    "bucket_view": {"gradient_as_bucket_view": 1},
    "bucket_view_unused": {"gradient_as_bucket_view": 1},
    "static_graph": {"static_graph": 1},
    "static_graph_unused": {"static_graph": 1, "gradient_as_bucket_view": 1},
}


class Net(torch.nn.Module):
    def __init__(self, head_out=3):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.a = torch.nn.Linear(4, head_out)
        self.b = torch.nn.Linear(4, 3)
        self.mode = "ab"

    def forward(self, x):
        p = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
        out = 0
        if "a" in self.mode:
            out = out + self.a(p)
        if "b" in self.mode:
            out = out + self.b(p)
        return out


def parse_plan(plan, world):
    steps = []
    for step in plan.split(";"):
        passes = []
        for p in step.split(","):
            kind, modes = p.split(":")
            modes = modes.split("|")
            passes.append((kind, [modes[min(r, len(modes) - 1)] for r in range(world)]))
        steps.append(passes)
    return steps


def initial_state():
    torch.manual_seed(1234)
    net = Net()
    with torch.no_grad():  # BN affine parameters away from 1/0 so that they matter
        net.bn.weight.uniform_(0.5, 1.5)
        net.bn.bias.uniform_(-0.2, 0.2)
    g = torch.Generator().manual_seed(99)
    x = torch.randn(SAMPLES, 3, 6, 6, generator=g)
    labels = torch.randint(0, 3, (SAMPLES,), generator=g)
    return net.state_dict(), x, labels


def bf16_hook_reference(world):
    """(g / W) -> bf16 -> sum over ranks in float32 -> bf16 -> float32, in place on every grad."""
    def reduce(t):
        c = (t / world).to(torch.bfloat16).to(torch.float32)
        dist.all_reduce(c)
        return c.to(torch.bfloat16).to(torch.float32)
    return reduce


def manual_step_reduce(net, world, used_since_sync, find_unused, compress):
    """torch >= 2.0's DDP reduction after a synchronised backward, written out."""
    params = list(net.parameters())
    used = torch.tensor([1 if u else 0 for u in used_since_sync], dtype=torch.int64)
    if find_unused:
        dist.all_reduce(used, op=dist.ReduceOp.MAX)
    for i, p in enumerate(params):
        if find_unused and used[i] == 0:
            continue  # no rank used it: the gradient stays as it is (None after zero_grad)
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if compress is not None:
            g = compress(g)
        else:
            g = g.clone()
            dist.all_reduce(g)
            g /= world
        p.grad = g


def run_scenario(rank, world, name, state, x, labels, out_dir):
    kind, find_unused, hook, plan = SCENARIOS[name]
    flags = DDP_FLAGS.get(name, {})
    meta = {"kind": kind, "find_unused": find_unused, "hook": hook, "plan": plan,
            "static_graph": flags.get("static_graph", 0),
            "gradient_as_bucket_view": flags.get("gradient_as_bucket_view", 0)}
    path = os.path.join(out_dir, f"{name}_w{world}_r{rank}.safetensors")
    if kind == "raises":
        # torch 1.13 raises on the rank whose shapes differ while the others wait in the check's collective;
        # a group with a short timeout makes them raise too (that is how long torch leaves them hanging).
        group = dist.new_group(timeout=datetime.timedelta(seconds=3))
        net = Net(head_out=3 if rank == 0 else 5)
        try:
            DDP(net, process_group=group)
            meta["raised"] = "no"
        except RuntimeError as e:
            meta["raised"] = "yes"
            meta["message"] = str(e).splitlines()[0]
        save_file({}, path, meta)
        return
    net = Net()
    net.load_state_dict(state)
    model = DDP(net, find_unused_parameters=bool(find_unused), **{k: bool(v) for k, v in flags.items()}) \
        if kind == "ddp" else net
    if kind == "ddp" and hook == "fp16":
        model.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    compress = bf16_hook_reference(world) if hook == "bf16" else None
    opt = torch.optim.SGD(net.parameters(), **SGD)
    k = 0
    for step in parse_plan(plan, world):
        opt.zero_grad(set_to_none=True)
        trained = False
        used = [False] * len(list(net.parameters()))
        for pass_kind, modes in step:
            lo = (k * world + rank) * B
            k += 1
            xb, yb = x[lo:lo + B], labels[lo:lo + B]
            net.mode = modes[rank]
            if pass_kind == "E":
                net.eval()
                with torch.no_grad():
                    model(xb)
                net.train()
                continue
            trained = True
            if pass_kind == "N" and kind == "ddp":
                with model.no_sync():
                    F.cross_entropy(model(xb), yb).backward()
            else:
                F.cross_entropy(model(xb), yb).backward()
            for i, p in enumerate(net.parameters()):
                used[i] = used[i] or p.grad is not None
            if pass_kind == "S" and kind == "manual":
                manual_step_reduce(net, world, used, find_unused, compress)
        if trained:
            opt.step()
    tensors = {f"param.{n}": p.detach().clone() for n, p in net.named_parameters()}
    tensors.update({f"buffer.{n}": b.detach().clone() for n, b in net.named_buffers()})
    save_file(tensors, path, meta)


def worker(rank, world, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    state, x, labels = initial_state()
    for name in SCENARIOS:  # "shapes" last: it leaves its group broken
        run_scenario(rank, world, name, state, x, labels, out_dir)
        if SCENARIOS[name][0] != "raises":
            dist.barrier()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    world, out_dir = int(sys.argv[1]), sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    state, x, labels = initial_state()
    save_file({**state, "x_nhwc": x.permute(0, 2, 3, 1).contiguous(), "labels": labels},
              os.path.join(out_dir, "init.safetensors"),
              {"batch": B, "sgd": f"{SGD['lr']},{SGD['momentum']},{SGD['weight_decay']}",
               "scenarios": ",".join(SCENARIOS)})
    mp.spawn(worker, args=(world, free_port(), out_dir), nprocs=world)


if __name__ == "__main__":
    main()
