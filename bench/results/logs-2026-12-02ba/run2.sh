#!/usr/bin/env bash
# Session ba's second device call: the same build as run 1 (b1377a0 + .cutlass + .cublas 13.10
# headers), bench_quantize --quick on the quantize kernel that now reads a.gs[b * a.gs_stride]
# (rows + moe), then the whole GPU suite (run 1's was cut at 94% by the call's 600 s limit).
#   OUT=$OUT QQ_COMMIT=<hash> bash bench/results/logs-2026-12-02ba/run2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
QUICK=1 OUT=$OUT/b bash scripts/gpu_session.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
mkdir -p $OUT/q
for o in quantize moe; do
  QQ_BENCH_OUT=$OUT/q timeout 100 python3 bench/bench_quantize.py --quick --only $o > $OUT/q/bench_$o.log 2>&1
  tail -30 $OUT/q/bench_$o.log | grep -E "quantize|moe" | head -30
done
echo "bench $(( $(date +%s) - T0 )) s"
tar czf $OUT/q.tgz -C $OUT q
LEFT=$(( 575 - ($(date +%s) - T0) ))
WORKERS=16 OUT=$OUT/f timeout $LEFT bash scripts/gpu_session.sh test 2>&1 | tail -12
echo "all $(( $(date +%s) - T0 )) s"
