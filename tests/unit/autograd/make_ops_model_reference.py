#!/usr/bin/python3
# Writes what torch 1.13 computes for the three op-written models of tests/unit/autograd/ops_models.hpp (float64):
# their parameters, inputs, targets, the mean cross-entropy loss and every parameter's gradient. Read by
# tests/unit/autograd/test_ops_models.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_ops_model_reference.py OUT_FILE      (exits 77 when torch is not importable)
#
# File format: tests/interop/reference/reference_records.py's. Per model m: "m/p/<name>" (parameter values in ddp's
# layout: conv weights KRSC), "m/g/<name>" (their gradients, same layout), "m/x" (input: NHWC images, features or
# int64 token ids), "m/t" (int64 targets), "m/loss"; "m/names" lists the parameter names (code points, separated
# by 10) in the model's parameters() order.
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interop", "reference"))
from reference_records import Records, import_torch  # noqa: E402

torch, F = import_torch(seed=4176)
torch.set_default_dtype(torch.float64)
records = Records()


def params(shapes, scale=0.4):
    return {k: (torch.rand(s) * 2 - 1).mul_(scale).requires_grad_(True) for k, s in shapes}


def conv(x, p, name):  # x NHWC, weight KRSC
    w, b = p[name + ".weight"], p[name + ".bias"]
    return F.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), b, padding=1).permute(0, 2, 3, 1)


def lin(x, p, name):
    return F.linear(x, p[name + ".weight"], p.get(name + ".bias"))


def emit(model, shapes, p, x, t, logits):
    loss = F.cross_entropy(logits, t)
    loss.backward()
    for k, _ in shapes:
        records.put(f"{model}/p/{k}", p[k])
        records.put(f"{model}/g/{k}", p[k].grad)
    records.put(f"{model}/x", x)
    records.put(f"{model}/t", t)
    records.put(f"{model}/loss", loss)
    records.put(f"{model}/names", torch.tensor([ord(c) for c in "\n".join(k for k, _ in shapes)]))
    print(f"{model}: loss {loss.item():.6f}")


# ResCnn
shapes = [("stem.weight", (8, 3, 3, 3)), ("stem.bias", (8,)), ("block.conv1.weight", (8, 3, 3, 8)),
          ("block.conv1.bias", (8,)), ("block.conv2.weight", (8, 3, 3, 8)), ("block.conv2.bias", (8,)),
          ("fc.weight", (5, 8)), ("fc.bias", (5,))]
p = params(shapes)
x = torch.rand(4, 6, 6, 3) * 2 - 1
t = torch.tensor([0, 3, 4, 1])
h = F.relu(conv(x, p, "stem"))
h = F.relu(h + conv(F.relu(conv(h, p, "block.conv1")), p, "block.conv2"))
emit("rescnn", shapes, p, x, t, lin(h.mean(dim=(1, 2)), p, "fc"))

# SwiGluMlp
shapes = [("inp.weight", (8, 6)), ("inp.bias", (8,)), ("gate.weight", (16, 8)), ("up.weight", (16, 8)),
          ("down.weight", (8, 16)), ("head.weight", (5, 8)), ("head.bias", (5,))]
p = params(shapes)
x = torch.rand(6, 6) * 2 - 1
t = torch.tensor([0, 4, 2, 2, 1, 3])
h = lin(x, p, "inp")
h = h + lin(F.silu(lin(h, p, "gate")) * lin(h, p, "up"), p, "down")
emit("swiglu", shapes, p, x, t, lin(h, p, "head"))

# TinyGpt: the output projection is the input embedding's weight
V, L, C, H = 11, 5, 8, 2
shapes = [("wte", (V, C)), ("wpe", (L, C)), ("ln1.weight", (C,)), ("ln1.bias", (C,)), ("qkv.weight", (3 * C, C)),
          ("qkv.bias", (3 * C,)), ("proj.weight", (C, C)), ("proj.bias", (C,)), ("ln2.weight", (C,)),
          ("ln2.bias", (C,)), ("fc.weight", (4 * C, C)), ("fc.bias", (4 * C,)), ("fc_out.weight", (C, 4 * C)),
          ("fc_out.bias", (C,)), ("lnf.weight", (C,)), ("lnf.bias", (C,))]
p = params(shapes, scale=0.5)
for k in ("ln1.weight", "ln2.weight", "lnf.weight"):
    p[k] = (torch.rand(C) * 0.5 + 0.75).requires_grad_(True)
ids = torch.randint(0, V, (3, L))
t = torch.randint(0, V, (3 * L,))
n, hd = ids.shape[0], C // H
h = F.embedding(ids, p["wte"]) + p["wpe"][torch.arange(L)]


def ln(x, name):
    return F.layer_norm(x, (C,), p[name + ".weight"], p[name + ".bias"], eps=1e-5)


def heads(z):
    return z.reshape(n, L, H, hd).transpose(1, 2)


q, k, v = lin(ln(h, "ln1"), p, "qkv").split([C, C, C], dim=2)
mask = torch.triu(torch.full((L, L), -1e9), diagonal=1)
att = heads(q) @ heads(k).transpose(2, 3) * (1.0 / math.sqrt(hd)) + mask
y = F.softmax(att, dim=3) @ heads(v)
h = h + lin(y.transpose(1, 2).reshape(n, L, C), p, "proj")
h = h + lin(F.gelu(lin(ln(h, "ln2"), p, "fc")), p, "fc_out")
emit("tinygpt", shapes, p, ids, t, F.linear(ln(h, "lnf"), p["wte"]).reshape(n * L, V))

records.write(sys.argv[1])
