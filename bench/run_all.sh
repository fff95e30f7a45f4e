#!/usr/bin/env bash
# bench/run_all.sh: every CPU comparison of ddp against its strongest reference, side by side on this machine,
# each pair in the same run: JSON lines per comparison and one PNG chart each (bench/plot_all.py).
# SPDX-License-Identifier: MIT
#
# Usage: bash bench/run_all.sh [--quick] [--out DIR] [--build DIR]
#   --out DIR    where the .jsonl files and PNGs go (default docs/perf: what the README shows)
#   --build DIR  the Release build it makes and uses (default build/bench; -O3, no -O1 check flags, CPU only)
#   --quick      fewer sizes and repetitions (a look in ~5 minutes, not numbers to publish)
# Comparisons (2 ranks unless said):
#   allreduce_mpi.jsonl     --backend mpi vs Open MPI's own MPI_Allreduce (mpi4py), 1 KiB..256 MiB, with the
#                           all-reduce in shared memory (one host, the default) and on MPI messages (--shm 0)
#   allreduce_tcp.jsonl     tcp backend (shared memory on one host) vs Open MPI (mpi4py) and vs PyTorch gloo,
#                           2 and 4 ranks
#   resnet_cpu.jsonl        one ResNet training step vs torchvision on PyTorch + oneDNN, 1 and 2 threads
#   gpt_cpu.jsonl           one training step of the DDP tutorial's minGPT vs the same model in PyTorch, 2 threads
#   ddp_overlap.jsonl       DDP step vs the bare step and one flat all-reduce of the same gradients; again with
#                           the training threads on CPU 0 and the communication threads on CPU 1
#   ddp_toy.jsonl           the multinode tutorial job vs PyTorch DDP (gloo) under torchrun
#   data.jsonl              ImageFolder DataLoader (224 px training transform) vs torchvision's DataLoader on the
#                           same generated JPEGs, 1 and 2 workers (skipped when ddp was built without ddp::image)
# Needs Debian's python3-torch, python3-torchvision, python3-pil, python3-mpi4py, python3-matplotlib and Open MPI:
# installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

out=docs/perf
build=build/bench
quick=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --out) out="${2:?--out needs a directory}"; shift ;;
    --build) build="${2:?--build needs a directory}"; shift ;;
    *) echo "bench/run_all.sh: unknown argument '$1' (usage: [--quick] [--out DIR] [--build DIR])" >&2; exit 2 ;;
  esac
  shift
done

py=/usr/bin/python3  # Debian's torch 1.13 and mpi4py live here, not in the first python3 on PATH
# The comparisons' own packages (not needed by the build or the tests, so scripts/setup.sh leaves them out).
missing=()
for pair in torch:python3-torch torchvision:python3-torchvision PIL:python3-pil mpi4py:python3-mpi4py \
    matplotlib:python3-matplotlib; do
  "$py" -c "import ${pair%%:*}" 2>/dev/null || missing+=("${pair#*:}")
done
command -v mpirun >/dev/null || missing+=(openmpi-bin libopenmpi-dev)
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "bench/run_all.sh: installing ${missing[*]} (Debian)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
  else
    echo "bench/run_all.sh: missing Debian packages: ${missing[*]} (apt-get install them, or run as root)" >&2
    exit 2
  fi
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDP_WITH_CUDA=OFF -DDDP_WITH_MPI=ON \
  -DDDP_BUILD_TESTS=OFF -DDDP_CHECK_OPT= -DDDP_BENCH_OPT= >/dev/null
cmake --build "$build" -j "$(nproc)" --target bench_allreduce bench_resnet_cpu bench_gpt_cpu bench_ddp_overlap ddprun multinode
# bench_data exists only with the JPEG/PNG decoders (ddp::image: libturbojpeg0-dev, libpng-dev).
have_data=0
# (The target list is read whole: with pipefail, grep -q exiting at its match made cmake's SIGPIPE fail the test.)
targets=$(cmake --build "$build" --target help)
if grep -q '^bench_data:' <<<"$targets"; then
  have_data=1
  cmake --build "$build" -j "$(nproc)" --target bench_data
fi

mkdir -p "$out"
allreduce="$build/bench/allreduce/bench_allreduce"
ddprun="$build/tools/ddprun"
if [[ $quick == 1 ]]; then
  sizes=(--max-bytes $((16 << 20))); reps=1; ar_reps=1; resnet=(--quick --repeats 1); gpt=(--quick); toy_epochs=2; overlap_steps=3
  data_epochs=1
else
  # 7 all-reduce repetitions: this VM's speed swings 2x between runs seconds apart (the median of 3 flipped ratios);
  # with the host in its slow state about half the time, each side gets a fast run in all but ~1% of sittings
  # (docs/decisions/0059)
  sizes=(--max-bytes $((256 << 20))); reps=3; ar_reps=7; resnet=(--repeats 3); gpt=(--repeats 5 --rounds 3); toy_epochs=5
  overlap_steps=30; data_epochs=3
fi

# run NAME CMD...: CMD's JSON lines (stdout) appended to $out/NAME.jsonl, each tagged with the comparison.
run() {
  local name=$1; shift
  echo "bench/run_all.sh: $name: $*" >&2
  "$@" | "$py" -c 'import json, re, sys
for line in sys.stdin:  # a JSON line, possibly behind ddprun'"'"'s "[rank0]: " prefix
    m = re.match(r"(\[rank\d+\]: )?(\{.*)", line)
    if m:
        row = json.loads(m.group(2)); row["comparison"] = sys.argv[1]; print(json.dumps(row), flush=True)' "$name" \
    | tee -a "$out/$name.jsonl"
}

rm -f "$out"/{allreduce_mpi,allreduce_tcp,resnet_cpu,gpt_cpu,ddp_overlap,ddp_toy,data}.jsonl
for shm in 1 0; do  # shared memory (one host, the default) and MPI messages (the path across hosts)
  run allreduce_mpi "$py" bench/allreduce/compare_mpi.py "$allreduce" --np 2 --reps "$ar_reps" --shm "$shm" "${sizes[@]}"
done
for np in 2 4; do
  run allreduce_tcp "$py" bench/allreduce/compare_mpi.py "$allreduce" --ours tcp --np "$np" --reps "$ar_reps" "${sizes[@]}"
  run allreduce_tcp "$py" bench/allreduce/compare_gloo.py "$allreduce" --nproc "$np" --min-bytes 1024 "${sizes[@]}"
done
run resnet_cpu "$build/bench/resnet_cpu/bench_resnet_cpu" "${resnet[@]}"
run gpt_cpu "$build/bench/gpt_cpu/bench_gpt_cpu" "${gpt[@]}"
run ddp_overlap "$ddprun" --nproc-per-node 2 --standalone "$build/bench/ddp_overlap/bench_ddp_overlap" \
  --steps "$overlap_steps" --threads 1
# The same with a core of its own for communication: both ranks' training threads on CPU 0, their progress
# threads on CPU 1 (--comm-cpus), so the all-reduces can hide behind backward.
if [[ $(nproc) -ge 2 ]]; then
  run ddp_overlap taskset -c 0 "$ddprun" --nproc-per-node 2 --standalone "$build/bench/ddp_overlap/bench_ddp_overlap" \
    --steps "$overlap_steps" --threads 1 --comm-cpus 1
fi
run ddp_toy "$py" bench/ddp_toy/compare.py "$ddprun" "$build/examples/multinode/multinode" --epochs "$toy_epochs"
if [[ $have_data == 1 ]]; then
  run data "$py" bench/data/compare.py "$build/bench/data/bench_data" --workers 1,2 --epochs "$data_epochs" \
    --repeats "$reps"
else
  echo "bench/run_all.sh: data skipped: $build has no bench_data (ddp::image needs libturbojpeg0-dev libpng-dev)" >&2
fi

"$py" bench/plot_all.py "$out"
echo "bench/run_all.sh: results and charts in $out"
