#!/usr/bin/env bash
# A/B of one CUDA source file on the device, in one call:
#   SRC=libqq/src/cuda/colwise.cu BENCH="bench/bench_quantize.py --only colwise" \
#   TESTS="tests/test_colwise.py" bash bench/tune/ab.sh
# The baseline is bench/tune/<name>_baseline.cu (first `git show REV:$SRC > ...`; ignored,
# so carry it). A = the baseline built and benchmarked; B = the working tree's file built,
# its GPU tests run (TESTS), then benchmarked. Logs under $OUT/a and $OUT/b; BENCH may
# hold several commands separated by ';'.
# A change over several files: PATCH=<file> (`git diff > bench/tune/ab.patch`, ignored, so
# carry it) instead of SRC: A is the working tree with the patch reversed, B the tree.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}; mkdir -p "$OUT/a" "$OUT/b"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
if [ -z "${PATCH:-}" ]; then
  base="bench/tune/$(basename "${SRC%.cu}")_baseline.cu"
  cp "$SRC" /tmp/ab_new.cu
fi
build() { python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$1/build.log" 2>&1 || { tail -30 "$1/build.log"; exit 1; }; }
bench() { IFS=';' read -ra cmds <<< "$BENCH"; for c in "${cmds[@]}"; do QQ_BENCH_OUT="$1" timeout ${BENCH_TIMEOUT:-200} python3 $c >> "$1/bench.log" 2>&1; done; }
if [ -n "${PATCH:-}" ]; then patch -R -p1 -s < "$PATCH" || exit 1; else cp "$base" "$SRC"; fi
echo "=== A build $(date +%T)"; build "$OUT/a"; bench "$OUT/a"
if [ -n "${PATCH:-}" ]; then patch -p1 -s < "$PATCH" || exit 1; else cp /tmp/ab_new.cu "$SRC"; fi
echo "=== B build $(date +%T)"; build "$OUT/b"
if [ -n "${TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider --tb=short $TESTS > "$OUT/b/pytest.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/b/pytest.log" | head -20; tail -2 "$OUT/b/pytest.log"
fi
bench "$OUT/b"
echo "=== done $(date +%T)"
