#!/usr/bin/env bash
# Exact resume: a multinode run whose rank 1 dies (SIGKILL) right after the epoch-2 snapshot, restarted once by
# the launcher, must end with a final snapshot byte-identical to an uninterrupted run's. The kill is the fault
# hook of the test build (die_after_epoch.cpp: DDP_TEST_DIE_AFTER_EPOCH, first attempt only).
# Usage: exact_resume.sh ddprun|torchrun <ddprun binary> <multinode_faults binary>
# SPDX-License-Identifier: MIT
set -u
mode=$1 ddprun=$2 prog=$3
work=$(mktemp -d /tmp/ddp_exact_resume.XXXXXX)
trap 'rm -rf "$work"' EXIT
export DDP_TIMEOUT_MS=20000   # a lost peer fails every rank within seconds, never a hang

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
launch() {  # launch <max restarts> <args...>
  local restarts=$1; shift
  if [ "$mode" = torchrun ]; then
    if ! /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null; then echo "skip: no torchrun"; exit 77; fi
    timeout 120 /usr/bin/python3 -m torch.distributed.run --redirects 9:1 --tee 9:1 --max_restarts="$restarts" \
      --nproc_per_node=2 --master_addr=127.0.0.1 --master_port="$(free_port)" --no_python "$prog" "$@"
  else
    timeout 120 "$ddprun" --nproc-per-node 2 --standalone --max-restarts "$restarts" "$prog" "$@"
  fi
}

launch 0 6 2 --snapshot_path "$work/a.safetensors" > "$work/a.log" 2>&1 || { echo "FAIL: uninterrupted run"; cat "$work/a.log"; exit 1; }
DDP_TEST_DIE_AFTER_EPOCH=2 launch 1 6 2 --snapshot_path "$work/b.safetensors" > "$work/b.log" 2>&1 \
  || { echo "FAIL: interrupted run did not recover"; cat "$work/b.log"; exit 1; }
grep -q "Resuming training from snapshot at Epoch 3" "$work/b.log" || { echo "FAIL: no resume at epoch 3"; cat "$work/b.log"; exit 1; }
# After the restart, epoch 3 (the first unfinished one) runs exactly once; epoch 2 is not re-run.
n=$(sed -n '/Resuming training/,$p' "$work/b.log" | grep -c "\[Rank 0\] Epoch 3 ")
sed -n '/Resuming training/,$p' "$work/b.log" | grep -q "Epoch 2 " && { echo "FAIL: epoch 2 re-run"; exit 1; }
[ "$n" = 1 ] || { echo "FAIL: epoch 3 ran $n times on rank 0"; cat "$work/b.log"; exit 1; }
cmp "$work/a.safetensors" "$work/b.safetensors" || { echo "FAIL: final snapshots differ"; exit 1; }
echo "PASS ($mode): restarted run's final snapshot is bit-identical to the uninterrupted run's"
