#!/usr/bin/env python3
# PyTorch side of bench_resnet_gpu: torchvision's ResNet training step under PyTorch eager (or torch.compile) on
# the GPU, with the batch, precision and channels_last layout of ddp's run; prints one JSON line:
#   {"torch_images_per_s": ..., "torch_step_s": ..., "torch_peak_allocated_bytes": ...,
#    "torch_peak_requested_bytes": ..., "torch_peak_reserved_bytes": ..., "torch_version": ..., "step_flops": ...}
# Usage: torch_step.py --arch resnet50 --batch 64 --image-size 224 --precision bf16 [--steps 20]
#                      [--warmup 5] [--device 0] [--compile none|default|max-autotune] [--profile N]
#                      (exits 77 without torch/torchvision or a GPU)
# Memory, high-water marks over the timed steps: allocated = torch.cuda.max_memory_allocated (blocks handed out,
# 512-B rounded), requested = memory_stats()["requested_bytes.all.peak"] (what the callers asked for; absent
# before torch 2.1), reserved = torch.cuda.max_memory_reserved (obtained from the driver).
# --compile M: the step's model under torch.compile(mode=M) (M "default": no mode); the keys are then
# "torch_compile_<M>_..." (max-autotune as max_autotune), and a model that does not compile prints
# {"torch_compile_<M>_error": ...} and exits 0, so the eager rows still stand.
# --profile N (eager only): N more steps under torch.profiler (CUDA activity): "torch_profile_top", the 25
# kernels with the most device time (ms and calls per step), and "torch_profile_classes", every kernel's time
# summed by op class in the same form as bench_resnet_gpu's "ddp_profile" (kernel_class below: by kernel name,
# so approximate: cuDNN's and cuBLAS's kernel names change between versions; unmatched kernels are "other").
# Its failure (no CUPTI, say) is "torch_profile_error", and the timed numbers still stand.
# step_flops (eager only, torch >= 2.1): the floating-point operations of one training step (forward, loss,
# backward) as torch.utils.flop_counter.FlopCounterMode counts them (convolutions and matmuls, 2 per
# multiply-add); bench_resnet_gpu divides it by each side's step time for the achieved TFLOP/s.
# One step = zero_grad, forward, cross-entropy, loss.item() (as ddp reads its loss), backward, SGD momentum
# 0.9. Precision: fp32 = TF32 off for matmul and cuDNN; tf32 = TF32 on; bf16 = autocast(bfloat16) around
# forward and loss (float32 master weights and optimizer, bf16 activations), TF32 on for what stays float32.
# Any other failure prints {"torch_error": "<type>: <message>"} and exits 1, so the caller has the reason.
# SPDX-License-Identifier: MIT
import argparse
import json
import re
import sys
import time
import traceback

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
ap.add_argument("--profile", type=int, default=0)
a = ap.parse_args()
prefix = "torch_" if a.compile == "none" else "torch_compile_" + a.compile.replace("-", "_") + "_"


def report_failure(kind, value, tb):  # any uncaught failure (out of memory, a cuDNN error): JSON, then the trace
    print(json.dumps({prefix + "error": f"{kind.__name__}: {value}"[:500]}), flush=True)
    traceback.print_exception(kind, value, tb)


sys.excepthook = report_failure

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


# (op class, kernel-name pattern), first match wins. cuDNN names its convolution kernels by pass
# ("sm90_xmma_fprop_implicit_gemm_...", "..._dgrad_...", "..._wgrad_..."); BatchNorm, pooling, the loss and
# the element-wise ops are ATen's (their functor names are in the kernel's template arguments).
KERNEL_CLASSES = [
    ("conv.dgrad", r"dgrad"),
    ("conv.wgrad", r"wgrad"),
    ("conv.fprop", r"fprop|implicit_convolve|conv2d|convolve|xmma_.*conv"),
    ("bn_backward", r"batch_norm.*backward|batch_norm_backward|bn_bw|batch_norm_collect_grad|bn_bwd"),
    ("bn_forward", r"batch_norm|bn_fw|bn_fwd|welford"),
    ("pool", r"pool"),
    ("loss", r"softmax|nll_loss|cross_entropy"),
    ("optimizer", r"multi_tensor_apply|sgd|momentum|foreach"),
    ("fill", r"FillFunctor|fill_kernel|memset"),
    ("add", r"AddFunctor|CUDAFunctor_add|add_kernel"),
    ("relu", r"threshold|clamp|relu"),
    ("cast_copy", r"copy|cast|bfloat16|to_copy"),
    ("layout", r"nchwToNhwc|nhwcToNchw|transpose|permute"),
    ("gemm", r"gemm|nvjet|cutlass|cublas"),
    ("reduce", r"reduce"),
]


def kernel_class(name):
    for cls, pattern in KERNEL_CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return cls
    return "other"


def profile_steps(n):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        if us > 0:
            kernels.append((e.key, us / 1000.0, e.count))
    kernels.sort(key=lambda k: -k[1])
    total = sum(ms for _, ms, _ in kernels)
    classes = {}
    for name, ms, count in kernels:
        c = classes.setdefault(kernel_class(name), {"ms": 0.0, "calls": 0})
        c["ms"] += ms
        c["calls"] += count
    ordered = sorted(classes.items(), key=lambda kv: -kv[1]["ms"])
    return {
        "torch_profile_top": [{"name": name[:200], "class": kernel_class(name), "ms_per_step": ms / n,
                               "calls_per_step": count / n} for name, ms, count in kernels[:25]],
        "torch_profile_classes": {"steps": n, "ms_per_step": total / n, "classes": {
            cls: {"ms_per_step": c["ms"] / n, "calls_per_step": c["calls"] / n,
                  "share": c["ms"] / total if total else 0.0} for cls, c in ordered}},
    }


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
stats = torch.cuda.memory_stats(dev)
out = {prefix + "images_per_s": a.batch * a.steps / secs, prefix + "step_s": secs / a.steps,
       prefix + "peak_allocated_bytes": float(torch.cuda.max_memory_allocated(dev)),
       prefix + "peak_reserved_bytes": float(torch.cuda.max_memory_reserved(dev)), prefix + "last_loss": last}
if "requested_bytes.all.peak" in stats:
    out[prefix + "peak_requested_bytes"] = float(stats["requested_bytes.all.peak"])
if a.compile == "none":
    out.update({"torch_version": torch.__version__, "cudnn": torch.backends.cudnn.version()})
    flops = step_flops()
    if flops:
        out["step_flops"] = flops
    if a.profile > 0:
        try:
            out.update(profile_steps(a.profile))
        except Exception as e:  # no CUPTI, an older profiler API: the timed numbers still stand
            out["torch_profile_error"] = f"{type(e).__name__}: {e}"[:500]
print(json.dumps(out))
