#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every arch's code path on one GPU (an H200): the evidence of the generic passes (the other
# arches' recurrence_kernel passes, records in fragment order) and of sm_120's simulated
# limits beside the default mode, in one call from the repository root with this tree's
# flash_kda importable (PYTHONPATH=python with its library built beside it). The planted-stall
# test needs a library built with -DFLASH_KDA_DEBUG_WAITS=ON (it skips on a release build).
#   bash ci/arches_gpu.sh [stage ...]
#   stages: arches suite hashes sanitize coverage plans speed (default: all)
# Results go to $OUT or ./arches-out: log.txt, hashes-*.json, coverage.json, speed-*.json.
# Times are estimates for an H200 (about 8 minutes in all, speed stage included).
set -uo pipefail
out=${OUT:-$PWD/arches-out}
mkdir -p "$out"
log=$out/log.txt
export PYTHONUNBUFFERED=1 FLASH_KDA_TEST_WAIT_LIMIT_S=${FLASH_KDA_TEST_WAIT_LIMIT_S:-20}
stages=${*:-arches suite hashes sanitize coverage plans speed}
status=0
run() {  # run LIMIT_S COMMAND...: bounded, logged as it goes
  local limit=$1
  shift
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { status=1; echo "FAILED (rc $rc): $*" | tee -a "$log"; }
}
python3 -c "from flash_kda import testing; print('debug waits:', testing.debug_waits())" | tee -a "$log"
pytest="python3 -m pytest -p no:cacheprovider -q -rfs"
gpu_tests="tests/test_fwd_gpu.py tests/test_segments_gpu.py tests/test_chunk32_gpu.py tests/test_gates_gpu.py"
for stage in $stages; do
  echo "=== $stage ($(date +%T))" | tee -a "$log"
  case $stage in
    arches)  # ~20 s: every mode's bits against the default path's, the planted stall (debug build)
      run 180 $pytest tests/test_arches_gpu.py ;;
    suite)  # ~150 s: the kernels' GPU tests (every pass, chunk length and gate form) in the two other modes
      for mode in generic sm120; do
        # shellcheck disable=SC2086
        run 240 env FLASH_KDA_TEST_MODE=$mode $pytest -m "gpu and not slow" $gpu_tests
      done ;;
    hashes)  # ~30 s: exact-mode outputs in generic and sm120 mode against the default mode's
      run 120 python3 benchmarks/output_hashes.py "$out/hashes-default.json"
      for mode in generic sm120; do
        run 120 python3 benchmarks/output_hashes.py "$out/hashes-$mode.json" --mode $mode \
          --against "$out/hashes-default.json"
      done ;;
    sanitize)  # ~150 s: memcheck and racecheck over ci/sanitize_cases.py in the three modes
      for mode in default generic sm120; do
        for tool in memcheck racecheck; do
          run 240 env FLASH_KDA_TEST_MODE=$mode compute-sanitizer --tool $tool --error-exitcode 9 \
            python3 ci/sanitize_cases.py
        done
      done ;;
    coverage)  # ~15 s: the instantiations and ring depths each mode runs, against those built
      run 180 python3 benchmarks/arch_coverage.py --out "$out/coverage.json" ;;
    plans)  # ~10 s, no GPU work: the plans over simulated devices and SM counts
      run 120 python3 benchmarks/plan_grid.py --summary --device all --sms 20,48,84,132,148,170,188 ;;
    speed)  # ~90 s: the table's rows (bench_fwd's default) in generic mode (the mma.sync estimate) beside the default
      for mode in default generic; do
        run 300 python3 benchmarks/bench_fwd.py --mode $mode --out "$out/speed-$mode.json"
      done ;;
    *) echo "unknown stage $stage" | tee -a "$log"; status=2 ;;
  esac
done
exit $status
