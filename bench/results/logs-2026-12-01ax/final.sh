#!/usr/bin/env bash
# Session ax's validation calls on the final library (affine 8-bit's K-split rows staged from 13).
#   STEP=tests OUT=$OUT bash bench/results/logs-2026-12-01ax/final.sh  # build, every GPU test, sanitizers' workload, qmm_decode table
#   STEP=bench OUT=$OUT bash bench/results/logs-2026-12-01ax/final.sh  # build, decode step table, memcheck (one process) over the boundary
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
case ${STEP:-tests} in
  tests)
    WORKERS=16 SAN_TIMEOUT=60 OUT=$OUT/session bash scripts/gpu_session.sh build test kernels 2>&1 | tail -15
    echo "session $(( $(date +%s) - T0 )) s"
    left=$(( 570 - ($(date +%s) - T0) ))
    [ $left -gt 60 ] && QQ_BENCH_OUT="$OUT/tables" timeout $left python3 bench/bench_qmm.py --only decode > "$OUT/bench_qmm_decode.log" 2>&1
    tail -n 2 "$OUT/bench_qmm_decode.log"
    tar czf "$OUT/tables.tgz" -C "$OUT" tables bench_qmm_decode.log 2>/dev/null ;;
  bench)
    QUICK=1 OUT=$OUT/b bash scripts/gpu_session.sh build 2>&1 | tail -3
    echo "build $(( $(date +%s) - T0 )) s"
    # what invalidated a capture in test_gpu_gather_grouped (the tests call, this session)
    timeout 150 python3 bench/tune/capture_gc_probe.py > "$OUT/capture_gc_probe.txt" 2>&1; cat "$OUT/capture_gc_probe.txt"
    timeout 60 python3 -m pytest -q -m gpu -n 0 -p no:cacheprovider --tb=line tests/test_decode.py -k "gpu_gather_grouped and nvfp4" \
      > "$OUT/gather_alone.log" 2>&1; tail -n 1 "$OUT/gather_alone.log"
    echo "probe $(( $(date +%s) - T0 )) s"
    QQ_BENCH_OUT="$OUT/tables" timeout 240 python3 bench/bench_decode.py --budget-s 220 > "$OUT/bench_decode.log" 2>&1
    grep -E "True" "$OUT/bench_decode.log" | cut -c1-90 | head -40
    echo "bench $(( $(date +%s) - T0 )) s"
    left=$(( 575 - ($(date +%s) - T0) ))
    [ $left -gt 30 ] && timeout $left compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 --print-limit 20 \
      python3 -m pytest -q -m gpu -n 0 -p no:cacheprovider --tb=line tests/test_decode.py \
      -k "same_bits_for_every_m and a8 and 256" > "$OUT/memcheck.log" 2>&1
    grep -E "ERROR SUMMARY|Invalid" "$OUT/memcheck.log" | sort | uniq -c | head; tail -n 1 "$OUT/memcheck.log"
    echo "memcheck $(( $(date +%s) - T0 )) s"
    tar czf "$OUT/bench.tgz" -C "$OUT" tables bench_decode.log memcheck.log capture_gc_probe.txt gather_alone.log 2>/dev/null ;;
esac
