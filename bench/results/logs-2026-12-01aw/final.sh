#!/usr/bin/env bash
# Session aw's validation call on the final library: build, every GPU test and the sanitizers'
# kernel workload (gpu_session.sh), bench_qmm --only decode / gather (the tables), then
# compute-sanitizer memcheck, one process, over the grouped gathers (24-row items) and affine's
# every-M bits at K = 8192 (staged where K is split, rows split over blocks).
set -uo pipefail
OUT=${OUT:-/tmp/final}; mkdir -p "$OUT"
T0=$(date +%s)
WORKERS=16 SAN_TIMEOUT=60 OUT=$OUT/session bash scripts/gpu_session.sh build test kernels
echo "session $(( $(date +%s) - T0 )) s"
QQ_BENCH_OUT="$OUT/tables" timeout 60 python3 bench/bench_qmm.py --only decode > "$OUT/bench_decode.log" 2>&1
QQ_BENCH_OUT="$OUT/tables" timeout 100 python3 bench/bench_qmm.py --only gather > "$OUT/bench_gather.log" 2>&1
tail -n 2 "$OUT/bench_decode.log" "$OUT/bench_gather.log"
echo "bench $(( $(date +%s) - T0 )) s"
left=$(( 570 - ($(date +%s) - T0) ))
[ $left -gt 30 ] && timeout $left compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 --print-limit 20 \
  python3 -m pytest -q -m gpu -n 0 -p no:cacheprovider --tb=line tests/test_decode.py \
  -k "gpu_gather_grouped or (same_bits_for_every_m and a4g64 and 8192)" > "$OUT/memcheck.log" 2>&1
grep -E "ERROR SUMMARY|Invalid" "$OUT/memcheck.log" | sort | uniq -c | head; tail -n 1 "$OUT/memcheck.log"
echo "memcheck $(( $(date +%s) - T0 )) s"
tar czf "$OUT/final.tgz" -C "$OUT" memcheck.log tables bench_decode.log bench_gather.log 2>/dev/null
