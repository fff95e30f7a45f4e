#!/usr/bin/env bash
# Copies the header-only packages ddp builds with (doctest, cxxopts, nlohmann_json: headers and CMake package
# files) from this Debian machine into .gpu_deps/ (git-ignored), for a GPU machine that has CUDA, CMake and
# PyTorch but not these packages and cannot fetch them. scripts/gpu_check.sh finds .gpu_deps by itself; with the
# device tool, name .gpu_deps in `carry`. About 1.5 MiB.
# SPDX-License-Identifier: MIT
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
rm -rf .gpu_deps
mkdir -p .gpu_deps/include .gpu_deps/lib/cmake .gpu_deps/share/cmake
cp -r /usr/include/doctest /usr/include/nlohmann /usr/include/cxxopts.hpp .gpu_deps/include/
cp -r /usr/lib/cmake/doctest /usr/lib/cmake/cxxopts .gpu_deps/lib/cmake/
cp -r /usr/share/cmake/nlohmann_json .gpu_deps/share/cmake/
echo "gpu_deps: $(du -sh .gpu_deps | cut -f1) in .gpu_deps (doctest, cxxopts, nlohmann_json)"
