#!/usr/bin/env bash
# Next session's A/B (written in session aw, not run; next_knob.patch.txt, applies to 3859695):
# 1. QQ_KN_AGR24=1: affine's grouped gather items of 24 rows where an expert expects 13..20
#    (Mixtral-like 64 tokens: affine 4-bit 150 us, 0.42 of copy, on 16-row items; 32-row
#    items were slower in session av, 140 -> 166). The gather tests with the knob on (the
#    64-token top-2 case then takes 24-row affine items), gather_ab.py Mixtral-like 16 / 64
#    tokens, knob 0 / 1, two rounds.
# 2. QQ_KN_AOLD=1: the rule before 1e7d052 (affine's K-split 9..16 rows not staged), against
#    the new one in the step at 9 and 12 tokens (session aw measured only 16: 2741 -> 2459-2523
#    us for 4-bit, 3674 -> 3456-3540 for 8-bit), two rounds.
#   OUT=$OUT/next bash bench/results/logs-2026-12-01aw/next_ab.sh   (~5 minutes)
set -uo pipefail
OUT=${OUT:-/tmp/next}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
P=bench/results/logs-2026-12-01aw/next_knob.patch.txt
git apply "$P" || { echo "patch does not apply"; exit 1; }
T0=$(date +%s)
if python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/build.log" 2>&1; then
  echo "built $(( $(date +%s) - T0 )) s"
  QQ_KN_AGR24=1 timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE \
    tests/test_decode.py -k "gather" > "$OUT/pytest_agr24.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_agr24.log" | head -20; tail -n 1 "$OUT/pytest_agr24.log"
  for r in 1 2; do
    for v in 0 1; do
      QQ_KN_AGR24=$v timeout 100 python3 bench/tune/gather_ab.py --no-dense --modes affine4 \
        --cases mixtral-up --tokens 16,64 > "$OUT/gather_${v}_r$r.txt" 2>&1
      echo "== round $r agr24 $v"; grep -v "^copy" "$OUT/gather_${v}_r$r.txt"
    done
  done
  echo "gathers $(( $(date +%s) - T0 )) s"
  for r in 1 2; do
    for m in 9 12; do
      for v in 1 0; do
        QQ_KN_AOLD=$v MODES=affine4-decode,affine8-decode M=$m ACT=fused timeout 60 \
          python3 bench/tune/profile_decode_step.py > "$OUT/step_${m}_old${v}_r$r.txt" 2>&1
        echo "== round $r step M=$m old rule $v"; grep -E "step" "$OUT/step_${m}_old${v}_r$r.txt" | cut -c1-80
      done
    done
  done
  echo "steps $(( $(date +%s) - T0 )) s"
else
  tail -20 "$OUT/build.log"
fi
for f in $(git apply --numstat "$P" | cut -f3); do rm -f build/*/CMakeFiles/*/"$f".o; done
git apply -R "$P"
