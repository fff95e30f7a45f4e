#!/usr/bin/python3
# Writes PyTorch reference data for the transformer modules (LayerNorm, GELU in both forms, Embedding), read by
# tests/interop/reference/test_transformer_ops.cpp. Dropout is not here: torch's mask comes from its own generator.
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_transformer_reference.py OUT_FILE      (exits 77 when torch is not importable)
#
# File format: reference_records.py's (records of name, kind, dims, values; float32 results stored exactly as
# float64). Tensors are row-major in torch's shapes, which are ddp's for these modules ((B, T, C) activations,
# (V, C) embedding weight). Names are "<case>/<tensor>"; "<op>/count" holds the number of cases of an op.
import math
import sys

from reference_records import Records, import_torch  # shared by these scripts

torch, F = import_torch(seed=4321)
records = Records()
put = records.put


# LayerNorm: (input shape, elementwise_affine, eps, input scale, input offset)
ln_cases = [
    ((2, 16, 64), True, 1e-5, 1.0, 0.0),
    ((7, 33), True, 1e-5, 2.0, 0.5),  # odd width, rows over 2 threads
    ((4, 8, 48), False, 1e-6, 1.0, 0.0),  # no weight or bias
    ((2, 4, 128), True, 1e-5, 3.0, 10.0),  # mean far from 0
]
for i, (shape, affine, eps, scale, offset) in enumerate(ln_cases):
    c = f"ln{i}"
    x = (torch.randn(*shape) * scale + offset).requires_grad_(True)
    ln = torch.nn.LayerNorm(shape[-1], eps=eps, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ln.weight.copy_(torch.randn(shape[-1]) * 0.5 + 1.0)
            ln.bias.copy_(torch.randn(shape[-1]) * 0.5)
        put(c + "/weight", ln.weight); put(c + "/bias", ln.bias)
    y = ln(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(c + "/x", x); put(c + "/y", y); put(c + "/dy", dy); put(c + "/dx", x.grad)
    put(c + "/eps", float(eps)); put(c + "/affine", int(affine))
    if affine:
        put(c + "/dweight", ln.weight.grad); put(c + "/dbias", ln.bias.grad)
put("ln/count", len(ln_cases))

# GELU, exact and tanh forms, on the same x and dy; "newgelu" is karpathy/minGPT's NewGELU written out.
x = (torch.randn(2, 16, 96) * 3).requires_grad_(True)
dy = torch.randn(2, 16, 96)
put("gelu/x", x); put("gelu/dy", dy)
for form in ["none", "tanh"]:
    x.grad = None
    y = F.gelu(x, approximate=form)
    y.backward(dy)
    put(f"gelu_{form}/y", y); put(f"gelu_{form}/dx", x.grad)
x.grad = None
y = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
y.backward(dy)
put("gelu_newgelu/y", y); put("gelu_newgelu/dx", x.grad)

# Embedding: (V, C, ids shape); ids drawn from a vocabulary a little smaller than V, so some rows get no gradient.
emb_cases = [(65, 32, (4, 16)), (50, 128, (8, 32)), (11, 7, (40,))]
for i, (v, ch, ids_shape) in enumerate(emb_cases):
    c = f"emb{i}"
    emb = torch.nn.Embedding(v, ch)
    ids = torch.randint(0, v - 2, ids_shape)
    y = emb(ids)
    dy = torch.randn_like(y)
    y.backward(dy)
    put(c + "/weight", emb.weight); put(c + "/ids", ids); put(c + "/y", y); put(c + "/dy", dy)
    put(c + "/dweight", emb.weight.grad)
put("emb/count", len(emb_cases))

records.write(sys.argv[1])
