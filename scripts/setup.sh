#!/usr/bin/env bash
# Installs everything ddp's build, tests and demo need on a fresh Debian 12 machine, idempotently:
# Debian packages through apt-get, Conan through pip. Safe to run again; does nothing when all is present.
set -euo pipefail

debian_packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev python3
  doctest-dev libcxxopts-dev nlohmann-json3-dev libopenblas-dev
  openmpi-bin libopenmpi-dev
  mpich libmpich-dev          # beside Open MPI, which stays the default mpirun (tests/integration/mpich, docs/MPICH.md)
  slurm-wlm munge util-linux  # a real Slurm cluster per test (tests/integration/slurm, docs/SLURM.md)
  libturbojpeg0-dev libpng-dev python3-pil  # ImageFolder decoding; PIL writes the test images (tests/interop/image_folder)
  python3-torch python3-torchvision python3-numpy python3-sklearn
  python3-matplotlib          # tools/plot_metrics.py, bench/plot_all.py (tests/interop/tensorboard draws a run)
  iproute2 procps psmisc
)

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# TensorBoard's own reader checks our event files (tests/interop/tensorboard); Debian has no tensorboard package.
if ! /usr/bin/python3 -c 'import tensorboard' 2>/dev/null; then
  echo "setup: installing tensorboard from PyPI into /usr/bin/python3"
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "tensorboard==2.21.0"
fi

conan_version="2.34.0"
if ! python3 -m conans.conan --version 2>/dev/null | grep -q "$conan_version"; then
  echo "setup: installing conan $conan_version from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "conan==$conan_version"
fi
