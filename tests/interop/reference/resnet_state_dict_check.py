#!/usr/bin/python3
"""Load a safetensors state dict into torchvision's model (strict) and compare its logits with a reference.

Usage: resnet_state_dict_check.py ARCH NUM_CLASSES STATE_DICT IO_FILE [--mode train|eval] [--key logits]
Reads STATE_DICT with tests/interop/reference/safetensors_py.py (the file ddp wrote), calls
model.load_state_dict(..., strict=True), runs the forward on IO_FILE's "input" (NCHW) in the given mode and
prints {"max_abs": ..., "max_rel": ..., "missing": [], "unexpected": []} as JSON; exits 1 when the
relative error (max |a-b| / max |b|) exceeds 1e-5 or keys do not match.
"""
import argparse
import json
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_py  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arch")
    ap.add_argument("num_classes", type=int)
    ap.add_argument("state_dict")
    ap.add_argument("io")
    ap.add_argument("--mode", default="train", choices=["train", "eval"])
    ap.add_argument("--key", default="logits")
    a = ap.parse_args()
    model = getattr(torchvision.models, a.arch)(num_classes=a.num_classes)
    result = model.load_state_dict(safetensors_py.load_file(a.state_dict), strict=False)
    io = safetensors_py.load_file(a.io)
    model.train(a.mode == "train")
    with torch.no_grad():
        logits = model(io["input"])
    ref = io[a.key]
    max_abs = float((logits - ref).abs().max())
    max_rel = max_abs / max(float(ref.abs().max()), 1e-30)
    out = {"max_abs": max_abs, "max_rel": max_rel, "missing": result.missing_keys, "unexpected": result.unexpected_keys}
    print(json.dumps(out))
    return 0 if max_rel <= 1e-5 and not result.missing_keys and not result.unexpected_keys else 1


if __name__ == "__main__":
    sys.exit(main())
