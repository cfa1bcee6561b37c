#!/usr/bin/env bash
# Second device call for the wgmma configurations: decode_graph at 32 / 64 rows with
# QQ_DEC_WG=0 (mma.sync), 1 (wgmma, 8 consumer warps), 2 (wgmma, 16 at 33..64 rows); ncu of
# one 64-row call each way; test_decode's M sweeps under QQ_DEC_WG=2. Logs in $OUT/wg2.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
W="$OUT/wg2"; mkdir -p "$W"
trap 'tar czf "$OUT/wg2.tgz" -C "$OUT" wg2 logs 2>/dev/null' EXIT
QUICK=1 OUT=$OUT bash scripts/gpu_session.sh build || exit 1
T0=$(date +%s)
for wg in 2 1 0; do
  QQ_DEC_WG=$wg LAYOUTS=decode MS=${MS:-32,64} MODES=${MODES:-nvfp4,mxfp8} \
    SHAPES=${SHAPES:-16384x16384,28672x4096,4096x14336,4096x4096} \
    timeout 80 python3 bench/tune/decode_graph.py > "$W/graph_wg$wg.txt" 2>&1
  echo "wg=$wg $(( $(date +%s) - T0 )) s"
done
for wg in 1 0; do
  for shape in 28672x4096 16384x16384; do
    QQ_DEC_WG=$wg SHAPE=$shape MODE=nvfp4 M=64 timeout 60 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats -k regex:qmmp_kernel --launch-skip 3 \
      --launch-count 1 python3 bench/tune/ncu_dec.py > "$W/ncu_wg${wg}_$shape.txt" 2>&1
  done
  echo "ncu wg=$wg $(( $(date +%s) - T0 )) s"
done
QQ_DEC_WG=2 timeout 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
  -k "same_bits or gpu_matches" > "$W/pytest_wg2.log" 2>&1
grep -E "^(FAILED|ERROR)" "$W/pytest_wg2.log" | head -20; tail -2 "$W/pytest_wg2.log"
echo "all $(( $(date +%s) - T0 )) s"
