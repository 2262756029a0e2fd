#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The GPU session in one call (the device machine starts bare and has no network).
# Carry .whl/ (git-ignored) holding: the flash_kda_bin wheel built on the CPU machine
# (FLASH_KDA_CUDA_ARCHS=90a or all), nvidia-cutlass, fla-core, flash-linear-attention,
# einops, and pytest with its dependencies. Usage, from the repository root:
#   bash ci/device_run.sh [stage ...]      stages: info tests slow sanitize bench (default: all)
# Logs and results go to $OUT (the device tool's output folder) or ./device-out.
set -uo pipefail
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
stages=${*:-info tests slow sanitize bench}
limit=${STAGE_TIMEOUT:-540}  # seconds per command: a hung kernel must not eat the lease
status=0
for stage in $stages; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    info)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$out/nvidia-smi.txt"
      timeout $limit python3 -m flash_kda info 2>&1 | tee "$out/info.txt"
      timeout $limit python3 -m flash_kda check 2>&1 | tee "$out/check.txt" || status=1 ;;
    tests)
      timeout $limit python3 -m pytest -m "gpu and not slow" -p no:cacheprovider -q -rs tests 2>&1 | tee "$out/pytest-gpu.txt" || status=1 ;;
    slow)
      timeout $limit python3 -m pytest -m "gpu and slow" -p no:cacheprovider -q -rs tests 2>&1 | tee "$out/pytest-gpu-slow.txt" || status=1 ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout $limit compute-sanitizer --tool $tool --error-exitcode 9 python3 ci/sanitize_cases.py 2>&1 \
          | tee "$out/sanitize-$tool.txt" || status=1
      done ;;
    bench)
      timeout $limit python3 benchmarks/bench_fwd.py --out "$out/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.txt" || status=1 ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
exit $status
