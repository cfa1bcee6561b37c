#!/usr/bin/env bash
# One device call for the decode kernel's wgmma configurations (17..64 rows, sm_90a):
# build, test_decode's M-sweep tests, then decode_graph.py (decode layout only, CUDA
# graphs) with the wgmma configurations on (QQ_DEC_WG=1) and off (0), then the rest of
# test_decode and test_graphs as time allows. Logs in $OUT/wg.tgz.
#   QQ_COMMIT=<hash> OUT=$OUT bash bench/tune/wg_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
W="$OUT/wg"; mkdir -p "$W"
trap 'tar czf "$OUT/wg.tgz" -C "$OUT" wg logs 2>/dev/null' EXIT
QUICK=1 OUT=$OUT bash scripts/gpu_session.sh build || exit 1
T0=$(date +%s)
timeout ${T1:-150} python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
  -k "${K1:-same_bits or gpu_matches or f16 or determinism}" > "$W/pytest_quick.log" 2>&1
grep -E "^(FAILED|ERROR)" "$W/pytest_quick.log" | head -20; tail -2 "$W/pytest_quick.log"
echo "quick tests $(( $(date +%s) - T0 )) s"
for wg in 1 0; do
  QQ_DEC_WG=$wg LAYOUTS=decode MS=${MS:-1,16,32,64} MODES=${MODES:-nvfp4,mxfp8,affine4} \
    SHAPES=${SHAPES:-16384x16384,28672x4096,4096x14336,4096x4096} \
    timeout ${T2:-110} python3 bench/tune/decode_graph.py > "$W/graph_wg$wg.txt" 2>&1
  echo "wg=$wg"; cat "$W/graph_wg$wg.txt" | cut -c1-80
done
echo "bench done $(( $(date +%s) - T0 )) s"
timeout ${T3:-120} python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
  tests/test_graphs.py -k "${K3:-not (same_bits or gpu_matches or f16 or determinism)}" > "$W/pytest_rest.log" 2>&1
grep -E "^(FAILED|ERROR)" "$W/pytest_rest.log" | head -20; tail -2 "$W/pytest_rest.log"
echo "all $(( $(date +%s) - T0 )) s"
