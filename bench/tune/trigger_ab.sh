#!/usr/bin/env bash
# One device call: the decode step's fused gate/up (+SwiGLU) -> down pair with the tree as it
# is (base) and with PATCH applied: incremental sm_90a build, the gated / graph tests, then
# bench_decode on the decode-layout modes with the fused SwiGLU, twice each, interleaved
# base / patch / base / patch by rebuilding (qmmp.cu only). Logs under $OUT.
#   PATCH=bench/results/logs-2026-11-30af/qmmp_swiglu_late_trigger.patch.txt OUT=$OUT/t bash bench/tune/trigger_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/trigger_ab}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
MODES=${MODES:-nvfp4-decode,mxfp8-decode,affine4-decode}
build() {
  python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a \
    > "$OUT/build-$1.log" 2>&1 || { tail -20 "$OUT/build-$1.log"; return 1; }
}
bench() {
  echo "== $1 $(date +%T)"
  QQ_BENCH_OUT="$OUT/res-$1" timeout 150 python3 bench/bench_decode.py --modes "$MODES" --acts fused \
    --ms ${MS:-1,4,16} > "$OUT/decode-$1.log" 2>&1
  grep -E "fused +[0-9]+ +True" "$OUT/decode-$1.log" | cut -c1-80
}
build base && bench base1
git apply "$PATCH" || { echo "patch does not apply"; exit 1; }
build patch && {
  timeout 120 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_graphs.py tests/test_decode.py \
    -k "gated or swiglu" > "$OUT/pytest-patch.log" 2>&1; tail -1 "$OUT/pytest-patch.log"
  bench patch1
}
git apply -R "$PATCH"
build base && bench base2
git apply "$PATCH" && build patch && bench patch2
git apply -R "$PATCH"
