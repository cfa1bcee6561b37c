#!/usr/bin/env bash
# One device call for qmmp.cu patches measured on the decode step (bench_decode, the
# decode-layout modes with the SwiGLU fused into gate/up): the tree as it is (base), then each
# patch of PATCHES applied on top of the ones before it; after each an incremental sm_90a
# build, the gated / graph / decode tests, and bench_decode. Logs under $OUT; the patches are
# taken out at the end (the library is left built with them: rebuild before anything else).
#   PATCHES="bench/results/logs-2026-11-30af/qmmp_all_late_trigger.patch.txt" OUT=$OUT/t bash bench/tune/trigger_ab.sh
# (Session af ran the swiglu-only late trigger, slower, and the four-per-SM patch, landed; the
# test step takes ~230 s for every GPU test of the two files: set K to narrow it.)
set -uo pipefail
OUT=${OUT:-/tmp/trigger_ab}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
MODES=${MODES:-nvfp4-decode,mxfp8-decode,affine4-decode,affine8-decode}
build() {
  python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a \
    > "$OUT/build-$1.log" 2>&1 || { tail -20 "$OUT/build-$1.log"; return 1; }
}
bench() {
  echo "== $1 $(date +%T)"
  QQ_BENCH_OUT="$OUT/res-$1" timeout 150 python3 bench/bench_decode.py --modes "$MODES" --acts fused \
    --ms ${MS:-1,4,16} > "$OUT/decode-$1.log" 2>&1
  grep -E "fused +[0-9]+ +True" "$OUT/decode-$1.log" | cut -c1-60
}
tests() {
  timeout 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_graphs.py tests/test_decode.py \
    ${K:+-k "$K"} > "$OUT/pytest-$1.log" 2>&1
  echo "tests $1: $(tail -1 "$OUT/pytest-$1.log")"
}
build base && bench base
n=0
applied=()
for p in ${PATCHES:-}; do
  n=$((n + 1))
  git apply "$p" || { echo "patch $p does not apply"; break; }
  applied=("$p" "${applied[@]}")
  build "p$n" && tests "p$n" && bench "p$n"
done
[ -n "${AGAIN:-}" ] && bench "p$n-again"
for p in "${applied[@]}"; do git apply -R "$p"; done
