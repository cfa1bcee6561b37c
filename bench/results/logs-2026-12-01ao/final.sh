#!/usr/bin/env bash
# Session ao's last device calls, on the final library (qmmp.cu's hoisted consumer operands).
#   STEP=tests OUT=$OUT bash bench/results/logs-2026-12-01ao/final.sh   # build, python -m qq, every GPU test, sanitizers
#   STEP=bench OUT=$OUT bash bench/results/logs-2026-12-01ao/final.sh   # (same machine, built) decode tables
set -uo pipefail
export PYTHONUNBUFFERED=1
case ${STEP:-tests} in
  tests)
    WORKERS=16 OUT="$OUT/f" bash scripts/gpu_session.sh build test kernels 2>&1 | tail -12 ;;
  bench)
    mkdir -p "$OUT/f/logs" "$OUT/f/results"
    QQ_BENCH_OUT="$OUT/f/results" timeout 260 python3 bench/bench_decode.py --budget-s 240 > "$OUT/f/logs/bench_decode.log" 2>&1
    grep -E "True" "$OUT/f/logs/bench_decode.log" | cut -c1-80 | head -40
    QQ_BENCH_OUT="$OUT/f/results" timeout 150 python3 bench/bench_qmm.py --only decode > "$OUT/f/logs/bench_qmm_decode.log" 2>&1
    tail -3 "$OUT/f/logs/bench_qmm_decode.log"
    LAYOUTS=decode MS=1,16,32,64 MODES=nvfp4,mxfp8,affine4 timeout 120 python3 bench/tune/decode_graph.py > "$OUT/f/logs/decode_graph.txt" 2>&1
    tail -3 "$OUT/f/logs/decode_graph.txt"
    tar czf "$OUT/bench.tgz" -C "$OUT" f && rm -rf "$OUT/f" ;;
esac
