#!/usr/bin/env bash
# Builds the Conan package and runs test_package. No Conan remote is reachable here, so the profile
# .ci/conan/platform declares cxxopts, nlohmann_json and doctest as provided by the platform (Debian's
# -dev packages) and --no-remote keeps Conan offline.
set -euo pipefail
cd "$(dirname "$0")/.."
conan() { python3 -m conans.conan "$@"; }
export CONAN_HOME="${CONAN_HOME:-$PWD/build/conan-home}"
conan profile detect --force >/dev/null 2>&1 || conan profile detect --force
conan create . --profile:all .ci/conan/platform --build=missing --no-remote
