#!/usr/bin/python3
# Writes numpy/PyTorch reference conversions for ddp::half and ddp::bfloat16 (tests/interop/reference/test_torch_ops.cpp).
# SPDX-License-Identifier: MIT
#
# Usage: /usr/bin/python3 make_dtype_reference.py OUT_FILE      (exits 77 without numpy and torch)
# Same record format as make_op_reference.py (int64 records only):
#   half_bits/in, half_bits/f32     every binary16 pattern and the float32 bits numpy widens it to
#   bf16_bits/in, bf16_bits/f32     every bfloat16 pattern and the float32 bits torch widens it to
#   f32/in, f32/half, f32/bf16      float32 bit patterns (random, every exponent with the rounding-tie,
#                                   tie +- 1 ulp and subnormal cases, inf, NaN, max) and the binary16
#                                   (numpy astype float16) and bfloat16 (torch .to(bfloat16)) bits they round to
import struct
import sys

try:
    import numpy as np
    import torch
except Exception as e:  # pragma: no cover
    print(f"SKIP: numpy/torch not importable by {sys.executable} ({e}); install python3-numpy python3-torch")
    sys.exit(77)

rng = np.random.default_rng(7)
records = []


def put(name, arr):
    arr = np.asarray(arr, dtype=np.int64).ravel()
    b = name.encode()
    records.append(struct.pack("<I", len(b)) + b + struct.pack("<BIq", 1, 1, arr.size) + arr.astype("<i8").tobytes())


h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
put("half_bits/in", h)
put("half_bits/f32", h.view(np.float16).astype(np.float32).view(np.uint32))
bf = torch.from_numpy(h.astype(np.int16)).view(torch.bfloat16)
put("bf16_bits/in", h)
put("bf16_bits/f32", bf.to(torch.float32).view(torch.int32).numpy().view(np.uint32))

parts = [rng.integers(0, 2**32, size=400000, dtype=np.uint64).astype(np.uint32)]
sign = np.array([0, 0x80000000], dtype=np.uint32)
exps = np.arange(256, dtype=np.uint32) << 23
lows = [0x1000, 0x0FFF, 0x1001, 0x0000, 0x1FFF, 0x8000, 0x7FFF, 0x8001, 0x18000, 0x10000]
for low in lows:
    hi = rng.integers(0, 2**23, size=(2, 256, 8), dtype=np.uint64).astype(np.uint32)
    for mask in (0x7FE000, 0x7F0000):  # keep high mantissa bits, set the low pattern
        m = (hi & mask) | np.uint32(low & 0x7FFFFF)
        parts.append((sign[:, None, None] | exps[None, :, None] | m).ravel())
# exact half subnormal boundaries and every half value's float32 neighbours +- 1 ulp
hv = h.view(np.float16).astype(np.float32).view(np.uint32)
parts += [hv, hv + 1, hv - 1, hv + 0x1000, hv + 0xFFF, hv + 0x1001]
parts.append(np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00001, 0x7F7FFFFF, 0x477FE000,
                       0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001, 0x32FFFFFF, 0x38800000, 0x387FFFFF,
                       0x00000001, 0x80000000, 0], dtype=np.uint32))
f = np.concatenate(parts).astype(np.uint32)
with np.errstate(over="ignore", invalid="ignore"):
    half = f.view(np.float32).astype(np.float16).view(np.uint16)
b16 = torch.from_numpy(f.view(np.int32).copy()).view(torch.float32).to(torch.bfloat16).view(torch.int16).numpy()
put("f32/in", f)
put("f32/half", half)
put("f32/bf16", b16.view(np.uint16))

with open(sys.argv[1], "wb") as out:
    for r in records:
        out.write(r)
print(f"wrote {f.size} float32 patterns and 2 x 65536 16-bit patterns to {sys.argv[1]}")
