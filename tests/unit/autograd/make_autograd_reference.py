#!/usr/bin/python3
# Writes what torch.autograd computes for every op of ddp::autograd (forward value and input gradients, float64),
# read by tests/unit/autograd/test_torch_reference.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_autograd_reference.py OUT_FILE      (exits 77 when torch is not importable)
#
# File format: tests/interop/reference/reference_records.py's. Per case "<case>/in<k>" (inputs), "<case>/seed" (the
# gradient fed to backward, the output's shape), "<case>/out" and "<case>/grad<k>"; "<case>/idx" holds int64
# indices or targets where the op takes them. "cases" lists the case names in order (as int64 code points,
# separated by 10).
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interop", "reference"))
from reference_records import Records, import_torch  # noqa: E402

torch, F = import_torch(seed=4171)
torch.set_default_dtype(torch.float64)
records = Records()
names = []


def case(name, shapes, fn, lo=-1.0, hi=1.0, idx=None):
    xs = [(torch.rand(s) * (hi - lo) + lo).requires_grad_(True) for s in shapes]
    out = fn(*xs) if idx is None else fn(*xs, idx)
    seed = torch.randn(out.shape)
    out.backward(seed)
    for k, x in enumerate(xs):
        records.put(f"{name}/in{k}", x)
        records.put(f"{name}/grad{k}", x.grad)
    records.put(f"{name}/seed", seed.reshape(out.shape))
    records.put(f"{name}/out", out)
    if idx is not None:
        records.put(f"{name}/idx", idx)
    names.append(name)


case("add", [(3, 1, 4), (2, 1)], lambda a, b: a + b)
case("sub", [(4,), (2, 3, 4)], lambda a, b: a - b)
case("mul", [(2, 3, 1), (1, 3, 5)], lambda a, b: a * b)
case("div", [(3, 4), (4,)], lambda a, b: a / b, lo=0.5, hi=2.0)
case("scalar", [(2, 3)], lambda a: (2.0 * a + 1.0) / 3.0 - (1.0 - a) * 0.5 + 1.0 / (a + 3.0))
case("neg", [(2, 3)], lambda a: -a)
case("exp", [(2, 3)], torch.exp)
case("log", [(2, 3)], torch.log, lo=0.2, hi=3.0)
case("pow", [(2, 3)], lambda a: a ** 2.5, lo=0.2, hi=3.0)
case("sqrt", [(2, 3)], torch.sqrt, lo=0.2, hi=3.0)
case("rsqrt", [(2, 3)], torch.rsqrt, lo=0.2, hi=3.0)
case("abs", [(2, 3)], torch.abs)
case("clamp", [(3, 4)], lambda a: torch.clamp(a, -0.3, 0.4))
case("relu", [(3, 4)], F.relu)
case("gelu", [(3, 4)], F.gelu, lo=-3, hi=3)
case("gelu_tanh", [(3, 4)], lambda a: F.gelu(a, approximate="tanh"), lo=-3, hi=3)
case("silu", [(3, 4)], F.silu, lo=-3, hi=3)
case("tanh", [(3, 4)], torch.tanh, lo=-2, hi=2)
case("sigmoid", [(3, 4)], torch.sigmoid, lo=-3, hi=3)
case("mish", [(3, 4)], F.mish, lo=-3, hi=3)
case("sum_all", [(2, 3, 4)], torch.sum)
case("sum_dims", [(2, 3, 4)], lambda a: a.sum(dim=(0, 2), keepdim=True))
case("mean_dim", [(2, 3, 4)], lambda a: a.mean(dim=1))
case("mean_all", [(2, 3, 4)], torch.mean)
case("max_dim", [(3, 5, 2)], lambda a: a.max(dim=1).values)
case("matmul", [(3, 4), (4, 2)], torch.matmul)
case("matmul_bcast", [(2, 1, 3, 4), (3, 4, 2)], torch.matmul)
case("linear", [(2, 5, 3), (4, 3), (4,)], F.linear)
case("reshape", [(2, 3, 2)], lambda a: a.reshape(3, 4))
case("transpose", [(2, 3, 4)], lambda a: a.transpose(0, 2))
case("permute", [(2, 3, 4, 1)], lambda a: a.permute(2, 0, 3, 1))
case("narrow", [(3, 5, 2)], lambda a: a.narrow(1, 1, 3))
case("concat", [(2, 1, 3), (2, 4, 3)], lambda a, b: torch.cat([a, b], dim=1))
case("split", [(5, 2)], lambda a: torch.cat([a.split([2, 3], dim=0)[1] * 2.0, a.split([2, 3], dim=0)[0]], dim=0))
case("index_select", [(3, 4, 2)], lambda a, i: a.index_select(1, i), idx=torch.tensor([2, 0, 2, 3, 2]))
case("softmax", [(3, 2, 4)], lambda a: F.softmax(a, dim=1), lo=-2, hi=2)
case("log_softmax", [(3, 5)], lambda a: F.log_softmax(a, dim=-1), lo=-2, hi=2)
case("cross_entropy", [(4, 5)], lambda a, t: F.cross_entropy(a, t), lo=-2, hi=2, idx=torch.tensor([2, 0, 4, 2]))
case("cross_entropy_smooth", [(4, 5)], lambda a, t: F.cross_entropy(a, t, label_smoothing=0.1), lo=-2, hi=2,
     idx=torch.tensor([1, 3, 3, 0]))
case("mse_loss", [(3, 4), (3, 4)], F.mse_loss)
case("mlp", [(4, 3), (5, 3), (5,), (2, 5)],  # a small model: linear, gelu, linear, log_softmax, a weight reused
     lambda x, w1, b1, w2, t: F.cross_entropy(F.linear(F.gelu(F.linear(x, w1, b1)), w2) + (w1 * w1).sum(), t),
     idx=torch.tensor([0, 1, 1, 0]))
case("embedding", [(6, 3)], lambda w, i: F.embedding(i, w), idx=torch.tensor([[1, 5, 1], [0, 1, 2]]))
case("layer_norm", [(2, 3, 5), (5,), (5,)], lambda x, w, b: F.layer_norm(x, (5,), w, b, eps=1e-5), lo=-2, hi=2)
case("layer_norm_plain", [(4, 6)], lambda x: F.layer_norm(x, (6,), eps=1e-6) * 1.0, lo=-2, hi=2)


def causal_attention(qkv, n_head):  # minGPT's CausalSelfAttention core, written out (no F.scaled_dot_product_attention in 1.13)
    b, t, c3 = qkv.shape
    c = c3 // 3
    q, k, v = (u.reshape(b, t, n_head, c // n_head).transpose(1, 2) for u in qkv.split(c, dim=2))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // n_head))
    att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)


case("causal_attention", [(2, 5, 24)], lambda a: causal_attention(a, 2), lo=-2, hi=2)
# NHWC activations and KRSC weights (ddp's layout); torch runs on the NCHW / OIHW permutations.
nchw = lambda t: t.permute(0, 3, 1, 2)  # noqa: E731
nhwc = lambda t: t.permute(0, 2, 3, 1)  # noqa: E731
case("conv2d", [(2, 5, 6, 3), (4, 3, 2, 3), (4,)],
     lambda x, w, b: nhwc(F.conv2d(nchw(x), nchw(w), b, stride=(2, 1), padding=(1, 0), dilation=(1, 2))))
case("conv2d_nobias", [(1, 4, 4, 2), (3, 3, 3, 2)], lambda x, w: nhwc(F.conv2d(nchw(x), nchw(w), padding=1)))
case("max_pool2d", [(2, 5, 5, 3)], lambda x: nhwc(F.max_pool2d(nchw(x), 3, 2, 1)))
case("adaptive_avg_pool2d", [(2, 5, 7, 3)], lambda x: nhwc(F.adaptive_avg_pool2d(nchw(x), (2, 3))))
case("batch_norm", [(4, 3, 2, 5), (5,), (5,)],
     lambda x, w, b: nhwc(F.batch_norm(nchw(x), torch.zeros(5), torch.ones(5), w, b, training=True, momentum=0.1,
                                       eps=1e-5)), lo=-2, hi=3)
records.put("cases", torch.tensor([ord(c) for c in "\n".join(names)]))
records.write(sys.argv[1])
