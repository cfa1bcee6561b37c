#!/usr/bin/env bash
# Session ao: the sanitizers' whole kernel workload on the final library (11a354d's kernels;
# scripts/sanitize_kernels.py fixed), then qmmp_cta_barrier.patch.txt (no cluster barrier
# when K is not split) against it: test_decode's bit tests on the patch and graph times
# before / after (twice).
#   OUT=$OUT bash bench/results/logs-2026-12-01ao/ab_barrier.sh
set -uo pipefail
L=bench/results/logs-2026-12-01ao
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
O="$OUT/bar"; mkdir -p "$O"
build() { python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$O/build-$1.log" 2>&1 || { tail -20 "$O/build-$1.log"; exit 1; }; }
graphs() {
  LAYOUTS=decode MS=1,16 SHAPES=16384x16384,28672x4096,4096x14336,4096x4096 MODES=nvfp4,mxfp8,affine4 \
    timeout 100 python3 bench/tune/decode_graph.py > "$O/graph-$1.txt" 2>&1
  grep "M=" "$O/graph-$1.txt" | sed -E 's/packed +nan us \(nan of copy\) +//; s/ +xnan.*//'
}
build base
OUT="$O/kernels" bash scripts/gpu_session.sh kernels 2>&1 | tail -3
graphs base
git apply "$L/qmmp_cta_barrier.patch.txt" || exit 1
build p1
timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_decode.py \
  -k "every_m or gpu_matches or f16 or gated or long_k" > "$O/pytest-p1.log" 2>&1; tail -1 "$O/pytest-p1.log"
graphs p1
graphs p1-again
git apply -R "$L/qmmp_cta_barrier.patch.txt"
tar czf "$OUT/bar.tgz" -C "$OUT" bar && rm -rf "$O"
