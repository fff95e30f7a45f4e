#!/usr/bin/python3
"""Minimal pure-Python safetensors reader/writer for torch tensors (no `safetensors` package needed).

Same format as huggingface/safetensors: u64 little-endian header length N, N bytes of JSON (padded with
spaces to a multiple of 8), then the raw little-endian tensor bytes. Used by the reference scripts and the
interop tests with Debian's /usr/bin/python3 + python3-torch, which has no safetensors package.

CLI (used by tests/unit/train interop checks):
  safetensors_py.py dump FILE        print {"metadata":..., "tensors": {name: [dtype, shape, sum, first]}} as JSON
  safetensors_py.py roundtrip IN OUT read IN, write every tensor times 2 (ints + 1) to OUT, metadata kept
"""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
          "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


def save_file(tensors, path, metadata=None):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_file(path, with_metadata=False):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out, base = {}, 8 + n
    for name, e in header.items():
        b, end = e["data_offsets"]
        buf = bytearray(data[base + b:base + end])
        t = torch.frombuffer(buf, dtype=DTYPES[e["dtype"]]) if buf else torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return (out, meta) if with_metadata else out


def _main(argv):
    if len(argv) == 3 and argv[1] == "dump":
        tensors, meta = load_file(argv[2], with_metadata=True)
        rep = {k: [NAMES[v.dtype], list(v.shape), float(v.double().sum()), v.flatten()[:4].double().tolist()]
               for k, v in tensors.items()}
        try:  # cross-check with the official package when it is importable (see docs: pip install --target)
            import safetensors.torch as official
        except ImportError:
            official = None
        if official is not None:
            ref = official.load_file(argv[2])
            assert ref.keys() == tensors.keys(), (sorted(ref), sorted(tensors))
            assert all(torch.equal(ref[k], tensors[k]) for k in ref), "official reader disagrees"
        print(json.dumps({"metadata": meta, "tensors": rep, "official": official is not None}, sort_keys=True))
        return 0
    if len(argv) == 4 and argv[1] == "roundtrip":
        tensors, meta = load_file(argv[2], with_metadata=True)
        out = {k: (v * 2 if v.is_floating_point() else v + 1) for k, v in tensors.items()}
        meta["python"] = "yes"
        save_file(out, argv[3], meta)
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
