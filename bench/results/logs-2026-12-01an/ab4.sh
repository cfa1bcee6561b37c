#!/usr/bin/env bash
# Session an's last device call: dequant_affine_opaque.patch.txt against the tree (5b9b6c6's
# library), and on the patched build every GPU test and the sanitizers' kernel workload, so
# that the patch, if it lands, is the final code as tested.
#   OUT=$OUT bash bench/results/logs-2026-12-01an/ab4.sh
set -uo pipefail
L=bench/results/logs-2026-12-01an
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16 QQ_CUTLASS_DIR="$PWD/.cutlass"
mkdir -p "$OUT/ab4"
build() { python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/ab4/build-$1.log" 2>&1 || { tail -20 "$OUT/ab4/build-$1.log"; exit 1; }; }
measure() {
  echo "== $1 $(date +%T)"
  QQ_BENCH_OUT="$OUT/ab4/res-$1" timeout 120 python3 bench/bench_quantize.py --quick --only dequantize > "$OUT/ab4/dequantize-$1.log" 2>&1
  grep -E "affine" "$OUT/ab4/dequantize-$1.log" | cut -c1-110
}
build base && measure base
git apply "$L/dequant_affine_opaque.patch.txt" || exit 1
build p1
echo "== tests $(date +%T)"
timeout 330 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests > "$OUT/ab4/pytest_gpu.log" 2>&1; tail -1 "$OUT/ab4/pytest_gpu.log"
measure p1
measure p1-again
QQ_COMMIT=${QQ_COMMIT:-} OUT="$OUT/ab4/kernels" bash scripts/gpu_session.sh kernels > "$OUT/ab4/kernels.log" 2>&1
grep -E "SUMMARY|MISMATCH" "$OUT/ab4/kernels.log" | head
git apply -R "$L/dequant_affine_opaque.patch.txt"
