#!/usr/bin/env bash
# Sanitizer builds of a chosen subset of the tests. scripts/test.sh runs the TSan one after the main suite (so CI
# does); CI's ASan+UBSan coverage of the same unit tests comes from its main build (DDP_SANITIZE_UNIT,
# docs/decisions/0041).
# SPDX-License-Identifier: MIT
#
#   address,undefined (ASan + UBSan): unit_core unit_env unit_store unit_comm unit_tensor unit_data unit_train
#                     unit_optim unit_kernels unit_autograd unit_nn unit_parallel (every unit test), multiproc_comm, multiproc_shm
#   thread (TSan):    unit_store, unit_parallel, multiproc_comm, multiproc_shm (ctest), and unit_comm without its
#                     "every collective matches the reference" cases (run directly with a doctest filter):
#                     those check arithmetic over every dtype and size, take ~4 min per dtype under TSan, and
#                     exercise the same threads as the cases that stay (async ops, send/recv, subgroups,
#                     mismatches, timeouts, shm). They run in full under ASan and in the main suite.
#
# Each is its own build (DDP_SANITIZE, see cmake/DdpSanitize.cmake) at -g1 (ASan -O0, TSan -O1), CPU only:
# CUDA and NCCL are not built, MPI is off (Open MPI is not instrumented and reports its own internals), and
# BLAS is off so GEMMs run ddp's portable loops, which the sanitizers see, instead of uninstrumented OpenBLAS threads.
# Any sanitizer report fails the test that produced it (UBSan does not recover, TSan halts on error).
# Environment: DDP_SANITIZE_BUILD_DIR (default build/sanitize; builds go to <dir>-asan and <dir>-tsan),
# DDP_JOBS (default: cores), DDP_SANITIZE_ONLY=asan|tsan (one of the two).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${DDP_JOBS:-$(nproc)}"
base="${DDP_SANITIZE_BUILD_DIR:-build/sanitize}"
only="${DDP_SANITIZE_ONLY:-}"
# -g1: line tables only, all a sanitizer report needs (file:line per frame); a third less compile time than -g.
# The optimisation level is each build's (run's 5th argument): ASan+UBSan at -O0, which compiles in 57% of
# -O1's time (test_bad_inputs: 43 s vs 76 s) and finds the same errors, but unit_comm at -O1 (tests/CMakeLists.txt:
# at -O0 its reference sweeps pass 120 s); TSan at -O1, where -O0 runs too slowly.
# -DDDP_UNITY_TESTS=ON: one translation unit per test executable (tests/CMakeLists.txt, docs/decisions/0041).
common=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DDDP_UNITY_TESTS=ON
        -DDDP_WITH_CUDA=OFF -DDDP_WITH_NCCL=OFF -DDDP_WITH_MPI=OFF -DDDP_WITH_BLAS=OFF)

# The targets each build compiles, and the ctest names it runs (exactly these; nothing else is built).
asan_targets=(unit_core unit_env unit_store unit_comm unit_tensor unit_data unit_train unit_optim unit_kernels
              unit_autograd unit_nn unit_parallel multiproc_comm multiproc_shm comm_worker)
asan_tests='^(unit_(core|env|store|comm|tensor|data|train|optim|kernels|autograd|nn|parallel)|multiproc_(comm|shm))$'
tsan_targets=(unit_store unit_comm unit_parallel multiproc_comm multiproc_shm comm_worker)
tsan_tests='^(unit_(store|parallel)|multiproc_(comm|shm))$'
tsan_unit_comm_filter='-tce=*every collective matches the reference*'

# shellcheck source=scripts/sanitizer_env.sh
source scripts/sanitizer_env.sh

# run <name> <sanitizers> <ctest regex> <extra command or ""> <-O level> <targets...>: configure, build, run
# the ctest tests and the extra command (relative to the build directory); prints the seconds of each part.
run() {
  local name=$1 sanitize=$2 regex=$3 extra=$4 opt=$5
  shift 5
  local dir="$base-$name" t0 t1 t2
  t0=$(date +%s)
  cmake -S . -B "$dir" "${common[@]}" "-DCMAKE_CXX_FLAGS_DEBUG=$opt -g1" "-DDDP_SANITIZE=$sanitize" \
    > "$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$jobs" --target "$@"
  t1=$(date +%s)
  # The extra command runs next to ctest (each is single-threaded most of the time), and both must pass.
  local extra_pid=""
  if [[ -n "$extra" ]]; then
    (cd "$dir" && eval "$extra") > "$dir.extra.log" 2>&1 &
    extra_pid=$!
  fi
  local rc=0
  ctest --test-dir "$dir" -R "$regex" -j "$jobs" --output-on-failure --timeout 600 || rc=1
  if [[ -n "$extra_pid" ]]; then
    if wait "$extra_pid"; then
      tail -n 3 "$dir.extra.log"
    else
      cat "$dir.extra.log"
      echo "scripts/sanitize.sh: $sanitize: FAILED: $extra"
      rc=1
    fi
  fi
  t2=$(date +%s)
  echo "scripts/sanitize.sh: $sanitize: build $((t1 - t0)) s, tests $((t2 - t1)) s"
  return "$rc"
}

mkdir -p "$(dirname "$base")"
if [[ -z "$only" || "$only" == asan ]]; then
  run asan address,undefined "$asan_tests" "" -O0 "${asan_targets[@]}"
fi
if [[ -z "$only" || "$only" == tsan ]]; then
  run tsan thread "$tsan_tests" "timeout 600 tests/unit_comm '$tsan_unit_comm_filter'" -O1 "${tsan_targets[@]}"
fi
