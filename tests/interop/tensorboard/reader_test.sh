#!/usr/bin/env bash
# --tensorboard-dir end to end: 2-rank resnet18 (synthetic images, 2 epochs) and multinode (2 epochs) runs under
# ddprun write --metrics-file and --tensorboard-dir; check_events.py then reads each event directory with
# TensorBoard's own readers and finds every number of every metrics record at its global step (docs/decisions/0040).
# tools/plot_metrics.py then draws both metrics files: each chart a PNG that decodes, 800x450, not blank, with one
# point per metrics record (the multinode records carry no data_ms, so its step-time chart is skipped).
# The multinode run also writes --trace for steps 3..4, checked by tests/integration/trace/check_trace.py against its snapshot.
# Usage: reader_test.sh <ddprun> <resnet> <multinode> <check_events.py> <plot_metrics.py> <check_trace.py>
# Exit 77 (skipped) when /usr/bin/python3 has no tensorboard package.
# SPDX-License-Identifier: MIT
set -u
ddprun=$1 resnet=$2 multinode=$3 check=$4 plot=$5 check_trace=$6
if ! why=$(/usr/bin/python3 -c 'import tensorboard' 2>&1); then
  echo "skip: /usr/bin/python3 cannot import tensorboard (${why##*$'\n'}); install it with"
  echo "  /usr/bin/python3 -m pip install --break-system-packages tensorboard   (scripts/setup.sh does)"
  exit 77
fi
work=$(mktemp -d /tmp/ddp_tensorboard.XXXXXX)
trap 'rm -rf "$work"' EXIT
[ -n "${DDP_TB_TEST_KEEP:-}" ] && { trap - EXIT; echo "keeping $work"; }
cd "$work"
export DDP_TIMEOUT_MS=20000
fail() { echo "FAIL: $1"; cat "$work/out.log"; exit 1; }
launch() { timeout 120 "$ddprun" --nproc-per-node 2 --standalone "$@" > "$work/out.log" 2>&1; }

launch "$resnet" --backend gloo --use_syn --device cpu --arch resnet18 --width 8 --batch_size 4 --image_size 16 \
  --steps_syn 3 --num_classes 10 --threads 1 --num_epochs 2 --model_dir "$work/models" \
  --metrics-file "$work/resnet.jsonl" --tensorboard-dir "$work/tb/resnet" || fail "resnet exited with $?"
echo "ok: resnet run"
launch "$multinode" 2 1 --snapshot_path "$work/m.safetensors" --batch_size 256 \
  --metrics-file "$work/multinode.jsonl" --tensorboard-dir "$work/tb/multinode" \
  --trace "$work/multinode_trace.json" --trace-steps 3:4 || fail "multinode exited with $?"
echo "ok: multinode run"
/usr/bin/python3 "$check_trace" "$work/multinode_trace.json" "$work/m.safetensors" 3:4 2 || fail "multinode --trace file"

/usr/bin/python3 "$check" "$work/tb/resnet" "$work/resnet.jsonl" loss lr samples_per_sec step_ms data_ms comm_ms \
  comm_exposed_ms epoch || fail "resnet event file"
/usr/bin/python3 "$check" "$work/tb/multinode" "$work/multinode.jsonl" loss lr samples_per_sec step_ms comm_ms \
  comm_exposed_ms epoch || fail "multinode event file"

/usr/bin/python3 "$plot" --out "$work/plots" "$work/resnet.jsonl" "$work/multinode.jsonl" > "$work/plot.log" 2>&1 ||
  { cat "$work/plot.log"; fail "plot_metrics.py exited with $?"; }
/usr/bin/python3 - "$work" <<'PY' || { cat "$work/plot.log"; fail "plot_metrics.py charts"; }
import os, re, sys
import matplotlib.image as mpimg
work = sys.argv[1]
log = open(os.path.join(work, "plot.log")).read()
records = {s: sum(1 for line in open(os.path.join(work, s + ".jsonl")) if line.strip()) for s in ("resnet", "multinode")}
want = {f"{s}_{c}": records[s] for s in records for c in ("loss", "throughput")}
want["resnet_step_time"] = records["resnet"]
bad = []
for name, n in want.items():
    path = os.path.join(work, "plots", name + ".png")
    m = re.search(re.escape(path) + r": (\d+) points", log)
    if not m or int(m.group(1)) != n:
        bad.append(f"{name}: printed {m.group(1) if m else 'nothing'}, expected {n} points")
    if not os.path.exists(path):
        bad.append(f"{name}.png missing")
        continue
    img = mpimg.imread(path)
    if img.shape[:2] != (450, 800) or float(img.std()) < 0.01:
        bad.append(f"{name}.png: shape {img.shape}, pixel std {float(img.std()):.4f}")
if os.path.exists(os.path.join(work, "plots", "multinode_step_time.png")):
    bad.append("multinode_step_time.png drawn without data_ms")
print("\n".join(bad) if bad else f"ok: {len(want)} charts, {records} records")
sys.exit(1 if bad else 0)
PY
echo "ok: plot_metrics.py charts"
