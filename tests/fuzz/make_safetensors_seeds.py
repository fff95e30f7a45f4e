#!/usr/bin/env python3
# Writes the seed corpus of fuzz_safetensors_header (tests/fuzz/corpus/fuzz_safetensors_header/): small
# valid safetensors files (every dtype, scalars, empty tensors, metadata, a ddp snapshot of the fuzzer's
# Linear(3, 2) model) and a few typical defects. Standard library only; rerun after changing it:
#   python3 tests/fuzz/make_safetensors_seeds.py
# SPDX-License-Identifier: MIT
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "fuzz_safetensors_header")
SIZES = {"F32": 4, "F64": 8, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1}


def header_bytes(header):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # padded so that 8 + N is a multiple of 8, as writers do
    return struct.pack("<Q", len(h)) + h


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape); data bytes are 0, 1, 2, ... mod 251."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((len(data) + i) % 251 for i in range(n))
    return header_bytes(header) + data


def write(name, blob):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(blob)


os.makedirs(OUT, exist_ok=True)
write("valid_empty", safetensors([]))
write("valid_fc", safetensors([("fc.bias", "F32", [10]), ("fc.weight", "F32", [10, 4])], {"epoch": "3"}))
write("valid_all_dtypes", safetensors([(f"t_{d.lower()}", d, [2, 3]) for d in SIZES]))
write("valid_scalar_and_empty", safetensors([("empty", "F32", [0, 3]), ("scalar", "I64", []), ("u8", "U8", [5])]))
# A ddp snapshot of nn::Linear(3, 2) + SGD with momentum, as load_snapshot_bytes expects (no ddp.data_hash,
# which is optional, as in files written before it existed).
snapshot_meta = {"ddp.kind": "snapshot", "ddp.model": "Linear(in_features=3, out_features=2, bias=True)",
                 "epoch": "2", "optimizer.lr": "0.1", "optimizer.steps": "7", "rng.seed": "42", "rng.rank": "0",
                 "rng.stream": "1", "rng.offset": "1024", "user.note": "seed"}
write("valid_snapshot_linear", safetensors([("weight", "F32", [2, 3]), ("bias", "F32", [2]),
                                            ("optimizer.momentum_buffer.weight", "F32", [2, 3]),
                                            ("optimizer.momentum_buffer.bias", "F32", [2])], snapshot_meta))
write("valid_state_dict_linear", safetensors([("weight", "F32", [2, 3]), ("bias", "F32", [2])],
                                             {"ddp.kind": "state_dict"}))
# Defects: each must be an IoError naming the problem.
fc = safetensors([("fc.bias", "F32", [10]), ("fc.weight", "F32", [10, 4])])
write("bad_truncated", fc[:-7])
write("bad_trailing", fc + b"\0" * 8)
write("bad_forged_length", struct.pack("<Q", 0xFFFFFFFFFFFFFF00) + fc[8:])
write("bad_length_past_end", struct.pack("<Q", len(fc)) + fc[8:])
dup = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}'
write("bad_duplicate", struct.pack("<Q", len(dup)) + dup + b"xy")
write("bad_overlap", header_bytes({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                   "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}) + b"abc")
write("bad_huge_shape", header_bytes({"a": {"dtype": "F64", "shape": [4294967296, 4294967296],
                                            "data_offsets": [0, 8]}}) + b"\0" * 8)
