#!/usr/bin/python3
# Writes PyTorch reference data for every ddp CPU kernel to one file, read by tests/interop/reference/test_torch_ops.cpp.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_op_reference.py OUT_FILE      (exits 77 when torch is not importable)
#
# File format: reference_records.py's (name, kind, dims, values per record; float32 results stored exactly as
# float64). Tensors keep PyTorch's
# layouts (NCHW activations, OIHW weights); the C++ test converts them to NHWC / KRSC. Names are
# "<case>/<tensor>", e.g. "conv3/dw"; "<op>/count" holds the number of cases of an op.
import sys

from reference_records import Records, import_torch  # shared by these scripts

torch, F = import_torch(seed=1234)
records = Records()
put = records.put


def leaf(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_(True)


# conv2d: (N, C_in, H, W, C_out, (kh, kw), stride, padding, dilation, bias)
conv_cases = [
    (2, 3, 7, 9, 4, (3, 3), (1, 1), (1, 1), (1, 1), True),
    (2, 5, 8, 6, 3, (3, 3), (2, 2), (1, 1), (1, 1), False),
    (1, 4, 9, 9, 6, (1, 1), (1, 1), (0, 0), (1, 1), False),  # pointwise: one GEMM
    (2, 4, 9, 7, 5, (1, 1), (2, 2), (0, 0), (1, 1), False),  # ResNet downsample
    (2, 3, 11, 10, 4, (7, 7), (2, 2), (3, 3), (1, 1), False),  # ResNet stem
    (2, 3, 9, 9, 2, (3, 2), (1, 2), (2, 1), (2, 1), True),  # dilation, non-square everything
    (3, 2, 5, 5, 3, (3, 3), (1, 1), (0, 0), (1, 1), False),  # odd batch over 2 threads
]
for i, (n, ci, h, w, co, k, s, p, d, bias) in enumerate(conv_cases):
    x, wt = leaf(n, ci, h, w), leaf(co, ci, *k, scale=0.3)
    b = leaf(co) if bias else None
    y = F.conv2d(x, wt, b, stride=s, padding=p, dilation=d)
    dy = torch.randn_like(y)
    y.backward(dy)
    c = f"conv{i}"
    put(c + "/x", x); put(c + "/w", wt); put(c + "/y", y); put(c + "/dy", dy); put(c + "/dx", x.grad)
    put(c + "/dw", wt.grad); put(c + "/stride", list(s)); put(c + "/padding", list(p)); put(c + "/dilation", list(d))
    if bias:
        put(c + "/bias", b); put(c + "/dbias", b.grad)
put("conv/count", len(conv_cases))

# batchnorm: shape (NCHW or NC), training flag
bn_cases = [((4, 3, 5, 6), True), ((2, 5, 3, 3), True), ((8, 4), True), ((3, 4, 2, 5), False), ((3, 3, 1, 1), True)]  # last: M = 3 per channel
for i, (shape, training) in enumerate(bn_cases):
    ch = shape[1]
    x = (torch.randn(*shape) * 2 + 0.5).requires_grad_(True)
    g, b = leaf(ch), leaf(ch)
    rm, rv = torch.randn(ch), torch.rand(ch) + 0.5
    c = f"bn{i}"
    put(c + "/x", x); put(c + "/gamma", g); put(c + "/beta", b); put(c + "/running_mean_in", rm)
    put(c + "/running_var_in", rv); put(c + "/training", int(training))
    y = F.batch_norm(x, rm, rv, g, b, training=training, momentum=0.1, eps=1e-5)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(c + "/y", y); put(c + "/dy", dy); put(c + "/dx", x.grad); put(c + "/dgamma", g.grad); put(c + "/dbeta", b.grad)
    put(c + "/running_mean", rm); put(c + "/running_var", rv)
put("bn/count", len(bn_cases))

# max-pool: shape, kernel, stride, padding
mp_cases = [((2, 3, 9, 11), (3, 3), (2, 2), (1, 1)), ((2, 2, 8, 8), (2, 2), (2, 2), (0, 0)),
            ((1, 3, 7, 7), (3, 3), (1, 1), (1, 1)), ((2, 2, 10, 9), (3, 2), (2, 1), (1, 0))]
for i, (shape, k, s, p) in enumerate(mp_cases):
    x = leaf(*shape)
    y = F.max_pool2d(x, k, s, p)
    dy = torch.randn_like(y)
    y.backward(dy)
    c = f"maxpool{i}"
    put(c + "/x", x); put(c + "/y", y); put(c + "/dy", dy); put(c + "/dx", x.grad)
    put(c + "/kernel", list(k)); put(c + "/stride", list(s)); put(c + "/padding", list(p))
put("maxpool/count", len(mp_cases))

# adaptive average pool: shape, output size
ap_cases = [((2, 3, 7, 7), (1, 1)), ((2, 2, 9, 7), (3, 2)), ((1, 3, 5, 5), (3, 3)), ((2, 2, 4, 6), (4, 6))]
for i, (shape, out) in enumerate(ap_cases):
    x = leaf(*shape)
    y = F.adaptive_avg_pool2d(x, out)
    dy = torch.randn_like(y)
    y.backward(dy)
    c = f"avgpool{i}"
    put(c + "/x", x); put(c + "/y", y); put(c + "/dy", dy); put(c + "/dx", x.grad)
put("avgpool/count", len(ap_cases))

# linear: N, in, out, bias
lin_cases = [(5, 7, 3, True), (4, 6, 2, False), (16, 64, 10, True)]
for i, (n, fin, fout, bias) in enumerate(lin_cases):
    x, w = leaf(n, fin), leaf(fout, fin, scale=0.3)
    b = leaf(fout) if bias else None
    y = F.linear(x, w, b)
    dy = torch.randn_like(y)
    y.backward(dy)
    c = f"linear{i}"
    put(c + "/x", x); put(c + "/w", w); put(c + "/y", y); put(c + "/dy", dy); put(c + "/dx", x.grad)
    put(c + "/dw", w.grad)
    if bias:
        put(c + "/bias", b); put(c + "/dbias", b.grad)
put("linear/count", len(lin_cases))

# relu
x = leaf(3, 4, 5)
y = F.relu(x)
dy = torch.randn_like(y)
y.backward(dy)
put("relu0/x", x); put("relu0/y", y); put("relu0/dy", dy); put("relu0/dx", x.grad)

# cross-entropy: N, C, label smoothing
ce_cases = [(6, 5, 0.0), (6, 5, 0.1), (4, 10, 0.3), (3, 2, 0.0)]
for i, (n, cl, ls) in enumerate(ce_cases):
    z = leaf(n, cl, scale=3.0)
    labels = torch.randint(0, cl, (n,))
    loss = F.cross_entropy(z, labels, label_smoothing=ls)
    loss.backward()
    c = f"ce{i}"
    put(c + "/logits", z); put(c + "/labels", labels); put(c + "/smoothing", float(ls)); put(c + "/loss", loss)
    put(c + "/dlogits", z.grad)
put("ce/count", len(ce_cases))

# mse
x, t = leaf(3, 4), torch.randn(3, 4)
loss = F.mse_loss(x, t)
loss.backward()
put("mse0/x", x); put("mse0/target", t); put("mse0/loss", loss); put("mse0/dx", x.grad)

# SGD: a few steps of torch.optim.SGD; grads are given, params after each step recorded
sgd_cases = [dict(lr=0.1), dict(lr=0.1, momentum=0.9), dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2),
             dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4), dict(lr=0.01, weight_decay=0.1)]
steps = 4
for i, cfg in enumerate(sgd_cases):
    p = torch.nn.Parameter(torch.randn(13))
    c = f"sgd{i}"
    put(c + "/param0", p)
    opt = torch.optim.SGD([p], **cfg)
    for k in ["lr", "momentum", "dampening", "weight_decay"]:
        put(c + "/" + k, float(cfg.get(k, 0.0)))
    put(c + "/nesterov", int(cfg.get("nesterov", False)))
    for s in range(steps):
        g = torch.randn(13)
        p.grad = g.clone()
        opt.step()
        put(f"{c}/grad{s}", g); put(f"{c}/param{s + 1}", p)
    put(c + "/steps", steps)
put("sgd/count", len(sgd_cases))

records.write(sys.argv[1])
