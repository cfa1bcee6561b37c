#!/usr/bin/env bash
# One device call for a run-time A/B knob of the decode-layout kernel: an sm_90a build, then
# for each value of the environment knob KNOB (VALUES, in order, twice: ABAB... against drift)
# bench/tune/decode_graph.py (per-call times, CUDA graphs) and bench_decode (the graphed step,
# SwiGLU fused). Logs under $OUT.
#   KNOB=QQ_DEC_PF VALUES="0 4 1000" OUT=$OUT/pf bash bench/tune/knob_ab.sh
# SHAPES / MS / MODES: decode_graph's; STEP_MS / STEP_MODES: bench_decode's; REPS (2): rounds;
# TESTS (K): GPU tests run first, the knob unset.
set -uo pipefail
OUT=${OUT:-/tmp/knob_ab}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/build.log" 2>&1 ||
  { tail -20 "$OUT/build.log"; exit 1; }
if [ -n "${TESTS:-}" ]; then  # GPU tests first, with the knob at its default (TESTS: paths; K: -k)
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider $TESTS ${K:+-k "$K"} \
    > "$OUT/pytest.log" 2>&1
  echo "tests: $(tail -1 "$OUT/pytest.log")"
fi
for rep in $(seq 1 ${REPS:-2}); do
  for v in $VALUES; do
    echo "== $KNOB=$v (run $rep) $(date +%T)"
    env "$KNOB=$v" LAYOUTS=decode SHAPES=${SHAPES:-4096x4096,6144x4096,4096x14336,28672x4096} MS=${MS:-1,16} \
      MODES=${MODES:-nvfp4,mxfp8} timeout 120 python3 bench/tune/decode_graph.py > "$OUT/graph-$v-$rep.txt" 2>&1
    grep -v '^copy' "$OUT/graph-$v-$rep.txt" | sed -E 's/packed +nan us \(nan of copy\) +//; s/ +xnan.*//' | cut -c1-80
    env "$KNOB=$v" QQ_BENCH_OUT="$OUT/res-$v-$rep" timeout 150 python3 bench/bench_decode.py --acts fused \
      --ms ${STEP_MS:-1} --modes "${STEP_MODES:-nvfp4-decode,mxfp8-decode,affine4-decode}" > "$OUT/decode-$v-$rep.log" 2>&1
    grep -E "fused +[0-9]+ +True" "$OUT/decode-$v-$rep.log" | cut -c1-60
  done
done
