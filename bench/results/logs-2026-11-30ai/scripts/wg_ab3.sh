#!/usr/bin/env bash
# Third device call: the rolled epilogue. decode_graph at 1..64 rows with QQ_DEC_WG=2 (wgmma
# past 16 rows) and 0 (mma.sync), then bench_decode (decode-layout modes, fused SwiGLU,
# graphed and eager) with the wgmma configurations, then test_decode's M sweeps.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
W="$OUT/wg3"; mkdir -p "$W" "$OUT/results"
trap 'tar czf "$OUT/wg3.tgz" -C "$OUT" wg3 logs results 2>/dev/null' EXIT
QUICK=1 OUT=$OUT bash scripts/gpu_session.sh build || exit 1
T0=$(date +%s)
for wg in 2 0; do
  QQ_DEC_WG=$wg LAYOUTS=decode MS=${MS:-1,4,16,32,64} MODES=${MODES:-nvfp4,mxfp8,affine4} \
    SHAPES=${SHAPES:-16384x16384,28672x4096,4096x14336,6144x4096,4096x4096} \
    timeout 100 python3 bench/tune/decode_graph.py > "$W/graph_wg$wg.txt" 2>&1
  echo "wg=$wg $(( $(date +%s) - T0 )) s"
done
QQ_DEC_WG=2 QQ_BENCH_OUT="$OUT/results" timeout 230 python3 bench/bench_decode.py \
  --modes nvfp4-decode,mxfp4-decode,mxfp8-decode,affine4-decode,affine8-decode --acts fused --budget-s 170 \
  > "$W/bench_decode.log" 2>&1
grep -E "decode_step" "$W/bench_decode.log" | grep -E "torch_bf16_graph|True" | head -30
echo "bench_decode $(( $(date +%s) - T0 )) s"
QQ_DEC_WG=2 timeout 100 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
  -k "same_bits" > "$W/pytest_bits.log" 2>&1
tail -2 "$W/pytest_bits.log"
echo "all $(( $(date +%s) - T0 )) s"
