#!/usr/bin/env bash
# README command 2: installs dependencies, builds everything (CUDA code too when nvcc is found), runs every
# test, then builds and tests the Conan package. Exit status 0 only when all of it passed.
# Environment: DDP_BUILD_DIR (default build/test), DDP_JOBS (default: cores), DDP_CTEST_ARGS (extra ctest args),
# DDP_SANITIZERS=0 (unit tests built without ASan+UBSan, no TSan build: quicker local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh

build_dir="${DDP_BUILD_DIR:-build/test}"
jobs="${DDP_JOBS:-$(nproc)}"
# Build speed (docs/decisions/0037, 0041, 0047): tests are compiled at -O1 (the examples, which the tests run, at
# -O3), each test executable's C++ files as one translation unit; the benchmarks are only checked (-fsyntax-only,
# no link); without a GPU every .cu file is unoptimised (host -O0, device -G) and the GPU-only tests go to PTX only:
# they only have to compile.
compile_only=OFF
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || compile_only=ON
# The unit tests and the multi-process comm tests are compiled once, with ASan+UBSan (DDP_SANITIZE_UNIT,
# docs/decisions/0041), and run instrumented in the main suite; DDP_SANITIZERS=0 builds them plain and skips the TSan
# build (local runs).
sanitize_unit=address,undefined
[[ "${DDP_SANITIZERS:-1}" != 0 ]] || sanitize_unit=""
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DDDP_CUDA_COMPILE_ONLY=$compile_only" -DDDP_CHECK_OPT=-O1 -DDDP_BENCH_CHECK_ONLY=ON \
  "-DDDP_SANITIZE_UNIT=$sanitize_unit" -DDDP_UNITY_TESTS=ON
cmake --build "$build_dir" -j "$jobs"
# shellcheck source=scripts/sanitizer_env.sh
source scripts/sanitizer_env.sh
# shellcheck disable=SC2086
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure --timeout 900 ${DDP_CTEST_ARGS:-}

# Then the TSan build of a subset of the tests (scripts/sanitize.sh says which).
if [[ "${DDP_SANITIZERS:-1}" != 0 ]]; then
  DDP_JOBS="$jobs" DDP_SANITIZE_ONLY=tsan bash scripts/sanitize.sh
else
  echo "scripts/test.sh: sanitizers skipped (DDP_SANITIZERS=0)"
fi

bash scripts/conan_create.sh
echo "scripts/test.sh: all passed in $(( $(date +%s) - start )) s"
