#!/usr/bin/env bash
# The examples' optimizer flags (train/optim_flags.hpp) and the resnet example's evaluation on every rank, on
# tiny world-2 runs under ddprun or torchrun: each flag is used in one of a few runs, and the outcomes are
# checked, not just the exit code: finite losses, the learning rate of every step (warmup, cosine, multistep,
# step) read back from the metrics file, the gradient norm when clipping, one accuracy line per epoch over the
# whole test set, a resume that continues the schedule and refuses another --optimizer, and bad flag values
# that fail with a message naming the flag.
# Usage: examples_flags.sh ddprun|torch <ddprun> <multinode> <resnet> <tests/interop/reference dir>
# Exit 77 (skipped) when torchrun is not installed (torch mode).
# SPDX-License-Identifier: MIT
set -u
mode=$1 ddprun=$2 multinode=$3 resnet=$4 reference=$5
work=$(mktemp -d /tmp/ddp_examples_flags.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export DDP_TIMEOUT_MS=20000
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
fail() { echo "FAIL: $1"; cat "$work/out.log"; exit 1; }
[ -n "${DDP_FLAGS_TEST_KEEP:-}" ] && trap - EXIT
if [ "$mode" = torch ]; then
  /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || { echo "skip: no torchrun"; exit 77; }
fi
launch() {  # launch <program> <args...>: two ranks under the launcher of this mode
  if [ "$mode" = torch ]; then
    timeout 120 /usr/bin/python3 -m torch.distributed.run --redirects 9:1 --tee 9:1 --nproc_per_node=2 \
      --master_addr=127.0.0.1 --master_port="$(free_port)" --no_python "$@"
  else
    timeout 120 "$ddprun" --nproc-per-node 2 --standalone "$@"
  fi
}
run() {  # run <description> <command...>: must exit 0
  local what=$1; shift
  "$@" > "$work/out.log" 2>&1 || fail "$what exited with $?"
  echo "ok: $what"
}
# check <description> <python expression over `out` (the output) and `m` (metrics records)> [metrics file]
check() {
  /usr/bin/python3 - "$work/out.log" "${3:-}" "$2" <<'PY' || fail "$1"
import json, math, re, sys
out = open(sys.argv[1]).read()
m = [json.loads(l) for l in open(sys.argv[2])] if sys.argv[2] else []
losses = [float(x) for x in re.findall(r"\bloss (\S+)", out)]
acc = re.findall(r"epoch (\d+) test accuracy (\S+) \((\d+)/(\d+)\)", out)
def close(a, b): return abs(a - b) <= 1e-9 * max(1.0, abs(b))
def lrs(want): return len(m) == len(want) and all(close(r["lr"], w) for r, w in zip(m, want))
ok = eval(sys.argv[3])
if not ok:
    print("check failed:", sys.argv[3]); print("lr:", [r.get("lr") for r in m]); print("accuracy lines:", acc)
sys.exit(0 if ok else 1)
PY
  echo "ok: $1"
}

# A CIFAR-format data set (32x32x3): scikit-learn's digits, or random pixels without python3-sklearn. 25 training
# records in data_batch_1..5 (world 2, batch 4, drop_last: 3 steps per epoch) and 21 test records, an odd
# count, so the ranks' evaluation shares differ (11 and 10) and the total shows nothing was padded or lost.
/usr/bin/python3 - "$work/cifar" "$reference/digits_to_cifar_format.py" <<'PY' || { echo "FAIL: data set"; exit 1; }
import os, random, subprocess, sys
d, script = sys.argv[1], sys.argv[2]
rec = 1 + 3 * 32 * 32
os.makedirs(d)
try:
    subprocess.run([sys.executable, script, d + "/digits", "--size", "32", "--channels", "3"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    train = open(d + "/digits/digits_train.bin", "rb").read()
    test = open(d + "/digits/digits_test.bin", "rb").read()
except Exception:
    random.seed(0)
    records = lambda n: b"".join(bytes([i % 10]) + bytes(random.randrange(256) for _ in range(rec - 1)) for i in range(n))
    train, test = records(25), records(21)
for k in range(5):
    open(f"{d}/data_batch_{k + 1}.bin", "wb").write(train[5 * k * rec:5 * (k + 1) * rec])
open(f"{d}/test_batch.bin", "wb").write(test[:21 * rec])
PY

cifar=(--data_dir "$work/cifar" --device cpu --arch resnet18 --width 8 --batch_size 4 --num_classes 10 --threads 1
       --backend gloo --model_dir "$work/models" --learning_rate 0.003)
adamw=(--optimizer adamw --weight-decay 0.05 --clip-grad-norm 1 --lr-schedule cosine --warmup-epochs 1 --sync-bn
       --zero --comm-hook powersgd --powersgd-rank 2 --powersgd-start-iter 2)
# 3 steps per epoch: warmup over steps 0-2 from lr/3, then cosine over the remaining 3 steps (2 epochs) or 6 (3).
cos() { python3 -c "import math; print(0.003 * (1 + math.cos(math.pi * $1 / $2)) / 2)"; }
run "resnet: adamw, weight decay, clipping, cosine + warmup, sync-bn, zero, powersgd, evaluation" \
  launch "$resnet" "${cifar[@]}" "${adamw[@]}" --num_epochs 2 --metrics-file "$work/a.jsonl"
check "resnet: finite losses" "len(losses) == 6 and all(math.isfinite(x) for x in losses)"
check "resnet: one accuracy line per epoch, over all 21 test samples" \
  "[(e, n) for e, _, _, n in acc] == [('0', '21'), ('1', '21')] and out.count('test accuracy') == 2"
check "resnet: warmup then cosine, per step" "lrs([0.001, 0.003 * 5 / 9, 0.003 * 7 / 9, 0.003, $(cos 1 3), $(cos 2 3)])" "$work/a.jsonl"
check "resnet: gradient norm with --clip-grad-norm" "all(math.isfinite(r['grad_norm']) and r['grad_norm'] > 0 for r in m)" "$work/a.jsonl"
if [ "$mode" = ddprun ]; then  # resuming works the same under any launcher: once is enough
  run "resnet: --resume an adamw snapshot" \
    launch "$resnet" "${cifar[@]}" "${adamw[@]}" --num_epochs 3 --resume --metrics-file "$work/b.jsonl"
  grep -q "resumed from $work/models/resnet_distributed.safetensors at epoch 2" "$work/out.log" || fail "resume line"
  # The step count came back: the schedule resumes at step 6 (cosine step 3 of 6), not in the warmup.
  check "resnet: the resumed schedule continues" "lrs([$(cos 3 6), $(cos 4 6), $(cos 5 6)])" "$work/b.jsonl"
  check "resnet: evaluation after the resumed epoch" "[(e, n) for e, _, _, n in acc] == [('2', '21')]"
  launch "$resnet" "${cifar[@]}" --num_epochs 4 --resume > "$work/out.log" 2>&1 && fail "resuming adamw with sgd should fail"
  grep -q -- "--optimizer adamw" "$work/out.log" || fail "resuming with another optimizer: no message naming --optimizer"
  echo "ok: resuming an adamw snapshot with --optimizer sgd fails naming --optimizer adamw"

  run "resnet: sgd, momentum, multistep (synthetic data)" \
    launch "$resnet" --backend gloo --use_syn --device cpu --arch resnet18 --batch_size 4 --image_size 16 --steps_syn 2 \
    --width 8 --num_classes 10 --threads 1 --model_dir "$work/models2" --num_epochs 2 --learning_rate 0.1 \
    --optimizer sgd --momentum 0.5 --weight-decay 1e-4 --lr-schedule multistep --lr-milestones 1 --lr-gamma 0.5 \
    --metrics-file "$work/c.jsonl"
  check "resnet: multistep halves the lr after epoch 1, no clipping recorded" \
    "lrs([0.1, 0.1, 0.05, 0.05]) and all('grad_norm' not in r for r in m) and all(math.isfinite(x) for x in losses)" "$work/c.jsonl"
fi
run "multinode: adamw, step schedule, clipping, zero, gradient-as-bucket-view, static-graph, --sync-bn on a model without BatchNorm" \
  launch "$multinode" 2 1 --snapshot_path "$work/m.safetensors" --lr 0.01 --optimizer adamw --weight-decay 0.01 \
  --clip-grad-norm 0.5 --lr-schedule step --lr-step-epochs 1 --lr-gamma 0.5 --sync-bn --zero --gradient-as-bucket-view \
  --static-graph --metrics-file "$work/m.jsonl"
check "multinode: lr halves after epoch 0, gradients clipped, finite losses" \
  "lrs([0.01] * 32 + [0.005] * 32) and all(math.isfinite(r['loss']) and math.isfinite(r['grad_norm']) for r in m)" "$work/m.jsonl"
grep -q "no BatchNorm2d layer" "$work/out.log" || fail "multinode --sync-bn: no warning that there is nothing to synchronise"

if [ "$mode" = ddprun ]; then  # bad values fail before any rendezvous, so one process is enough
  bad() {  # bad <flag named in the message> <args...>
    local flag=$1; shift
    "$@" > "$work/out.log" 2>&1 && fail "'$*' should fail"
    grep -q -- "$flag" "$work/out.log" || fail "'$*': the message does not name $flag"
    echo "ok: bad value: $(head -c 160 "$work/out.log")"
  }
  bad --optimizer "$resnet" --use_syn --optimizer adam
  bad --weight-decay "$resnet" --use_syn --weight-decay -1
  bad --clip-grad-norm "$resnet" --use_syn --clip-grad-norm -0.5
  bad --lr-schedule "$resnet" --use_syn --lr-schedule linear
  bad --lr-milestones "$resnet" --use_syn --lr-schedule multistep --lr-milestones 3,2
  bad --lr-milestones "$resnet" --use_syn --lr-schedule multistep
  bad --lr-gamma "$resnet" --use_syn --lr-schedule step --lr-gamma 0
  bad --lr-step-epochs "$resnet" --use_syn --lr-schedule step --lr-step-epochs 0
  bad --warmup-epochs "$resnet" --use_syn --warmup-epochs -2
  bad --momentum "$resnet" --use_syn --optimizer adamw --momentum 0.9
  bad --momentum "$multinode" 1 1 --momentum -0.5
  bad --comm-hook "$resnet" --use_syn --comm-hook topk
  bad --powersgd-rank "$resnet" --use_syn --comm-hook powersgd --powersgd-rank 0
  bad --powersgd-start-iter "$resnet" --use_syn --comm-hook powersgd --powersgd-start-iter 1
fi
echo "PASS ($mode)"
