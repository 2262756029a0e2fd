#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The GPU run in one call (the device machine starts bare and has no network).
# Carry .whl/ (git-ignored) holding: the flash_kda_bin wheel built on the CPU machine
# (FLASH_KDA_CUDA_ARCHS=90a or all), fla-core and flash-linear-attention (pytest,
# hypothesis, einops, transformers and matplotlib are in the device image). Usage, from
# the repository root:
#   bash ci/device_run.sh [stage ...]   stages: info tests slow sanitize bench host gates (default:
#   all but gates; gates runs ci/gates_gpu.sh, the gate forms' and the stable inverse's checks)
# Logs and results go to $OUT (the device tool's output folder) or ./device-out; at most
# eight files come back, so every stage appends to one log.
set -uo pipefail
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
log=$out/log.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
stages=${*:-info tests slow sanitize bench host}
limit=${STAGE_TIMEOUT:-540}  # seconds per command: a hung kernel must not eat the lease
# PYTEST_WORKERS=N runs the test stages on N pytest-xdist workers (8 have run the suite on
# an H200). Each result has its own line (-v), so a log the limit cuts short still names
# every test that ran and how it ended.
xdist=${PYTEST_WORKERS:+-n $PYTEST_WORKERS}
status=0
run() { timeout "$limit" "$@" >> "$log" 2>&1 || { status=1; echo "FAILED: $*" >> "$log"; }; }
for stage in $stages; do
  echo "=== $stage ($(date +%T))" | tee -a "$log"
  case $stage in
    info)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> "$log" 2>&1
      run python3 -m flash_kda info
      run python3 -m flash_kda check ;;
    tests)
      run python3 -m pytest -m "gpu and not slow" -p no:cacheprovider -v -rfs $xdist tests ;;
    slow)
      run python3 -m pytest -m "gpu and slow" -p no:cacheprovider -v -rfs $xdist tests ;;
    sanitize)
      for tool in memcheck racecheck; do
        run compute-sanitizer --tool "$tool" --error-exitcode 9 python3 ci/sanitize_cases.py
      done ;;
    bench)
      run python3 benchmarks/bench_fwd.py --out "$out/bench.json" --plot --pools --sustained 3
      run python3 benchmarks/plot.py "$out/bench.json" "$out/heads.png" ;;
    host)  # host time of eager calls, eager against graph per table row (benchmarks/results/host.json)
      run python3 benchmarks/bench_host.py --json "$out/host.json" ;;
    gates)
      run env OUT="$out/gates" bash ci/gates_gpu.sh ;;
    *) echo "unknown stage $stage" | tee -a "$log"; status=2 ;;
  esac
done
grep -E "passed|failed|FAILED|ERROR SUMMARY|RACECHECK SUMMARY" "$log"
exit $status
