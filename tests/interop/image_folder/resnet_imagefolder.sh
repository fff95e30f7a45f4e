#!/bin/bash
# The resnet example on a generated ImageFolder tree: 2 ranks (torchrun's environment variables, launched
# by hand), --val_dir, --workers 2, one corrupt JPEG in the training tree. With --skip_bad_images the run
# finishes and reports top-1/top-5 over the whole validation set (12 images) and the skipped file by path;
# without it, the run fails with an error naming the file. The 2-rank run also writes --trace for steps 2..4 (an
# epoch boundary, with its evaluation and snapshot, in the middle): tests/integration/trace/check_trace.py checks it against the
# snapshot the run saved, and tools/plot_trace.py draws step 3 (a PNG that decodes and is not blank).
# Exit 77 when /usr/bin/python3 has no PIL/numpy.
# Usage: resnet_imagefolder.sh <resnet binary> <check_trace.py> <plot_trace.py>
# SPDX-License-Identifier: MIT
set -u
resnet=$1 check_trace=$2 plot_trace=$3
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" <<'PY' || exit $?
import os, sys
try:
    import numpy as np
    from PIL import Image
except Exception as e:
    print(f"SKIP: PIL/numpy not importable ({e})"); sys.exit(77)
root = sys.argv[1]
rng = np.random.default_rng(0)
for split, n in (("train", 8), ("val", 4)):
    for c, name in enumerate(["cat", "dog", "eel"]):
        d = f"{root}/{split}/{name}"
        os.makedirs(d)
        for i in range(n):
            h, w = rng.integers(40, 90, 2)
            base = np.zeros((h, w, 3)); base[..., c] = 200
            img = np.clip(base + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(f"{d}/{i}." + ("jpg" if i % 2 else "png"))
with open(f"{root}/train/cat/7.jpg", "wb") as f:
    f.write(b"\xff\xd8\xffgarbage")
PY
port=$((20000 + RANDOM % 20000))
args=(--backend=gloo --device cpu --data_dir "$work/train" --val_dir "$work/val" --image_size 32 --arch resnet18
      --width 16 --batch_size 4 --num_epochs 2 --threads 1 --workers 2 --model_dir "$work/models")
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0
traced=(--skip_bad_images --trace "$work/trace.json" --trace-steps 2:4 --bucket-cap-mb 0.1)  # several buckets
RANK=1 LOCAL_RANK=1 timeout 120 "$resnet" "${args[@]}" "${traced[@]}" >"$work/r1.log" 2>&1 &
RANK=0 LOCAL_RANK=0 timeout 120 "$resnet" "${args[@]}" "${traced[@]}" >"$work/r0.log" 2>&1
rc0=$?
wait
cat "$work/r0.log"
fail() { echo "FAIL: $*"; cat "$work/r1.log"; exit 1; }
[ $rc0 -eq 0 ] || fail "rank 0 exited $rc0"
grep -Eq "^epoch 1 test accuracy [0-9.e-]+ \([0-9]+/12\) top-5 [0-9.e-]+ \([0-9]+/12\)$" "$work/r0.log" || fail "no top-1/top-5 line over 12 validation images"
cat "$work/r0.log" "$work/r1.log" | grep -q "corrupt JPEG file '$work/train/cat/7.jpg'.*skipped" || fail "the skipped file was not reported"
/usr/bin/python3 "$check_trace" "$work/trace.json" "$work/models/resnet_distributed.safetensors" 2:4 2 ||
  fail "--trace file"
/usr/bin/python3 "$plot_trace" "$work/trace.json" --step 3 --out "$work/trace.png" || fail "plot_trace.py"
/usr/bin/python3 -c '
import sys
import matplotlib.image as mpimg
img = mpimg.imread(sys.argv[1])
print(f"ok: trace.png {img.shape[1]}x{img.shape[0]}, pixel std {float(img.std()):.3f}")
sys.exit(0 if img.shape[1] >= 800 and float(img.std()) > 0.01 else 1)' "$work/trace.png" || fail "trace.png is blank"
# Without --skip_bad_images: one process, an error naming the file, exit status 1.
MASTER_PORT=$((port + 1)) WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 timeout 120 "$resnet" "${args[@]}" >"$work/f.log" 2>&1
rc=$?
[ $rc -eq 1 ] || { cat "$work/f.log"; fail "expected exit 1 without --skip_bad_images, got $rc"; }
grep -q "corrupt JPEG file '$work/train/cat/7.jpg'" "$work/f.log" || { cat "$work/f.log"; fail "error does not name the file"; }
echo "PASS: ImageFolder training with --val_dir (top-1/top-5), bad-file handling and --trace"
