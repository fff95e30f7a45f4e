#!/usr/bin/python3
"""Reference data for ddp's ResNet: torchvision resnet18/resnet50 forward, backward and one SGD step.

Run with Debian's PyTorch (1.13 here): /usr/bin/python3 tests/interop/reference/make_resnet_reference.py OUT_DIR
  [--archs resnet18,resnet50] [--batch 2] [--size 64] [--num-classes 10] [--seed 0]

For each arch it writes, with tests/interop/reference/safetensors_py.py (names = torchvision state_dict keys,
conv weights OIHW, activations NCHW, float32; num_batches_tracked int64):
  <arch>_init.safetensors       state_dict before anything runs (params + buffers)
  <arch>_io.safetensors         input (N,3,H,W), input_nhwc (N,H,W,3), labels (N) int64, logits (N,K) from the
                                train-mode forward, loss () = mean cross-entropy, logits_eval_after_step (N,K):
                                eval-mode logits of the stepped model (running statistics)
  <arch>_grads.safetensors      d loss / d p for every parameter, same names as the parameters
  <arch>_after_forward.safetensors  buffers after the train-mode forward: running_mean/var (momentum 0.1,
                                unbiased variance), num_batches_tracked == 4
  <arch>_after_step.safetensors     parameters after one torch.optim.SGD step (lr 0.1, momentum 0.9,
                                weight_decay 1e-5, dampening 0, nesterov False); first step, so the momentum
                                buffer is grad + wd * p and p -= lr * buffer
Each file's __metadata__ records arch, torch/torchvision versions, shapes and hyper-parameters.

Initialisation is torchvision's (Kaiming normal fan_out convs, default Linear) under torch.manual_seed(seed),
then every BatchNorm is re-drawn (weight ~ U(0.5, 1.5), bias ~ N(0, 0.1), running_mean ~ N(0, 0.1),
running_var ~ U(0.8, 1.2), num_batches_tracked = 3) so that a C++ model that ignored gamma/beta or the
running-statistics update would not pass by accident. The model is in train() mode (batch statistics) for
the forward/backward; the input is N(0,1) and the labels uniform in [0, K).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402

LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-5


def make(arch, out_dir, batch, size, num_classes, seed):
    torch.manual_seed(seed)
    model = getattr(torchvision.models, arch)(num_classes=num_classes)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 0.4 + 0.8)
                m.num_batches_tracked.fill_(3)
    model.train()
    meta = {"arch": arch, "torch": torch.__version__, "torchvision": torchvision.__version__, "batch": batch,
            "height": size, "width": size, "num_classes": num_classes, "seed": seed, "mode": "train",
            "lr": LR, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, "layout": "NCHW/OIHW"}
    meta = {k: str(v) for k, v in meta.items()}
    path = lambda what: os.path.join(out_dir, f"{arch}_{what}.safetensors")  # noqa: E731
    safetensors_py.save_file({k: v.clone() for k, v in model.state_dict().items()}, path("init"), meta)

    x = torch.randn(batch, 3, size, size, generator=g)
    labels = torch.randint(0, num_classes, (batch,), generator=g)
    logits = model(x)
    loss = F.cross_entropy(logits, labels)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    opt.zero_grad()
    loss.backward()
    params = dict(model.named_parameters())
    grads = {k: p.grad.detach().clone() for k, p in params.items()}
    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
    safetensors_py.save_file(grads, path("grads"), meta)
    safetensors_py.save_file(buffers, path("after_forward"), meta)
    opt.step()
    safetensors_py.save_file({k: p.detach().clone() for k, p in params.items()}, path("after_step"), meta)
    model.eval()
    with torch.no_grad():
        logits_eval = model(x)
    io = {"input": x, "input_nhwc": x.permute(0, 2, 3, 1).contiguous(), "labels": labels,
          "logits": logits.detach(), "loss": loss.detach().reshape(()), "logits_eval_after_step": logits_eval}
    safetensors_py.save_file(io, path("io"), meta)
    return {"arch": arch, "loss": float(loss), "params": len(params), "buffers": len(buffers),
            "numel": sum(p.numel() for p in params.values())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--archs", default="resnet18,resnet50")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    os.makedirs(a.out_dir, exist_ok=True)
    for arch in a.archs.split(","):
        print(json.dumps(make(arch.strip(), a.out_dir, a.batch, a.size, a.num_classes, a.seed)))


if __name__ == "__main__":
    main()
