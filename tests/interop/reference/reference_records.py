"""The reference file the make_*_reference.py scripts write and tests/interop/reference/reference_file.hpp reads.

File format (little-endian), a sequence of records until end of file:
  u32 name_length, name (utf-8), u8 kind (0: float64 values, 1: int64 values), u32 rank, i64 dims[rank],
  then prod(dims) values of that kind.
Float tensors computed in float32 by PyTorch are stored exactly as float64; integer and bool tensors as int64; a
Python int or float becomes a one-element tensor, a list or tuple a tensor of its values.

    from reference_records import Records, import_torch   # the scripts' own directory is on sys.path
    torch, F = import_torch(seed=1234)     # exits 77 (ctest: skipped) when torch is missing
    out = Records()
    out.put("conv3/dw", w.grad)
    out.write(sys.argv[1])
SPDX-License-Identifier: MIT
"""
import struct
import sys


def import_torch(seed):
    """torch and torch.nn.functional, seeded, on one thread; exit 77 (skipped) when torch cannot be imported."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # pragma: no cover - depends on the machine
        print(f"SKIP: PyTorch is not importable by {sys.executable} ({e}); install python3-torch")
        sys.exit(77)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    return torch, F


class Records:
    def __init__(self):
        self.records = []

    def put(self, name, t):
        import torch  # imported by import_torch() before anything is put
        if isinstance(t, (list, tuple)):
            t = torch.tensor(t)
        elif isinstance(t, (int, float)):
            t = torch.tensor([t])
        t = t.detach().contiguous()
        if t.dtype in (torch.int64, torch.int32, torch.bool):
            kind, data = 1, t.to(torch.int64).flatten().tolist()
        else:
            kind, data = 0, t.to(torch.float64).flatten().tolist()
        b = name.encode()
        out = struct.pack("<I", len(b)) + b + struct.pack("<BI", kind, t.dim()) + struct.pack(f"<{t.dim()}q", *t.shape)
        out += struct.pack(f"<{len(data)}{'q' if kind else 'd'}", *data)
        self.records.append(out)

    def write(self, path):
        with open(path, "wb") as f:
            for r in self.records:
                f.write(r)
        print(f"wrote {len(self.records)} tensors to {path}")
