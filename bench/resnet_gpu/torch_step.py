#!/usr/bin/env python3
# PyTorch side of bench_resnet_gpu: torchvision's ResNet training step under PyTorch eager on the GPU, with
# the batch, precision and channels_last layout of ddp's run; prints one JSON line:
#   {"torch_images_per_s": ..., "torch_step_s": ..., "torch_peak_mem_bytes": ..., "torch_version": ...}
# Usage: torch_step.py --arch resnet50 --batch 64 --image-size 224 --precision bf16 [--steps 20]
#                      [--warmup 5] [--device 0]            (exits 77 without torch/torchvision or a GPU)
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
a = ap.parse_args()

if not torch.cuda.is_available():
    print(json.dumps({"torch_error": "torch sees no CUDA device"}))
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


def step():
    opt.zero_grad(set_to_none=False)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = F.cross_entropy(model(x), y)
    value = loss.item()
    loss.backward()
    opt.step()
    return value


for _ in range(a.warmup):
    step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats(dev)
t0 = time.perf_counter()
for _ in range(a.steps):
    last = step()
torch.cuda.synchronize()
secs = time.perf_counter() - t0
print(json.dumps({"torch_images_per_s": a.batch * a.steps / secs, "torch_step_s": secs / a.steps,
                  "torch_peak_mem_bytes": float(torch.cuda.max_memory_allocated(dev)),
                  "torch_last_loss": last, "torch_version": torch.__version__,
                  "cudnn": torch.backends.cudnn.version()}))
