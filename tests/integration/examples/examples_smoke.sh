#!/usr/bin/env bash
# The two training examples under the launchers of docs/ARCHITECTURE.md §0 that run on one machine: ddprun, torchrun
# (static and c10d rendezvous), torch.distributed.launch --use_env --no_python, mpirun; the
# resnet example on synthetic data, with --resume, and on (generated) CIFAR-10 files with evaluation.
# and (mpi) the mingpt example under mpirun with --backend mpi.
# Usage: examples_smoke.sh ddprun|torch|mpi <ddprun> <multinode> <resnet> [<mingpt>]
# Exit 77 (skipped) when the launcher is not installed.
# SPDX-License-Identifier: MIT
set -u
mode=$1 ddprun=$2 multinode=$3 resnet=$4 mingpt=${5:-}
work=$(mktemp -d /tmp/ddp_examples_smoke.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export DDP_TIMEOUT_MS=20000
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
fail() { echo "FAIL: $1"; cat "$work/out.log"; exit 1; }
run() {  # run <description> <expected text> <command...>
  local what=$1 want=$2; shift 2
  timeout 120 "$@" > "$work/out.log" 2>&1 || fail "$what exited with $?"
  grep -q -- "$want" "$work/out.log" || fail "$what: no '$want' in the output"
  echo "ok: $what"
}
tiny=(--backend gloo --use_syn --device cpu --arch resnet18 --batch_size 4 --image_size 32 --steps_syn 3 --width 8
      --num_classes 10 --threads 1 --model_dir "$work/models")
case $mode in
ddprun)
  run "multinode under ddprun" "Training took" "$ddprun" --nproc-per-node 2 --standalone "$multinode" 2 1 --snapshot_path "$work/s.safetensors"
  grep -q "\[Rank 1\] Epoch 1 | Batchsize: 32 | Steps: 32" "$work/out.log" || fail "multinode progress line"
  run "multinode resumes after the last epoch" "Resuming training from snapshot at Epoch 2" "$ddprun" --nproc-per-node 2 --standalone "$multinode" 2 1 --snapshot_path "$work/s.safetensors"
  run "multinode cross_entropy" "Training took" "$ddprun" --nproc-per-node 2 --standalone "$multinode" 1 1 --loss cross_entropy --snapshot_path "$work/ce.safetensors"
  run "resnet under ddprun" "samples_per_sec" "$ddprun" --nproc-per-node 2 --standalone "$resnet" "${tiny[@]}"
  grep -q "epoch 0 step 3/3 loss" "$work/out.log" || fail "resnet progress line"
  run "resnet --resume" "resumed from $work/models/resnet_distributed.safetensors at epoch 1" "$ddprun" --nproc-per-node 2 --standalone "$resnet" "${tiny[@]}" --num_epochs 2 --resume
  python3 - "$work/cifar" <<'PY'
import os, random, sys
d = sys.argv[1]; os.makedirs(d)
random.seed(0)
for name in [f"data_batch_{k}.bin" for k in range(1, 6)] + ["test_batch.bin"]:
    with open(os.path.join(d, name), "wb") as f:
        for i in range(8):
            f.write(bytes([i % 10]) + bytes(random.randrange(256) for _ in range(3072)))
PY
  run "resnet on CIFAR-10 files" "test accuracy" "$ddprun" --nproc-per-node 2 --standalone "$resnet" --data_dir "$work/cifar" --device cpu --arch resnet18 --width 8 --batch_size 4 --num_classes 10 --threads 1 --model_dir "$work/models2"
  # No visible GPU (also on a CUDA build run on a GPU machine): --backend nccl must fail with a message.
  CUDA_VISIBLE_DEVICES= "$resnet" --backend nccl --use_syn > "$work/out.log" 2>&1 && fail "--backend nccl without a GPU should fail"
  grep -q "ddp: " "$work/out.log" || fail "--backend nccl error message"
  echo "ok: resnet --backend nccl fails with: $(head -c 200 "$work/out.log")"
  # The same device rules in multinode (train/device_choice.hpp): --device cuda needs a GPU; without --device it says what it picked.
  CUDA_VISIBLE_DEVICES= "$multinode" 1 1 --device cuda --snapshot_path "$work/d.safetensors" > "$work/out.log" 2>&1 && fail "multinode --device cuda without a GPU should fail"
  grep -q "ddp: --device cuda: " "$work/out.log" || fail "multinode --device cuda error message"
  echo "ok: multinode --device cuda fails with: $(head -c 200 "$work/out.log")"
  "$multinode" 1 1 --snapshot_path "$work/d.safetensors" > "$work/out.log" 2>&1 || fail "multinode without --device"
  grep -q "training on the CPU" "$work/out.log" || grep -q "training on the GPU" "$work/out.log" || fail "multinode: no log line saying which device it picked"
  ;;
torch)
  /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || { echo "skip: no torchrun"; exit 77; }
  T=(/usr/bin/python3 -m torch.distributed.run --redirects 9:1 --tee 9:1)
  run "multinode under torchrun (static)" "Training took" "${T[@]}" --nproc_per_node=2 --master_addr=127.0.0.1 --master_port="$(free_port)" --no_python "$multinode" 2 1 --snapshot_path "$work/a.safetensors"
  run "multinode under torchrun (c10d rendezvous; torch 1.13 spells the flags with _)" "Training took" "${T[@]}" --nproc_per_node=2 --nnodes=1 --rdzv_id=456 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:"$(free_port)" --no_python "$multinode" 2 1 --snapshot_path "$work/b.safetensors"
  run "resnet under torchrun" "samples_per_sec" "${T[@]}" --nproc_per_node=2 --master_addr=127.0.0.1 --master_port="$(free_port)" --no_python "$resnet" "${tiny[@]}"
  L=(/usr/bin/python3 -m torch.distributed.launch -r 9:1 -t 9:1 --nproc_per_node=2 --master_addr=127.0.0.1)
  run "multinode under torch.distributed.launch --use_env" "Training took" "${L[@]}" --master_port="$(free_port)" --use_env --no_python "$multinode" 1 1 --snapshot_path "$work/c.safetensors"
  run "resnet under torch.distributed.launch --use_env" "samples_per_sec" "${L[@]}" --master_port="$(free_port)" --use_env --no_python "$resnet" "${tiny[@]}"
  ;;
mpi)
  command -v mpirun > /dev/null || { echo "skip: no mpirun"; exit 77; }
  M=(mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x PATH -bind-to none -map-by slot -mca pml ob1 -mca btl ^openib)
  run "multinode under mpirun (tcp)" "Training took" "${M[@]}" -x MASTER_PORT="$(free_port)" "$multinode" 2 1 --snapshot_path "$work/m.safetensors" --backend tcp
  run "resnet under mpirun (gloo)" "samples_per_sec" "${M[@]}" -x MASTER_PORT="$(free_port)" "$resnet" "${tiny[@]}"
  if "$multinode" --help | grep -q "mpi"; then
    if "$multinode" 1 1 --backend mpi --snapshot_path "$work/probe.safetensors" 2>&1 | grep -q "built without MPI"; then
      echo "note: built without MPI; --backend mpi not checked"
    else
      run "multinode under mpirun --backend mpi" "Training took" "${M[@]}" -x MASTER_PORT="$(free_port)" "$multinode" 2 1 --snapshot_path "$work/n.safetensors" --backend mpi
      if [ -n "$mingpt" ]; then
        run "mingpt under mpirun --backend mpi" "Snapshot saved at epoch 1" "${M[@]}" "$mingpt" --backend mpi \
          --data_path /usr/share/common-licenses/GPL-3 --n_layer 1 --n_head 2 --n_embd 16 --block_size 8 --batch_size 4 \
          --max_epochs 1 --max_iters 3 --log_every 1 --train_split 1 --snapshot_path "$work/g.safetensors"
        grep -q "\[GPU1\] Epoch 1 | Iter 2 | Train Loss" "$work/out.log" || fail "mingpt: rank 1 did not train 3 steps"
      fi
    fi
  fi
  ;;
esac
echo "PASS ($mode)"
