#!/usr/bin/env bash
# Usage: without_gpu.sh <scripts/gpu_check.sh>. Exit 0 when the script refused correctly, 77 on a GPU machine.
# SPDX-License-Identifier: MIT
set -u
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "SKIP: a GPU is present; run scripts/gpu_check.sh itself"
  exit 77
fi
out=$(mktemp -d /tmp/ddp_gpu_check_test.XXXXXX)
trap 'rm -rf "$out"' EXIT
bash "$1" "$out" > "$out/stdout" 2>&1
rc=$?
cat "$out/stdout"
[ "$rc" -eq 77 ] || { echo "FAIL: expected exit 77 without a GPU, got $rc"; exit 1; }
grep -q '^| result | no GPU: nvidia-smi ' "$out/report.md" || { echo "FAIL: report.md does not name the reason"; cat "$out/report.md"; exit 1; }
grep -q 'SKIP: no GPU' "$out/stdout" || { echo "FAIL: stdout does not say why"; exit 1; }
bash "$1" "$out" --phase nonsense > /dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: an unknown --phase must be a usage error (exit 2)"; exit 1; }
echo "ok: gpu_check.sh exits 77 without a GPU and names the reason"
