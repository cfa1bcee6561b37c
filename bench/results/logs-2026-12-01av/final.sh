#!/usr/bin/env bash
# Session av's validation call on the final library: build, every GPU test and the
# sanitizers' kernel workload (gpu_session.sh), compute-sanitizer memcheck over the grouped
# gather tests (the staged items), bench_qmm --only gather (the table) and gather_ab.py.
set -uo pipefail
OUT=${OUT:-/tmp/final}; mkdir -p "$OUT"
T0=$(date +%s)
WORKERS=16 SAN_TIMEOUT=60 OUT=$OUT/session bash scripts/gpu_session.sh build test kernels
echo "session $(( $(date +%s) - T0 )) s"
timeout 150 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 --print-limit 20 \
  python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider --tb=line tests/test_decode.py -k "gpu_gather_grouped" \
  > "$OUT/memcheck_gather.log" 2>&1
grep -E "ERROR SUMMARY|Invalid" "$OUT/memcheck_gather.log" | sort | uniq -c | head; tail -n 1 "$OUT/memcheck_gather.log"
echo "memcheck $(( $(date +%s) - T0 )) s"
QQ_BENCH_OUT="$OUT/tables" timeout 120 python3 bench/bench_qmm.py --only gather > "$OUT/bench_gather.log" 2>&1
tail -n 3 "$OUT/bench_gather.log"
echo "bench $(( $(date +%s) - T0 )) s"
timeout 100 python3 bench/tune/gather_ab.py --no-dense --modes nvfp4,mxfp8,affine4 --tokens 4,16,64 > "$OUT/gather_ab.txt" 2>&1
echo "gather_ab $(( $(date +%s) - T0 )) s"
tar czf "$OUT/final.tgz" -C "$OUT" memcheck_gather.log tables bench_gather.log gather_ab.txt 2>/dev/null
