#!/usr/bin/env bash
# 9..16 rows at the K-split shapes: a one-CTA-per-SM configuration (QQ_DEC_ONE=1, temporary
# knob) against the two-per-SM ones. decode_graph both ways, bench_decode at 16 tokens both
# ways, then test_decode + test_graphs with the knob on. Logs in $OUT/one.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
W="$OUT/one"; mkdir -p "$W"
trap 'tar czf "$OUT/one.tgz" -C "$OUT" one logs 2>/dev/null' EXIT
QUICK=1 OUT=$OUT bash scripts/gpu_session.sh build || exit 1
T0=$(date +%s)
for one in 1 0; do
  QQ_DEC_ONE=$one LAYOUTS=decode MS=9,16 SHAPES=4096x14336,4096x4096 \
    timeout 60 python3 bench/tune/decode_graph.py > "$W/graph_one$one.txt" 2>&1
done
for one in 1 0; do
  QQ_DEC_ONE=$one QQ_BENCH_OUT="$W/res$one" timeout 80 python3 bench/bench_decode.py --ms 16 \
    --modes nvfp4-decode,mxfp4-decode,mxfp8-decode,affine4-decode,affine8-decode --acts fused > "$W/bench_decode_one$one.log" 2>&1
  grep -E "graph=True" "$W/bench_decode_one$one.log" | grep torch_bf16_graph | cut -c1-110
done
echo "bench $(( $(date +%s) - T0 )) s"
QQ_DEC_ONE=1 timeout 170 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
  tests/test_graphs.py > "$W/pytest_one1.log" 2>&1
grep -E "^(FAILED|ERROR)" "$W/pytest_one1.log" | head; tail -1 "$W/pytest_one1.log"
echo "all $(( $(date +%s) - T0 )) s"
