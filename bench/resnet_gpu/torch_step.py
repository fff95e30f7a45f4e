#!/usr/bin/env python3
# PyTorch side of bench_resnet_gpu: torchvision's ResNet training step under PyTorch eager (or torch.compile) on
# the GPU, with the batch, precision and channels_last layout of ddp's run; prints one JSON line:
#   {"torch_images_per_s": ..., "torch_step_s": ..., "torch_peak_mem_bytes": ..., "torch_version": ...,
#    "step_flops": ...}
# Usage: torch_step.py --arch resnet50 --batch 64 --image-size 224 --precision bf16 [--steps 20]
#                      [--warmup 5] [--device 0] [--compile none|default|max-autotune]
#                      (exits 77 without torch/torchvision or a GPU)
# --compile M: the step's model under torch.compile(mode=M) (M "default": no mode); the keys are then
# "torch_compile_<M>_..." (max-autotune as max_autotune), and a model that does not compile prints
# {"torch_compile_<M>_error": ...} and exits 0, so the eager rows still stand.
# step_flops (eager only, torch >= 2.1): the floating-point operations of one training step (forward, loss,
# backward) as torch.utils.flop_counter.FlopCounterMode counts them (convolutions and matmuls, 2 per
# multiply-add); bench_resnet_gpu divides it by each side's step time for the achieved TFLOP/s.
# One step = zero_grad, forward, cross-entropy, loss.item() (as ddp reads its loss), backward, SGD momentum
# 0.9. Precision: fp32 = TF32 off for matmul and cuDNN; tf32 = TF32 on; bf16 = autocast(bfloat16) around
# forward and loss (float32 master weights and optimizer, bf16 activations), TF32 on for what stays float32.
# SPDX-License-Identifier: MIT
import argparse
import json
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    import torchvision
except Exception as e:  # depends on the machine
    print(json.dumps({"torch_error": f"torch/torchvision not importable: {e}"}))
    sys.exit(77)

ap = argparse.ArgumentParser()
ap.add_argument("--arch", required=True)
ap.add_argument("--batch", type=int, required=True)
ap.add_argument("--image-size", type=int, default=224)
ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], required=True)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--device", type=int, default=0)
ap.add_argument("--compile", choices=["none", "default", "max-autotune"], default="none")
a = ap.parse_args()
prefix = "torch_" if a.compile == "none" else "torch_compile_" + a.compile.replace("-", "_") + "_"

if not torch.cuda.is_available():
    print(json.dumps({prefix + "error": "torch sees no CUDA device"}))
    sys.exit(77)

dev = torch.device("cuda", a.device)
torch.cuda.set_device(dev)
tf32 = a.precision != "fp32"
torch.backends.cuda.matmul.allow_tf32 = tf32
torch.backends.cudnn.allow_tf32 = tf32
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)

model = getattr(torchvision.models, a.arch)(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(a.batch, 3, a.image_size, a.image_size, device=dev).to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (a.batch,), device=dev)
autocast = a.precision == "bf16"
net = model
if a.compile != "none":
    try:
        net = torch.compile(model, mode=None if a.compile == "default" else a.compile)
    except Exception as e:  # an older torch, or no compiler toolchain on the machine
        print(json.dumps({prefix + "error": f"torch.compile: {type(e).__name__}: {e}"[:500]}))
        sys.exit(0)


def step():
    opt.zero_grad(set_to_none=False)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = F.cross_entropy(net(x), y)
    value = loss.item()
    loss.backward()
    opt.step()
    return value


def step_flops():
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    counter = FlopCounterMode(display=False)
    with counter:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
    opt.zero_grad(set_to_none=False)
    return float(counter.get_total_flops())


try:
    for _ in range(a.warmup):  # compilation happens here
        step()
except Exception as e:
    if a.compile == "none":
        raise
    print(json.dumps({prefix + "error": f"torch.compile: {type(e).__name__}: {e}"[:500]}))
    sys.exit(0)
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats(dev)
t0 = time.perf_counter()
for _ in range(a.steps):
    last = step()
torch.cuda.synchronize()
secs = time.perf_counter() - t0
out = {prefix + "images_per_s": a.batch * a.steps / secs, prefix + "step_s": secs / a.steps,
       prefix + "peak_mem_bytes": float(torch.cuda.max_memory_allocated(dev)), prefix + "last_loss": last}
if a.compile == "none":
    out.update({"torch_version": torch.__version__, "cudnn": torch.backends.cudnn.version()})
    flops = step_flops()
    if flops:
        out["step_flops"] = flops
print(json.dumps(out))
