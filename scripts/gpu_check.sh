#!/usr/bin/env bash
# The whole GPU verification in one command, on any Linux machine with an NVIDIA GPU, CUDA 12.x/13.x and CMake:
#   bash scripts/gpu_check.sh OUT_DIR [--phase build|perf|test|bench|all]...   (default: all = build, test, bench;
#   phases resume from the build; whatever order they are named in, they run in the order build, perf, test, bench)
# Builds ddp in Release for the GPU present (sm_90a on an H100), runs every GPU step, each timed and logged, and
# writes OUT_DIR/report.md and OUT_DIR/report.json (pass/fail/skip per step, seconds, the GPU, driver, CUDA, NCCL
# and cuDNN versions) plus OUT_DIR/logs/<step>.log. Exit status: 0 all passed (skips allowed), 1 a step failed,
# 77 no GPU here (the report says why).
# Steps: build | ctest -L gpu | compute-sanitizer memcheck + racecheck on the kernel tests, the nn tests (resnet18
# and resnet50 GPU step against the CPU) and one DDP step | the tutorial commands on the GPU (resnet under ddprun and
# torchrun, --backend gloo --device cuda with world 2 and 4, multinode --device cuda under torchrun and mpirun (nccl)
# and ddprun (gloo, world 2 on one GPU), resnet18 under DDP_CUDA_SYNC_CHECK=1, resnet18 on ddp's own convolution
# kernels (--conv own; the rest use cuDNN where the build found it), a kill -9 of one rank mid-training)
# | bench_resnet_gpu: issue 14's table (resnet50 bf16 at batch 256 and 32, tf32 at 128, resnet18/152 bf16 at 256;
# ddp with own kernels, cuDNN and cuDNN-measured against PyTorch eager and torch.compile, TFLOP/s) in
# OUT_DIR/bench_resnet_gpu.jsonl.
# Phase perf, the short performance call (docs/perf/gpu_next_call.md): the device's properties
# (OUT_DIR/device_properties.json, nvidia-smi -q in the logs), then bench_resnet_gpu's resnet50 bf16 rows at batch
# 256 and 32 with PyTorch eager in the same call, ddp's activations fp32 and bf16 side by side, cuDNN measured and
# heuristic, and --profile (device time per op class on both sides) into OUT_DIR/bench_resnet_gpu.jsonl; the
# op-class tables are in logs/perf_*.log. No build, no sanitizer, no tutorial: a few minutes.
# Dependencies it finds by itself: nvcc (PATH, CUDA_HOME, /usr/local/cuda), NCCL (NCCL_ROOT, else the
# nvidia-nccl wheel beside python3's torch), torchrun and PyTorch (python3). The header-only packages ddp
# builds with (doctest, cxxopts, nlohmann_json) are taken from the system, or from DDP_GPU_DEPS (default:
# .gpu_deps in the repository, made by scripts/gpu_deps.sh on a Debian machine, for GPU machines without them).
# Environment: DDP_GPU_BUILD (build dir, default build/gpu), DDP_GPU_JOBS (default nproc), DDP_GPU_CTEST_JOBS (gpu
# tests at once, default 1), DDP_GPU_TEST_TIMEOUT (seconds per gpu test, default 540), PYTHON (default python3),
# DDP_GPU_BENCH_ROWS (the bench rows to run; default r50_bf16_b256 r50_bf16_b32; also r50_tf32_b128 and
# r18_r152_bf16_b256), DDP_GPU_BENCH_COMPILE=1 (add torch.compile to the resnet50 bf16 rows), DDP_GPU_BUDGET_S (the
# seconds the whole check may take, for a short device lease: each step's limit is cut to what is left, and a step
# that would start with under 20 s left is recorded as skipped "budget spent"; the steps run most telling first:
# the gpu tests, the tutorial runs, the kill -9, the sanitizers, the bench). A prebuilt build directory (built
# elsewhere for this GPU's architecture and carried here) is used as it is with --phase test or --phase bench.
# DDP_GPU_SKIP: a bash regex of step names to leave out (recorded as skipped), e.g. steps a run already passed.
# DDP_GPU_PERF_CONVS (phase perf's --conv values, default "cudnn_find cudnn"), DDP_GPU_PERF_BATCHES (default
# "256 32").
# scripts/gpu_carry.sh builds the GPU binaries on a machine without a GPU and runs this script on the GPU one.
# SPDX-License-Identifier: MIT
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

usage() { echo "usage: $0 OUT_DIR [--phase build|perf|test|bench|all]..." >&2; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
phases=()
while [ $# -gt 0 ]; do
  case $1 in
    --phase) [ $# -ge 2 ] || usage; phases+=("$2"); shift 2 ;;
    --phase=*) phases+=("${1#--phase=}"); shift ;;
    *) usage ;;
  esac
done
[ ${#phases[@]} -gt 0 ] || phases=(all)
for p in "${phases[@]}"; do
  case $p in build|perf|test|bench|all) ;; *) echo "gpu_check: unknown --phase '$p' (build, perf, test, bench or all)" >&2; exit 2 ;; esac
done
# want PHASE: named, or part of all (which leaves perf out: its rows are a subset of bench's, with --profile).
want() { local p; for p in "${phases[@]}"; do { [ "$p" = "$1" ] || { [ "$p" = all ] && [ "$1" != perf ]; }; } && return 0; done; return 1; }

mkdir -p "$out/logs" || { echo "gpu_check: cannot create OUT_DIR '$out'" >&2; exit 2; }
out=$(cd "$out" && pwd)
build=${DDP_GPU_BUILD:-build/gpu}
jobs=${DDP_GPU_JOBS:-$(nproc)}
python=${PYTHON:-python3}
results="$out/results.tsv"  # step \t status \t seconds \t note; appended by every phase, read by the report
touch "$results"
# The bench rows of this call (perf and bench append to it).
if want perf || want bench; then : > "$out/bench_resnet_gpu.jsonl"; fi

# ---- the machine ----
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
nvcc=$(command -v nvcc || { for d in "${CUDA_HOME:-}" /usr/local/cuda; do [ -x "$d/bin/nvcc" ] && echo "$d/bin/nvcc" && break; done; })
cuda_version=$([ -n "$nvcc" ] && "$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
wheel_dir() { "$python" -c "import importlib,os,sys; m=importlib.import_module(sys.argv[1]); print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])" "$1" 2>/dev/null; }
nccl_root=${NCCL_ROOT:-$(wheel_dir nvidia.nccl)}
nccl_header=$(ls "${nccl_root:-/nonexistent}/include/nccl.h" "$(dirname "$(dirname "${nvcc:-/x/x}")")/include/nccl.h" /usr/include/nccl.h 2>/dev/null | head -1)
nccl_version=$([ -n "$nccl_header" ] && sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$nccl_header" | paste -sd.)
cudnn_dir=$(wheel_dir nvidia.cudnn)
cudnn_version=$([ -n "$cudnn_dir" ] && sed -n 's/^#define CUDNN_\(MAJOR\|MINOR\|PATCHLEVEL\) \([0-9]*\).*/\2/p' "$cudnn_dir/include/cudnn_version.h" 2>/dev/null | paste -sd.)
torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)

write_report() {  # report.md and report.json from results.tsv
  local rc=$1 reason=${2:-}
  {
    echo "# ddp GPU check"
    echo
    echo "| what | value |"
    echo "| --- | --- |"
    echo "| GPU | ${gpu_name:-none} (compute capability ${cap:-?}) |"
    echo "| driver | ${driver:-?} |"
    echo "| CUDA (nvcc) | ${cuda_version:-not found} |"
    echo "| NCCL | ${nccl_version:-not found} ${nccl_header:+($nccl_header)} |"
    echo "| cuDNN | ${cudnn_version:-not found} |"
    echo "| PyTorch | ${torch_version:-not found} |"
    echo "| commit | $(git -C "$repo" rev-parse --short HEAD 2>/dev/null)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (modified)') |"
    [ -n "$reason" ] && echo "| result | $reason |"
    echo
    echo "| step | result | seconds | note |"
    echo "| --- | --- | ---: | --- |"
    while IFS=$'\t' read -r step status secs note; do echo "| $step | $status | $secs | $note |"; done < "$results"
  } > "$out/report.md"
  "$python" - "$results" "$out/report.json" "$rc" "$reason" "${gpu_name:-}" "${driver:-}" "${cuda_version:-}" \
    "${nccl_version:-}" "${cudnn_version:-}" "${torch_version:-}" "${cap:-}" <<'PY' 2>/dev/null || true
import json, sys
res, dst, rc, reason, gpu, driver, cuda, nccl, cudnn, torch, cap = sys.argv[1:12]
steps = []
for line in open(res):
    parts = line.rstrip("\n").split("\t")
    if len(parts) >= 3:
        steps.append({"step": parts[0], "result": parts[1], "seconds": float(parts[2] or 0),
                      "note": parts[3] if len(parts) > 3 else ""})
json.dump({"exit_code": int(rc), "reason": reason, "gpu": gpu, "compute_capability": cap, "driver": driver,
           "cuda": cuda, "nccl": nccl, "cudnn": cudnn, "torch": torch, "steps": steps}, open(dst, "w"), indent=1)
PY
}

if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  reason="no GPU: nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists no device' || echo 'is not installed')"
  echo "gpu_check: SKIP: $reason" | tee "$out/logs/detect.log"
  write_report 77 "$reason"
  exit 77
fi
if [ -z "$nvcc" ]; then
  write_report 1 "no nvcc (PATH, CUDA_HOME, /usr/local/cuda)"
  echo "gpu_check: FAIL: no nvcc found (PATH, CUDA_HOME, /usr/local/cuda)"; exit 1
fi

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with its output in logs/NAME.log; exit 77 means skipped (the
# last line of the log says why).
deadline=$(( ${DDP_GPU_BUDGET_S:+$(date +%s) + DDP_GPU_BUDGET_S} ))  # 0: no budget
step() {
  local name=$1 limit=$2; shift 2
  local log="$out/logs/$name.log" t0 rc status note
  if [ -n "${DDP_GPU_SKIP:-}" ] && [[ $name =~ $DDP_GPU_SKIP ]]; then
    printf '%s\tskip\t0\tleft out by DDP_GPU_SKIP\n' "$name" >> "$results"
    printf 'gpu_check: %-40s skip  left out by DDP_GPU_SKIP\n' "$name"
    return 0
  fi
  if [ "$deadline" -gt 0 ]; then
    local left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt 20 ]; then
      printf '%s\tskip\t0\tbudget spent (DDP_GPU_BUDGET_S=%s)\n' "$name" "$DDP_GPU_BUDGET_S" >> "$results"
      printf 'gpu_check: %-40s skip  budget spent\n' "$name"
      return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  local secs; secs=$(printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)))
  case $rc in
    0) status=pass note="" ;;
    77) status=skip note=$(tail -n 1 "$log" | tr '\t|' '  ' | cut -c1-160) ;;
    124|137) status=FAIL note="timed out after ${limit} s" ;;
    *) status=FAIL note="exit $rc: $(grep -m1 -iE 'error|fail' "$log" | tr '\t|' '  ' | cut -c1-160)" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "$note" >> "$results"
  printf 'gpu_check: %-40s %-5s %6s s  %s\n' "$name" "$status" "$secs" "$note"
}
bin() { echo "$repo/$build/$1"; }
# The wheels' NCCL and cuDNN libraries for the programs the phases run.
use_wheel_libs() {
  [ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -n "$cudnn_dir" ] && export LD_LIBRARY_PATH="$cudnn_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  return 0
}
# --python for bench_resnet_gpu: python3 with torch, else --no-torch.
torch_flag=(--python "$(command -v "$python")")
[ -z "$torch_version" ] && torch_flag=(--no-torch)

# ---- phase build ----
if want build; then
  : > "$results"
  arch=${cap/./}
  [ "$arch" = 90 ] && arch=90a  # Hopper: wgmma and the bulk copy engine need the arch-specific target
  deps=${DDP_GPU_DEPS:-$repo/.gpu_deps}
  cfg=(-S "$repo" -B "$repo/$build" -DCMAKE_BUILD_TYPE=Release -DDDP_CUDA_COMPILE_ONLY=OFF -DDDP_WITH_CUDA=ON -DDDP_WITH_NCCL=ON
       "-DCMAKE_CUDA_ARCHITECTURES=${arch:-90}" "-DCMAKE_CUDA_COMPILER=$nvcc")
  command -v ninja >/dev/null && cfg+=(-G Ninja)
  [ -d "$deps" ] && cfg+=("-DCMAKE_PREFIX_PATH=$deps")
  [ -n "$nccl_root" ] && cfg+=("-DNCCL_ROOT=$nccl_root")
  # cuDNN: the nvidia-cudnn wheel beside torch (include/cudnn.h, lib/libcudnn.so.9), else CMake's own search
  # (CUDNN_ROOT, the CUDA toolkit); the convolutions then run on cuDNN by default (--conv, docs/decisions/0052).
  [ -n "$cudnn_dir" ] && [ -f "$cudnn_dir/include/cudnn.h" ] && cfg+=("-DCUDNN_ROOT=$cudnn_dir")
  step configure 300 cmake "${cfg[@]}"
  step build 900 cmake --build "$repo/$build" -j "$jobs"
fi

# ---- phase perf ----
if want perf; then
  bench=$(bin bench/resnet_gpu/bench_resnet_gpu)
  [ -x "$bench" ] || { echo "gpu_check: no $bench: build bench_resnet_gpu first"; write_report 1 "no build"; exit 1; }
  use_wheel_libs
  step device_properties 60 bash -c "set -o pipefail; '$bench' --device-info | tee '$out/device_properties.json' &&
    nvidia-smi -q"
  conv_flags=""
  for c in ${DDP_GPU_PERF_CONVS:-cudnn_find cudnn}; do conv_flags+=" --conv $c"; done
  for b in ${DDP_GPU_PERF_BATCHES:-256 32}; do
    # PyTorch eager first, then ddp per conv with activations fp32 and bf16 (docs/decisions/0070), each with its
    # op-class profile (tables on stderr, in the log).
    step "perf_r50_bf16_b$b" 300 bash -c "set -o pipefail; '$bench' --arch resnet50 --precision bf16 --batch $b \
      $conv_flags --activations fp32 --activations bf16 --steps 10 --warmup 3 --profile --profile-steps 3 \
      --torch-timeout 200 ${torch_flag[*]} | tee -a '$out/bench_resnet_gpu.jsonl'"
  done
fi

# ---- phase test ----
if want test; then
  [ -x "$(bin tools/ddprun)" ] || { echo "gpu_check: no build in $build: run --phase build first"; write_report 1 "no build"; exit 1; }
  export DDP_TIMEOUT_MS=${DDP_TIMEOUT_MS:-60000}
  use_wheel_libs
  # gpu_resnet_tutorial is left to the tutorial step below (same script), so that it runs once.
  step ctest_gpu 600 ctest --test-dir "$repo/$build" -L gpu -E '^gpu_resnet_tutorial$' --output-on-failure --timeout "${DDP_GPU_TEST_TIMEOUT:-540}" -j "${DDP_GPU_CTEST_JOBS:-1}"
  ddprun=$(bin tools/ddprun) resnet=$(bin examples/resnet/resnet) multinode=$(bin examples/multinode/multinode)
  work=$(mktemp -d /tmp/ddp_gpu_check.XXXXXX)
  syn=(--use_syn --steps_syn 5 --arch resnet18 --batch_size 16 --image_size 64 --model_dir "$work/m")
  step tutorial_ddprun_torchrun 600 env TORCHRUN="$(command -v torchrun || true)" bash tests/gpu/resnet/tutorial.sh "$ddprun" "$resnet"
  for n in 2 4; do
    step "gloo_cuda_world$n" 300 "$ddprun" --nproc-per-node "$n" --standalone "$resnet" --backend gloo --device cuda "${syn[@]}"
  done
  # The staged holds as stream memory waits (opt-in until this step has passed: comm/staging, docs/decisions/0023).
  step gloo_cuda_world2_memory_wait 300 env DDP_STAGING_MEMORY_WAIT=1 "$ddprun" --nproc-per-node 2 --standalone \
    "$resnet" --backend gloo --device cuda "${syn[@]}"
  free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  # multinode (the tutorial's multinode_gpu_ddp.py and its MPI variant): nccl, one GPU per rank, world 1 here;
  # then gloo with 2 ranks sharing the GPU (the tcp backend stages CUDA tensors through pinned host memory).
  mn=(5 2 --backend nccl --device cuda)
  if command -v torchrun >/dev/null; then
    step multinode_cuda_torchrun 300 torchrun --nproc_per_node=1 --master_addr=127.0.0.1 --master_port="$(free_port)" \
      --no-python "$multinode" "${mn[@]}" --snapshot_path "$work/mn.safetensors"
  else
    printf 'multinode_cuda_torchrun\tskip\t0\tno torchrun on PATH\n' >> "$results"
  fi
  if command -v mpirun >/dev/null; then  # ranks rendezvous through MASTER_ADDR/MASTER_PORT, as on the CPU
    step multinode_cuda_mpirun 300 mpirun --allow-run-as-root -np 1 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(free_port)" \
      "$multinode" "${mn[@]}" --snapshot_path "$work/mn2.safetensors"
  else
    printf 'multinode_cuda_mpirun\tskip\t0\tno mpirun on this machine\n' >> "$results"
  fi
  step multinode_gloo_cuda_world2 300 "$ddprun" --nproc-per-node 2 --standalone "$multinode" 5 2 --backend gloo \
    --device cuda --snapshot_path "$work/mn3.safetensors"
  # Debug mode: every kernel launch of a resnet18 step waits for its stream and names a faulting kernel.
  step sync_check_resnet18 300 env DDP_CUDA_SYNC_CHECK=1 "$resnet" --backend nccl --device cuda --use_syn \
    --steps_syn 2 --arch resnet18 --batch_size 16 --image_size 64 --model_dir "$work/sc"
  # ddp's own convolution kernels in a whole training run (the other steps use cuDNN where the build found it).
  step resnet18_conv_own 300 "$resnet" --backend nccl --device cuda --use_syn --steps_syn 3 --arch resnet18 \
    --batch_size 16 --image_size 64 --conv own --model_dir "$work/own"
  # kill -9 of rank 1 mid-training: ddprun and the other rank must end within the timeout (10 s here) + 10 s.
  kill_one() {
    DDP_TIMEOUT_MS=10000 "$ddprun" --nproc-per-node 2 --standalone "$resnet" --backend gloo --device cuda \
      --use_syn --steps_syn 400 --arch resnet18 --batch_size 16 --image_size 64 --model_dir "$work/k" &
    local launcher=$! victim="" i
    for i in $(seq 1 600); do  # up to 60 s for rank 1 to start
      for p in $(pgrep -f -- "--model_dir $work/k"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=1' && victim=$p
      done
      [ -n "$victim" ] && break
      sleep 0.1
    done
    [ -n "$victim" ] || { echo "rank 1 never started"; kill -9 "$launcher"; return 1; }
    sleep 10  # well into training (model built, buckets running)
    local t0; t0=$(date +%s%N)
    kill -9 "$victim"
    wait "$launcher"; local rc=$?
    echo "ddprun exit $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms after the kill -9 of rank 1 (pid $victim)"
    [ "$rc" -ne 0 ] && ! pgrep -f -- "--model_dir $work/k" >/dev/null
  }
  step kill9_rank1 90 bash -c "$(declare -f kill_one); work='$work' ddprun='$ddprun' resnet='$resnet'; kill_one"
  # The sanitizers last: they are the slowest steps (a budget may leave them out).
  sanitizer=$(command -v compute-sanitizer || ls "$(dirname "$nvcc")"/compute-sanitizer 2>/dev/null)
  if [ -n "$sanitizer" ]; then
    for t in unit_kernels_cuda unit_nn_cuda gpu/ddp/gpu_ddp; do
      step "memcheck_${t##*/}" 600 "$sanitizer" --tool memcheck --error-exitcode 3 "$(bin tests/$t)"
    done
    # racecheck on ddp's own kernels: cuDNN's (names containing "cudnn") are not ours to fix, and the first GPU
    # run (2026-11-27) saw racecheck flag shared-memory hazards inside cuDNN's sm90 dgrad kernel.
    step racecheck_unit_kernels_cuda 600 "$sanitizer" --tool racecheck --kernel-name-exclude kns=cudnn \
      --error-exitcode 3 "$(bin tests/unit_kernels_cuda)"
  else
    printf 'sanitizers\tskip\t0\tno compute-sanitizer next to nvcc or on PATH\n' >> "$results"
  fi
  rm -rf "$work"
fi

# ---- phase bench ----
if want bench; then
  [ -x "$(bin bench/resnet_gpu/bench_resnet_gpu)" ] || { echo "gpu_check: no bench_resnet_gpu in $build"; write_report 1 "no build"; exit 1; }
  use_wheel_libs
  # Issue 14's table (docs/decisions/0052): each row ours with own kernels, cuDNN (heuristics) and cuDNN
  # (measured, like torch's cudnn.benchmark) beside PyTorch eager, into bench_resnet_gpu.jsonl. A device session
  # has minutes, not hours: by default the two resnet50 bf16 rows run (a few minutes); DDP_GPU_BENCH_ROWS names
  # others (r50_tf32_b128 r18_r152_bf16_b256), and DDP_GPU_BENCH_COMPILE=1 adds torch.compile (default and
  # max-autotune) to the resnet50 bf16 rows, each torch child capped at 240 s by bench_resnet_gpu.
  bench=$(bin bench/resnet_gpu/bench_resnet_gpu)
  bench_row() {  # NAME LIMIT_S ARGS...
    local name=$1 limit=$2; shift 2
    case " ${DDP_GPU_BENCH_ROWS:-r50_bf16_b256 r50_bf16_b32} " in *" $name "*) ;; *) return 0 ;; esac
    step "bench_$name" "$limit" bash -c "set -o pipefail; '$bench' $* --steps 10 --warmup 3 ${torch_flag[*]} | tee -a '$out/bench_resnet_gpu.jsonl'"
  }
  compile_flags=""
  [ -n "$torch_version" ] && [ "${DDP_GPU_BENCH_COMPILE:-0}" = 1 ] &&
    compile_flags="--torch-compile default --torch-compile max-autotune"
  bench_row r50_bf16_b256 590 --arch resnet50 --precision bf16 --batch 256 $compile_flags
  bench_row r50_bf16_b32 590 --arch resnet50 --precision bf16 --batch 32 $compile_flags
  bench_row r50_tf32_b128 400 --arch resnet50 --precision tf32 --batch 128 --peak-tflops 494
  bench_row r18_r152_bf16_b256 590 --arch resnet18 --arch resnet152 --precision bf16 --batch 256
fi

failed=$(awk -F'\t' '$2 == "FAIL"' "$results" | wc -l)
write_report $(( failed > 0 ? 1 : 0 )) "$( [ "$failed" -gt 0 ] && echo "$failed step(s) failed" || echo "every step passed or was skipped with its reason")"
echo "gpu_check: report in $out/report.md ($failed failed)"
[ "$failed" -eq 0 ]
