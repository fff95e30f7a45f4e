#!/usr/bin/env bash
# The tutorial's ResNet-152 job on one GPU: under ddprun and under torchrun (--nproc_per_node=1 --no-python),
# with exactly the tutorial's flags. Checks that it chose the GPU by itself, trained (progress lines with a
# finite loss) and printed samples_per_sec; then --precision bf16 and fp32 each run a short job too.
# Usage: tutorial.sh <ddprun> <resnet>. Exit 77 without a GPU (nvidia-smi lists none).
# Environment: TORCHRUN (default: torchrun on PATH, else skip that half), DDP_TIMEOUT_MS (default 60000).
# SPDX-License-Identifier: MIT
set -u
ddprun=$1 resnet=$2
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "SKIP: no GPU (nvidia-smi -L lists none)"
  exit 77
fi
work=$(mktemp -d /tmp/ddp_gpu_tutorial.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export DDP_TIMEOUT_MS=${DDP_TIMEOUT_MS:-60000}
fail() { echo "FAIL: $1"; tail -n 40 "$work/out.log"; exit 1; }
check() {  # check <description>: the log of a finished GPU run
  grep -q "training on cuda:0" "$work/out.log" || fail "$1: did not train on cuda:0"
  grep -q "samples_per_sec: " "$work/out.log" || fail "$1: no samples_per_sec"
  grep -E "epoch 0 step [0-9]+/[0-9]+ loss (nan|inf)" "$work/out.log" && fail "$1: non-finite loss"
  echo "ok: $1: $(grep 'samples_per_sec: ' "$work/out.log")"
}
tutorial=(--backend=nccl --use_syn --batch_size=16 --arch=resnet152)

timeout 540 "$ddprun" --nproc-per-node 1 --standalone "$resnet" "${tutorial[@]}" > "$work/out.log" 2>&1 ||
  fail "ddprun tutorial exited with $?"
check "ddprun resnet ${tutorial[*]}"

for p in bf16 fp32; do
  timeout 300 "$ddprun" --nproc-per-node 1 --standalone "$resnet" --backend=nccl --use_syn --batch_size=16 \
    --arch=resnet50 --steps_syn 5 --precision $p > "$work/out.log" 2>&1 || fail "--precision $p exited with $?"
  check "ddprun resnet50 --precision $p"
done

torchrun=${TORCHRUN:-$(command -v torchrun || true)}
if [ -z "$torchrun" ]; then
  echo "skip: no torchrun on PATH (set TORCHRUN)"
  exit 0
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
timeout 540 "$torchrun" --nproc_per_node=1 --master_addr=127.0.0.1 --master_port="$port" --no-python \
  "$resnet" "${tutorial[@]}" > "$work/out.log" 2>&1 || fail "torchrun tutorial exited with $?"
check "torchrun $("$torchrun" --version 2>/dev/null | head -1) resnet ${tutorial[*]}"
