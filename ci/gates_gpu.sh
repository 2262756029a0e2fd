#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The gate and beta forms and the stable inverse (design sections 2.5, 2.6) on a GPU, in one
# call, from the repository root with this tree's flash_kda importable (PYTHONPATH=python with
# its library built beside it, or the installed wheel) and fla for the comparisons. Their
# kernels run by default only where an arch table enables them (flash_kda.h
# FLASH_KDA_FEATURE_GATE_FORMS, STABLE_INVERSE: sm_90a): every stage reaches them through
# flash_kda.testing's overrides unvalidated_forms and stable_inverse (the tests' fixtures,
# ab_graph's LIB:stable), so that it runs them on any arch.
#   bash ci/gates_gpu.sh [stage ...]   stages: residuals tests fla bits speed sanitize (default: all)
# BASELINE=DIR (optional): another tree's python/ with its own library (main's, say): the bits
# stage compares output hashes against it and the speed stage times its bounded gate beside
# this library's three gates; the speed stage also times each gate with the stable inverse
# against the same gate without it (its cost). Results go to $OUT or ./gates-out:
# log.txt, gates.jsonl (every accuracy number, FLASH_KDA_GATES_LOG), speed.json.
set -uo pipefail
out=${OUT:-$PWD/gates-out}
mkdir -p "$out"
log=$out/log.txt
export PYTHONUNBUFFERED=1 FLASH_KDA_GATES_LOG=$out/gates.jsonl
stages=${*:-residuals tests fla bits speed sanitize}
limit=${STAGE_TIMEOUT:-600}
status=0
run() { timeout "$limit" "$@" 2>&1 | tee -a "$log"; [ "${PIPESTATUS[0]}" = 0 ] || { status=1; echo "FAILED: $*" | tee -a "$log"; }; }
lib=$(python3 -c "import flash_kda._native as n; print(n.library_path())")
rows="T8192-N1-H96 T8192-N1-H48 T8192-N1-H24 T8192-N1-H12 T8192-N1-H6 T32768-N1-H96 T32768-N1-H6
      T131072-N1-H4 T1048576-N1-H1 varlen6-H96 8x1024-H8 64x512-H8"
for stage in $stages; do
  echo "=== $stage ($(date +%T))" | tee -a "$log"
  case $stage in
    residuals)
      run python3 ci/gate_residuals.py ;;
    tests)
      run python3 -m pytest -p no:cacheprovider -q -rfs tests/test_gates_gpu.py tests/test_gates_accuracy_gpu.py ;;
    fla)  # fla's chunk_kda in each flag combination and KDAForCausalLM's default (unbounded) model routed here
      run python3 -m pytest -p no:cacheprovider -q -rfs tests/test_fla_backend_gpu.py ;;
    bits)
      run python3 -m pytest -p no:cacheprovider -q -rfs tests/test_fwd_gpu.py tests/test_chunk32_gpu.py \
        tests/test_segments_gpu.py -k "bitwise or records or whole_pass or two_segments or warpgroup"
      if [ -n "${BASELINE:-}" ]; then
        run env PYTHONPATH="$BASELINE:${PYTHONPATH:-}" python3 benchmarks/output_hashes.py "$out/hashes-baseline.json"
        run python3 benchmarks/output_hashes.py "$out/hashes.json" --against "$out/hashes-baseline.json"
      fi ;;
    speed)
      libs="$lib:gate=lower_bound+softplus+log_decay $lib:stable:gate=lower_bound+softplus+log_decay"
      [ -n "${BASELINE:-}" ] && libs="$BASELINE/flash_kda/libflash_kda.so:py=$BASELINE $libs"
      # shellcheck disable=SC2086
      run python3 benchmarks/ab_graph.py --rounds 2 --json "$out/speed.json" --libs $libs $rows ;;
    sanitize)
      for tool in memcheck racecheck; do
        run compute-sanitizer --tool "$tool" --error-exitcode 9 python3 ci/sanitize_cases.py gates
      done ;;
    *) echo "unknown stage $stage" | tee -a "$log"; status=2 ;;
  esac
done
exit $status
