#!/usr/bin/env bash
# One device call for kernel patches that were compiled but not run: the tree as it is
# (base), then each patch of PATCHES applied on top of the ones before it; after each, an
# incremental sm_90a rebuild, the GPU tests of the small-M weight-only kernels (the fused
# x-quantization forms against the unfused ones bit for bit, the code space, the M sweeps,
# qmv) and bench/tune/qqmm_values_probe.py. Logs under $OUT; the patches are taken out at the
# end (the library is left built with them: rebuild before anything else).
#   PATCHES="a.patch.txt b.patch.txt" OUT=$OUT/ab bash bench/tune/patch_ab.sh
# (Session ad's three landed in 14f9518.) Session ae's three: the step check (passed every
# GPU test on an H200, 12.0 us at 4096^2 mxfp8 M = 1), the fix fold (made on top of it) and
# qmma's codec by value (independent); the last two compiled only:
#   L=bench/results/logs-2026-11-30ae; PATCHES="$L/qmv_step_check.patch.txt
#   $L/qmv_fp8_fold_fix.patch.txt $L/qmma_fp8_codec_by_value.patch.txt" bash bench/tune/patch_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/patch_ab}
mkdir -p "$OUT"
TESTS=${TESTS:-"tests/test_qqmm.py tests/test_qmma.py tests/test_qmv.py"}
K=${K:-"in_the_launch or code_space or m_sweep or qmv"}
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
build() {
  python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a \
    > "$OUT/build-$1.log" 2>&1 || { tail -20 "$OUT/build-$1.log"; return 1; }
}
run() {
  echo "== $1 $(date +%T)"
  timeout 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider $TESTS -k "$K" > "$OUT/pytest-$1.log" 2>&1
  tail -1 "$OUT/pytest-$1.log"
  (cd bench/tune && MODES=${MODES:-mxfp8,nvfp4} SHAPES=${SHAPES:-4096x4096,6144x4096} MS=${MS:-1,2,4} \
    timeout 120 python3 qqmm_values_probe.py) > "$OUT/probe-$1.txt" 2>&1
  grep -v '^device' "$OUT/probe-$1.txt" | cut -c1-100
}
# SKIP_BASE_RUN=1: build the base (the patches rebuild on top of it) but leave its run out.
build base && { [ -n "${SKIP_BASE_RUN:-}" ] || run base; }
n=0
applied=()
for p in ${PATCHES:-}; do
  n=$((n + 1))
  git apply "$p" || { echo "patch $p does not apply"; break; }
  applied=("$p" "${applied[@]}")
  build "p$n" && run "p$n"
done
# (the device's .git may be older than the tree it got: take the patches back out, last first)
for p in "${applied[@]}"; do git apply -R "$p"; done
