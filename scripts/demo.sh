#!/usr/bin/env bash
# README command 1: installs dependencies, builds ddprun and the ResNet example, and runs the main job:
# a two-rank data-parallel ResNet-18 training run on the CPU, on synthetic data, under ddprun (the launcher
# that gives workers torchrun's environment), with the tutorial's flags. Takes about a minute here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir="${DDP_BUILD_DIR:-build/demo}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCH=OFF
cmake --build "$build_dir" -j "$(nproc)" --target ddprun resnet
cd "$build_dir"
exec ./tools/ddprun --nproc-per-node 2 --standalone ./examples/resnet/resnet --backend gloo --use_syn --device cpu \
  --arch resnet18 --batch_size 16 --image_size 64 --steps_syn 20 --num_classes 100 --log_every 5
