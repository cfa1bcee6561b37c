#!/usr/bin/env bash
# A/B of qmma.cu on the device: a baseline (first `git show REV:libqq/src/cuda/qmma.cu >
# bench/tune/qmma_baseline.cu`, not committed) then the working tree's,
# each built, benchmarked (bench_qmm --quick, bench_decode); the new one also tested.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}; mkdir -p "$OUT/a" "$OUT/b"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
cp libqq/src/cuda/qmma.cu /tmp/qmma_new.cu
build() { python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$1/build.log" 2>&1 || { tail -30 "$1/build.log"; exit 1; }; }
cp bench/tune/qmma_baseline.cu libqq/src/cuda/qmma.cu
echo "=== A build $(date +%T)"; build "$OUT/a"
QQ_BENCH_OUT="$OUT/a" timeout 200 python3 bench/bench_qmm.py --quick > "$OUT/a/qmm.log" 2>&1
QQ_BENCH_OUT="$OUT/a" timeout 200 python3 bench/bench_decode.py > "$OUT/a/decode.log" 2>&1
cp /tmp/qmma_new.cu libqq/src/cuda/qmma.cu
echo "=== B build $(date +%T)"; build "$OUT/b"
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider --tb=short tests/test_qmma.py tests/test_qmm.py tests/test_qmv.py tests/test_gather_qmm.py > "$OUT/b/pytest.log" 2>&1; tail -2 "$OUT/b/pytest.log"
QQ_BENCH_OUT="$OUT/b" timeout 200 python3 bench/bench_qmm.py --quick > "$OUT/b/qmm.log" 2>&1
QQ_BENCH_OUT="$OUT/b" timeout 200 python3 bench/bench_decode.py > "$OUT/b/decode.log" 2>&1
echo "=== done $(date +%T)"
tar czf "$OUT/ab.tgz" -C "$OUT" a b
