#!/usr/bin/env bash
# Next session's A/B (written in session av, not run): the fp formats' 24-row grouped items
# where an expert expects 13..20 rows (gr24_knob.patch.txt, QQ_KN_GR24=1; today: 32-row items,
# the dense 17..32-row form, which reads a dense weight at ~0.51 of copy at 16384^2 against
# 0.66 at 16 rows). Mixtral-like 64 tokens (16 rows an expert on average, P(> 24) ~ 1-2 % an
# expert) is the case: nvfp4 148-154 us, mxfp8 167-175 in session av. The patch adds a 64-token
# top-2 case (16 rows an expert) to test_gpu_gather_grouped. Apply, build sm_90a, the gather
# tests with the knob on, gather_ab.py on Mixtral-like 16 / 64 tokens, knob 0 / 1, two rounds;
# revert.   OUT=$OUT/gr24 bash bench/results/logs-2026-12-01av/gr24_ab.sh   (~4 minutes)
set -uo pipefail
OUT=${OUT:-/tmp/gr24}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
P=bench/results/logs-2026-12-01av/gr24_knob.patch.txt
git apply "$P" || { echo "patch does not apply"; exit 1; }
T0=$(date +%s)
if python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/build.log" 2>&1; then
  echo "built $(( $(date +%s) - T0 )) s"
  QQ_KN_GR24=1 timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE \
    tests/test_decode.py -k gather > "$OUT/pytest_gr24.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_gr24.log" | head -20; tail -n 1 "$OUT/pytest_gr24.log"
  for r in 1 2; do
    for v in 0 1; do
      QQ_KN_GR24=$v timeout 150 python3 bench/tune/gather_ab.py --no-dense --modes nvfp4,mxfp8 \
        --cases mixtral-up --tokens 16,64 > "$OUT/gather_${v}_r$r.txt" 2>&1
      echo "== round $r knob $v"; grep -v "^copy" "$OUT/gather_${v}_r$r.txt"
    done
  done
else
  tail -20 "$OUT/build.log"
fi
for f in $(git apply --numstat "$P" | cut -f3); do rm -f build/*/CMakeFiles/*/"$f".o; done
git apply -R "$P"
