#!/usr/bin/env bash
# Short GPU leases: build the GPU binaries where there is no GPU (no device time spent), carry them to the GPU
# machine, run scripts/gpu_check.sh there. What the first GPU session (2026-11-27) did by hand:
#   bash scripts/gpu_carry.sh pack        # here: build/gpu for sm_90a, then .gpu_carry/build_gpu.tar.xz (~5.5 MB)
#   bash scripts/gpu_carry.sh run OUT     # there, with .gpu_carry carried: unpack, run gpu_check.sh into OUT
# pack configures build/gpu in Release with CUDA, NCCL and cuDNN but without MPI, BLAS and the image decoders, so
# the binaries need only the CUDA libraries (libcudart, libcublas, libcudnn, libnccl), which `run` finds beside
# the GPU machine's python3 torch (its nvidia-* wheels) and in /usr/local/cuda; a 2-core machine builds the GPU
# targets in about 12 minutes. The archive holds no object files. ctest files name this checkout's absolute
# path, so `run` links that path to the checkout it runs in when it does not exist there.
# run passes its environment to gpu_check.sh (DDP_GPU_BUDGET_S, DDP_GPU_SKIP, DDP_GPU_BENCH_ROWS, ...; default
# phases: test and bench, DDP_GPU_PHASES to change, e.g. "perf test": one gpu_check.sh call for them all, so
# that DDP_GPU_BUDGET_S covers the whole call) and packs the logs into OUT/gpu_check_logs.tgz, since the
# device tool brings back at most 8 files. tests/gpu/check/dry_run.sh runs `run` here with stub binaries.
# Environment (pack): DDP_GPU_ARCH (CMAKE_CUDA_ARCHITECTURES, default 90a), DDP_GPU_JOBS (default nproc).
# SPDX-License-Identifier: MIT
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
carry=.gpu_carry
targets=(unit_kernels_cuda unit_nn_cuda unit_parallel_cuda unit_tensor_cuda unit_autograd_cuda gpu_smoke gpu_sync_check
         gpu_ddp gpu_staged gpu_nccl ddprun resnet multinode mingpt bench_resnet_gpu)

case ${1:-} in
  pack)
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    [ -x "$nvcc" ] || { echo "gpu_carry: no nvcc (PATH or /usr/local/cuda/bin)" >&2; exit 2; }
    cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDP_CUDA_COMPILE_ONLY=OFF -DDDP_WITH_CUDA=ON \
      -DDDP_WITH_NCCL=ON -DDDP_WITH_MPI=OFF -DDDP_WITH_BLAS=OFF -DDDP_WITH_IMAGE=OFF \
      "-DCMAKE_CUDA_ARCHITECTURES=${DDP_GPU_ARCH:-90a}" "-DCMAKE_CUDA_COMPILER=$nvcc" > /dev/null
    cmake --build build/gpu -j "${DDP_GPU_JOBS:-$(nproc)}" --target "${targets[@]}"
    mkdir -p "$carry"
    echo "$repo" > "$carry/root"
    tar cf - --exclude='*.o' --exclude='*.a' --exclude=CMakeFiles --exclude='.ninja_*' --exclude=build.ninja \
      build/gpu | xz -T0 -6 > "$carry/build_gpu.tar.xz"
    echo "gpu_carry: $(du -h "$carry/build_gpu.tar.xz" | cut -f1) in $carry/build_gpu.tar.xz; carry $carry, then" \
         "run: bash scripts/gpu_carry.sh run \$OUT"
    ;;
  run)
    [ $# -ge 2 ] || { echo "usage: $0 run OUT_DIR" >&2; exit 2; }
    out=$2
    [ -f "$carry/build_gpu.tar.xz" ] || { echo "gpu_carry: no $carry/build_gpu.tar.xz: run 'pack' first" >&2; exit 2; }
    tar xJf "$carry/build_gpu.tar.xz"
    root=$(cat "$carry/root")
    if [ "$root" != "$repo" ] && [ ! -e "$root" ]; then mkdir -p "$(dirname "$root")" && ln -s "$repo" "$root"; fi
    site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null || true)
    libs=$(find ${site:+"$site/nvidia"} /usr/local/cuda/lib64 -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u |
           paste -sd:)
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export DDP_GPU_BUILD=build/gpu
    phase_args=()
    for phase in ${DDP_GPU_PHASES:-test bench}; do phase_args+=(--phase "$phase"); done
    rc=0
    bash scripts/gpu_check.sh "$out" "${phase_args[@]}" || rc=$?
    (cd "$out" && tar czf gpu_check_logs.tgz logs && rm -rf logs)
    exit "$rc"
    ;;
  *)
    echo "usage: $0 pack | run OUT_DIR" >&2
    exit 2
    ;;
esac
