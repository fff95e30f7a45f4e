#!/usr/bin/python3
# The guide's first program under two launchers: examples/custom_model (C++) and its PyTorch twin (twin.py), each
# on 2 processes under ddprun and under torchrun, on scikit-learn's digits exported by
# tests/interop/reference/digits_to_cifar_format.py. Each run must print every epoch, evaluate the whole test set (359
# images, split over the ranks) and end at a test accuracy of at least BOUND. Chance is 0.1; a model whose layers
# start at zero stays near it (only the last bias learns).
# Usage: custom_model_tests.py {ddp,twin} {ddprun,torchrun} --ddprun PATH --program PATH --twin PATH
# Exit 0 pass, 1 fail, 77 skip (no torch, no sklearn).
# SPDX-License-Identifier: MIT
import argparse
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from driver import PY, SKIP, Skip, expect, free_port, run  # noqa: E402

EXPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interop", "reference", "digits_to_cifar_format.py")
EPOCHS = 3
BOUND = 0.9  # both programs reach 0.96-0.99 after 3 epochs (examples/custom_model/README.md)
EPOCH_LINE = re.compile(r"epoch (\d+) test accuracy ([0-9.]+) \((\d+)/(\d+)\) train time ([0-9.e+-]+) s$")


def export_digits(tmp):
    rc, out, err = run([PY, "-c", "import sklearn.datasets"], timeout=60)
    if rc != 0:
        raise Skip("/usr/bin/python3 has no scikit-learn (install python3-sklearn)")
    data = os.path.join(tmp, "digits")
    rc, out, err = run([PY, EXPORT, data], timeout=60)
    expect(rc == 0, f"{EXPORT} rc={rc}", out, err)
    with open(os.path.join(data, "digits_meta.json")) as f:
        return data, json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("program", choices=["ddp", "twin"])
    ap.add_argument("launcher", choices=["ddprun", "torchrun"])
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--program", dest="binary", required=True)
    ap.add_argument("--twin", required=True)
    a = ap.parse_args()
    try:
        if a.program == "twin" or a.launcher == "torchrun":
            rc, _, _ = run([PY, "-c", "import torch.distributed.run"], timeout=60)
            if rc != 0:
                raise Skip("/usr/bin/python3 has no torch.distributed.run (install python3-torch)")
        with tempfile.TemporaryDirectory() as tmp:
            data, meta = export_digits(tmp)
            prog = [a.binary] if a.program == "ddp" else [PY, a.twin]
            flags = ["--data-dir", data, "--epochs", str(EPOCHS), "--seed", "0"]
            if a.launcher == "ddprun":
                cmd = [a.ddprun, "--nproc-per-node", "2", "--standalone"] + prog + flags
            else:  # torchrun runs the binary itself (--no-python) or the script with its own interpreter
                cmd = [PY, "-m", "torch.distributed.run", "--redirects", "9:1", "--tee", "9:1", "--log_dir",
                       os.path.join(tmp, "logs"), "--nproc_per_node=2", f"--master_port={free_port()}"]
                cmd += (["--no_python"] + prog if a.program == "ddp" else [a.twin]) + flags
            rc, out, err = run(cmd, timeout=120)
        expect(rc == 0, f"rc={rc}: {cmd}", out, err)
        epochs = [m.groups() for m in map(EPOCH_LINE.search, out.splitlines()) if m]
        expect([int(e[0]) for e in epochs] == list(range(EPOCHS)), f"expected epochs 0..{EPOCHS - 1} once each",
               out, err)
        for epoch, acc, correct, total, secs in epochs:
            expect(int(total) == meta["test"], f"epoch {epoch} evaluated {total} images, not the whole test set "
                   f"({meta['test']})", out)
            expect(abs(float(acc) - int(correct) / int(total)) < 1e-5, f"epoch {epoch}: accuracy {acc} is not "
                   f"{correct}/{total}", out)
        final = float(epochs[-1][1])
        expect(final >= BOUND, f"final test accuracy {final} < {BOUND}", out, err)
        print(f"{a.program} under {a.launcher}: test accuracy by epoch {[float(e[1]) for e in epochs]}, "
              f"train time {[float(e[4]) for e in epochs]} s")
    except Skip as e:
        print(f"skipped: {e}")
        return SKIP
    except AssertionError as e:
        print(f"FAILED {a.program} {a.launcher}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
