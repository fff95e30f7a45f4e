#!/usr/bin/python3
# Writes what torch.optim does (SGD, AdamW, clip_grad_norm_, LR schedulers) for tests/interop/torch_optim/test_optim_torch.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_optim_reference.py OUT_FILE      (exits 77 when torch is not importable)
#
# File format: tests/interop/reference/make_op_reference.py's (records of name, kind, dims, float64 or int64 values).
# Parameters w (4, 3), u (2, 2), b (3,), v (5,) start from "init/<p>" and get gradient "grad/<k>/<p>" at step k;
# a parameter whose gradient is missing at step k has .grad = None there (u at steps 0 and 2, v at step 3), so
# the optimizer must skip it. Groups: A = [w, u] with the optimizer's weight decay, B = [b, v] with weight
# decay 0 and half the learning rate. "<case>/<p>/<k>" is parameter p after step k of optimizer case <case>.
# All arithmetic is torch's float32 (values stored exactly as float64).
import struct
import sys
import warnings

try:
    import torch
except Exception as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: PyTorch is not importable by {sys.executable} ({e}); install python3-torch")
    sys.exit(77)

# SequentialLR calls scheduler.step(0) at its milestone, which warns that the epoch argument is deprecated.
warnings.filterwarnings("ignore", message="The epoch parameter")
torch.manual_seed(20240615)
torch.set_num_threads(1)
records = []


def put(name, t):
    if isinstance(t, (list, tuple)):
        t = torch.tensor(t, dtype=torch.float64)
    elif isinstance(t, (int, float)):
        t = torch.tensor([t], dtype=torch.float64)
    t = t.detach().contiguous()
    data = t.to(torch.float64).flatten().tolist()
    b = name.encode()
    out = struct.pack("<I", len(b)) + b + struct.pack("<BI", 0, t.dim()) + struct.pack(f"<{t.dim()}q", *t.shape)
    out += struct.pack(f"<{len(data)}d", *data)
    records.append(out)


SHAPES = {"w": (4, 3), "u": (2, 2), "b": (3,), "v": (5,)}
STEPS = 6
MISSING = {("u", 0), ("u", 2), ("v", 3)}
init = {p: torch.randn(*s) for p, s in SHAPES.items()}
grads = [{p: torch.randn(*s) for p, s in SHAPES.items()} for _ in range(STEPS)]
for p, t in init.items():
    put(f"init/{p}", t)
for k in range(STEPS):
    for p, g in grads[k].items():
        put(f"grad/{k}/{p}", g)


def make_params():
    return {p: torch.nn.Parameter(init[p].clone()) for p in SHAPES}


def groups(ps, base_lr):
    # Group A keeps the optimizer's weight decay; group B: none, at half the lr.
    return [{"params": [ps["w"], ps["u"]]}, {"params": [ps["b"], ps["v"]], "weight_decay": 0.0, "lr": 0.5 * base_lr}]


def run(case, make_opt, sched=None):
    ps = make_params()
    opt = make_opt(ps)
    s = sched(opt) if sched else None
    for k in range(STEPS):
        for p in SHAPES:
            ps[p].grad = None if (p, k) in MISSING else grads[k][p].clone()
        opt.step()
        if s:
            s.step()
        for p in SHAPES:
            put(f"{case}/{p}/{k}", ps[p])


SGD_CASES = [dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
             dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3),
             dict(lr=0.2)]
for i, o in enumerate(SGD_CASES):
    run(f"sgd{i}", lambda ps, o=o: torch.optim.SGD(groups(ps, o["lr"]), **o))
ADAMW_CASES = [dict(lr=1e-2),  # torch's defaults otherwise: betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2
               dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)]
for i, o in enumerate(ADAMW_CASES):
    run(f"adamw{i}", lambda ps, o=o: torch.optim.AdamW(groups(ps, o["lr"]), **o))
# AdamW under warmup (2 steps from 0.1 of the lr) + cosine (t_max 3, so past t_max within 6 steps), stepped per step.
run("adamw_sched", lambda ps: torch.optim.AdamW(groups(ps, 1e-2), lr=1e-2),
    lambda opt: torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2),
              torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3, eta_min=1e-4)], milestones=[2]))

# clip_grad_norm_ over the step-0 gradients (u has none): clipping (max_norm 1) and not (max_norm 100).
for i, max_norm in enumerate([1.0, 100.0]):
    ps = make_params()
    for p in SHAPES:
        ps[p].grad = None if (p, 0) in MISSING else grads[0][p].clone()
    total = torch.nn.utils.clip_grad_norm_(list(ps.values()), max_norm)
    put(f"clip{i}/total", float(total))
    for p in SHAPES:
        if ps[p].grad is not None:
            put(f"clip{i}/{p}", ps[p].grad)


# LR schedules: "sched/<name>" is the lr of steps 0..n-1 (read before each optimizer step), each scheduler
# stepped once per optimizer step. Warmup is SequentialLR(LinearLR(start_factor, 1, W), X, milestones=[W]).
def lrs(n, make):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    s = make(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


L = torch.optim.lr_scheduler


def warm(first, w, sf):
    return lambda opt: L.SequentialLR(opt, [L.LinearLR(opt, start_factor=sf, total_iters=w), first(opt)],
                                      milestones=[w])


SCHEDULES = {
    "warmcos": (40, warm(lambda o: L.CosineAnnealingLR(o, T_max=10, eta_min=1e-3), 5, 0.1)),
    "cos": (30, lambda o: L.CosineAnnealingLR(o, T_max=7)),
    "step": (20, lambda o: L.StepLR(o, step_size=3, gamma=0.5)),
    "warmstep": (20, warm(lambda o: L.StepLR(o, step_size=3, gamma=0.5), 4, 0.25)),
    "multistep": (20, lambda o: L.MultiStepLR(o, milestones=[4, 9, 11], gamma=0.3)),
    "warmmulti": (15, warm(lambda o: L.MultiStepLR(o, milestones=[2, 6], gamma=0.1), 3, 0.5)),
    "warmconst": (12, lambda o: L.LinearLR(o, start_factor=1.0 / 3, total_iters=6)),
}
for name, (n, make) in SCHEDULES.items():
    put(f"sched/{name}", lrs(n, make))

with open(sys.argv[1], "wb") as f:
    f.write(b"".join(records))
