#!/usr/bin/env bash
# Next session's A/B (written in session av, not run): affine's rows of x staged where K is
# split (the 4096-row weights: o, down), behind QQ_KN_ASTAGE (affine_stage_knob.patch.txt):
# 1 = at 9..16 rows, 2 = at 3..16 rows. Today those calls copy x row by row and each CTA's
# x-sum warp makes the sums of x; grouped gathers gained 5-30 % for affine from the staging
# kernel making them instead (session av), and affine 4-bit at 16 rows runs 4096 x 14336 at
# 30.7 us against nvfp4's 24.2 (qmm_decode-h200, a2f5244). Apply, build sm_90a, test_decode's
# bit / match tests with the knob at 2, decode_graph at the K-split shapes for 0 / 1 / 2, then
# the step (profile_decode_step.py, what each kernel adds) at 4 and 16 tokens; revert.
#   OUT=$OUT/as bash bench/results/logs-2026-12-01av/affine_stage_ab.sh   (~6 minutes)
set -uo pipefail
OUT=${OUT:-/tmp/astage}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
P=bench/results/logs-2026-12-01av/affine_stage_knob.patch.txt
git apply "$P" || { echo "patch does not apply"; exit 1; }
T0=$(date +%s)
if python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/build.log" 2>&1; then
  echo "built $(( $(date +%s) - T0 )) s"
  QQ_KN_ASTAGE=2 timeout 240 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
    -k "every_m or gpu_matches or non_finite or f16 or long_k" > "$OUT/pytest_as2.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_as2.log" | head -20; tail -n 1 "$OUT/pytest_as2.log"
  for v in 0 1 2; do
    QQ_KN_ASTAGE=$v LAYOUTS=decode MS=4,8,16 MODES=affine4,affine8 SHAPES=4096x14336,4096x4096,6144x4096 \
      timeout 100 python3 bench/tune/decode_graph.py > "$OUT/graph_$v.txt" 2>&1
    echo "== knob $v"; grep -v "^copy" "$OUT/graph_$v.txt" | cut -c1-80
  done
  for m in 4 16; do
    for v in 0 1 2; do
      QQ_KN_ASTAGE=$v MODES=affine4-decode,affine8-decode M=$m ACT=fused timeout 200 \
        python3 bench/tune/profile_decode_step.py > "$OUT/step_${m}_$v.txt" 2>&1
      echo "== step M=$m knob $v"; grep -E "step" "$OUT/step_${m}_$v.txt" | cut -c1-120
    done
  done
else
  tail -20 "$OUT/build.log"
fi
for f in $(git apply --numstat "$P" | cut -f3); do rm -f build/*/CMakeFiles/*/"$f".o; done
git apply -R "$P"
