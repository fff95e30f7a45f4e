#!/usr/bin/env bash
# Usage: dry_run.sh <repository> <gpu_check_targets.tsv>. The device scripts' dry run on any machine: what
# scripts/gpu_carry.sh run and scripts/gpu_check.sh do on a GPU lease, with stubs, so that a path mistake (the
# first GPU session lost two steps to them) fails here. Exit 0 when every step ran and found what it runs, 1
# otherwise (with the reason), 77 when this build configuration lacks a target the scripts need.
# How: a copy of scripts/gpu_check.sh and scripts/gpu_carry.sh in a scratch checkout (tests/ linked), a carried
# archive (.gpu_carry/build_gpu.tar.xz, as `gpu_carry.sh pack` writes it) holding, for every target pack builds,
# a stub at the path this build gives it (gpu_check_targets.tsv, tests/gpu/check/CMakeLists.txt), and stub
# nvidia-smi (an H200), nvcc, ctest, compute-sanitizer, torchrun, mpirun and a python that reports a torch
# version on PATH. Every stub fails when an argument names a path under the scratch checkout that is not a
# program (other than the build directory itself); ctest's stub wants a CTestTestfile.cmake in its --test-dir. Then `gpu_carry.sh run` with phases perf,
# test and bench must pass, and each program gpu_check runs directly must have been run.
# kill9_rank1 is left out (it waits for a real rank 1 process).
# SPDX-License-Identifier: MIT
set -u
repo=$1 manifest=$2
[ -f "$manifest" ] || { echo "FAIL: no $manifest (configure the build first)"; exit 1; }
if grep -q $'\t-$' "$manifest"; then
  echo "SKIP: this configuration lacks $(awk -F'\t' '$2 == "-" {print $1}' "$manifest" | paste -sd' '); configure" \
       "with CUDA (-DDDP_WITH_CUDA=ON -DDDP_CUDA_COMPILE_ONLY=ON works without a GPU) for the dry run"
  exit 77
fi
tmp=$(mktemp -d /tmp/ddp_gpu_dry_run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fake=$tmp/repo stubs=$tmp/stubs stage=$tmp/stage out=$tmp/out calls=$tmp/calls.log
mkdir -p "$fake/scripts" "$stubs" "$stage/build/gpu"
cp "$repo/scripts/gpu_check.sh" "$repo/scripts/gpu_carry.sh" "$fake/scripts/"
ln -s "$repo/tests" "$fake/tests"
: > "$calls"
real_python=$(command -v python3)

# stub NAME [BODY]: an executable that logs its call, checks the paths it is given, then runs BODY (default:
# prints what the tutorial checks for).
stub() {
  local path=$1 body=${2:-'echo "training on cuda:0"; echo "samples_per_sec: 0 (dry run)"'}
  mkdir -p "$(dirname "$path")"
  cat > "$path" <<EOF
#!/usr/bin/env bash
echo "\$(basename "\$0") \$*" >> '$calls'
for a in "\$@"; do
  case \$a in
    '$fake/build/gpu') ;;
    '$fake'/*) [ -f "\$a" ] && [ -x "\$a" ] || { echo "dry run: \$(basename "\$0"): \$a is not a program" >&2; exit 1; } ;;
  esac
done
$body
EOF
  chmod +x "$path"
}

# The carried build: a stub per target, at the path this build gives it.
while IFS=$'\t' read -r target rel; do
  case $target in
    bench_resnet_gpu)
      stub "$stage/build/gpu/$rel" 'case " $* " in
  *" --device-info "*) echo "{\"device_properties\":{\"name\":\"dry run\"}}" ;;
  *) echo "{\"arch\":\"resnet50\",\"dry_run\":true}" ;;
esac' ;;
    *) stub "$stage/build/gpu/$rel" ;;
  esac
done < "$manifest"
echo "# dry run" > "$stage/build/gpu/CTestTestfile.cmake"
mkdir -p "$fake/.gpu_carry"
(cd "$stage" && tar cf - build/gpu | xz -T0 -1 > "$fake/.gpu_carry/build_gpu.tar.xz") || { echo "FAIL: tar"; exit 1; }
echo "$tmp/origin/ddp" > "$fake/.gpu_carry/root"  # pack's checkout path, absent here: run links it

# The machine.
stub "$stubs/nvidia-smi" 'case " $* " in
  *" -L "*) echo "GPU 0: NVIDIA H200 (UUID: GPU-dry-run)" ;;
  *"--query-gpu=name"*) echo "NVIDIA H200" ;;
  *"--query-gpu=driver_version"*) echo "580.0 (dry run)" ;;
  *"--query-gpu=compute_cap"*) echo "9.0" ;;
  *) echo "nvidia-smi (dry run)" ;;
esac'
stub "$stubs/nvcc" 'echo "Cuda compilation tools, release 13.0, V13.0.0 (dry run)"'
stub "$stubs/ctest" 'dir=""; while [ $# -gt 0 ]; do [ "$1" = --test-dir ] && dir=$2; shift; done
[ -f "$dir/CTestTestfile.cmake" ] || { echo "dry run: ctest: no build in --test-dir $dir" >&2; exit 1; }
echo "100% tests passed (dry run)"'
stub "$stubs/compute-sanitizer" 'prog=${!#}; [ -x "$prog" ] || { echo "dry run: compute-sanitizer: $prog is not a program" >&2; exit 1; }
"$prog"'
stub "$stubs/torchrun"
stub "$stubs/mpirun"
stub "$stubs/python_with_torch" "case \"\$*\" in *'import torch; print(torch.__version__)'*) echo 2.11.0+dryrun ;;
  *) exec '$real_python' \"\$@\" ;; esac"

cd "$fake" || exit 1
PATH="$stubs:$PATH" PYTHON="$stubs/python_with_torch" DDP_GPU_PHASES="perf test bench" DDP_GPU_SKIP='^kill9_rank1$' \
  DDP_GPU_BUDGET_S=100 bash scripts/gpu_carry.sh run "$out" > "$tmp/run.log" 2>&1
rc=$?
cat "$tmp/run.log"
fail() {  # the reason, then each failed step's note and the end of its log
  echo "FAIL: $1"
  tar xzf "$out/gpu_check_logs.tgz" -C "$tmp" 2>/dev/null
  grep $'\tFAIL\t' "$out/results.tsv" 2>/dev/null | while IFS=$'\t' read -r step _ _ note; do
    echo "  step $step: $note"
    tail -n 3 "$tmp/logs/$step.log" 2>/dev/null | sed 's/^/    /'
  done
  exit 1
}
[ "$rc" -eq 0 ] || fail "gpu_carry.sh run exited with $rc"
[ -L "$tmp/origin/ddp" ] || fail "gpu_carry.sh run did not link the packing checkout's path to this one"
[ -f "$out/report.json" ] && [ -f "$out/report.md" ] || fail "no report"
grep -q '^| GPU | NVIDIA H200 (compute capability 9.0) |' "$out/report.md" || fail "report.md does not name the GPU"
grep -q $'\tFAIL\t' "$out/results.tsv" && fail "a step failed: $(grep $'\tFAIL\t' "$out/results.tsv" | head -3)"
[ -f "$out/gpu_check_logs.tgz" ] && [ ! -e "$out/logs" ] || fail "the logs were not packed into gpu_check_logs.tgz"
grep -q '"device_properties"' "$out/device_properties.json" || fail "no device_properties.json"
[ "$(grep -c dry_run "$out/bench_resnet_gpu.jsonl")" -ge 4 ] || fail "bench_resnet_gpu.jsonl lacks the perf and bench rows"
for step in device_properties perf_r50_bf16_b256 perf_r50_bf16_b32 ctest_gpu tutorial_ddprun_torchrun \
            gloo_cuda_world2 multinode_cuda_torchrun multinode_cuda_mpirun sync_check_resnet18 resnet18_conv_own \
            memcheck_unit_kernels_cuda memcheck_unit_nn_cuda memcheck_gpu_ddp racecheck_unit_kernels_cuda \
            bench_r50_bf16_b256 bench_r50_bf16_b32; do
  grep -q "^$step"$'\tpass\t' "$out/results.tsv" || fail "step $step did not pass: $(grep "^$step" "$out/results.tsv")"
done
# Each program gpu_check runs was run, itself or under a launcher (a step that ran nothing would pass above).
for prog in ddprun resnet multinode bench_resnet_gpu unit_kernels_cuda unit_nn_cuda gpu_ddp ctest torchrun mpirun; do
  grep -qE "^$prog |/$prog( |\$)" "$calls" || fail "gpu_check never ran $prog"
done
grep -q -- '--profile' "$calls" || fail "the perf phase did not pass --profile to bench_resnet_gpu"
grep -q -- '--python .*python_with_torch' "$calls" || fail "bench_resnet_gpu was not given the python with torch"
echo "ok: gpu_carry.sh run -> gpu_check.sh perf, test and bench passed on stubs ($(wc -l < "$out/results.tsv") steps," \
     "$(wc -l < "$calls") program calls)"
