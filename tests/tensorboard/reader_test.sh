#!/usr/bin/env bash
# --tensorboard-dir end to end: 2-rank resnet18 (synthetic images, 2 epochs) and multinode (2 epochs) runs under
# ddprun write --metrics-file and --tensorboard-dir; check_events.py then reads each event directory with
# TensorBoard's own readers and finds every number of every metrics record at its global step (docs/ARCHITECTURE.md D40).
# Usage: reader_test.sh <ddprun> <resnet> <multinode> <check_events.py>
# Exit 77 (skipped) when /usr/bin/python3 has no tensorboard package.
# SPDX-License-Identifier: MIT
set -u
ddprun=$1 resnet=$2 multinode=$3 check=$4
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
  --metrics-file "$work/multinode.jsonl" --tensorboard-dir "$work/tb/multinode" || fail "multinode exited with $?"
echo "ok: multinode run"

/usr/bin/python3 "$check" "$work/tb/resnet" "$work/resnet.jsonl" loss lr samples_per_sec step_ms data_ms epoch ||
  fail "resnet event file"
/usr/bin/python3 "$check" "$work/tb/multinode" "$work/multinode.jsonl" loss lr samples_per_sec step_ms epoch ||
  fail "multinode event file"
