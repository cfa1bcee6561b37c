#!/usr/bin/env bash
# Session bb's last device call: the final library (the affine encoders' exact quotient) built,
# every GPU test, then the whole bench_quantize (quantize-h200 / amax-h200 tables) in the time left.
#   OUT=$OUT QQ_COMMIT=<hash> bash bench/results/logs-2026-12-02bb/final.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
QUICK=1 OUT=$OUT/f bash scripts/gpu_session.sh build > /dev/null 2>&1 || { echo build failed; tail -30 $OUT/f/logs/build.log; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
WORKERS=16 OUT=$OUT/f timeout 300 bash scripts/gpu_session.sh test 2>&1 | tail -4
echo "tests $(( $(date +%s) - T0 )) s"
mkdir -p $OUT/t
QQ_BENCH_OUT=$OUT/t timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/bench_quantize.py > $OUT/t/bench_quantize.log 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s"
grep -E "affine" $OUT/t/bench_quantize.log | grep -E "copy|torch_compile" | cut -c1-120 | head -24
tar czf $OUT/final.tgz -C $OUT f/logs t
