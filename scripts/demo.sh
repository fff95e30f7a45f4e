#!/usr/bin/env bash
# README command 1: installs dependencies, builds the examples, and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir="${DDP_BUILD_DIR:-build/demo}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCH=OFF
cmake --build "$build_dir" -j "$(nproc)" --target hello_store
"$build_dir/examples/hello_store/hello_store" --ranks 4
