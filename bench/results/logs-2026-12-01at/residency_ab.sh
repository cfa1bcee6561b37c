#!/usr/bin/env bash
# Session at: the decode step kernel by kernel (bench/tune/profile_decode_step.py, graphed, ACT=fused)
# under the temporary knobs of qmmp_residency_knobs.patch.txt (the configuration of the K-split
# matmuls that follow a one-CTA-an-SM kernel). Applies the patch, builds, profiles, takes it out.
set -uo pipefail
L=bench/results/logs-2026-12-01at
OUT=${OUT:-/tmp/res}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
P=$L/qmmp_residency_knobs.patch.txt
git apply $P || exit 1
python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
prof() {  # name, env..., then MODES M
  local name=$1; shift
  echo "== $name"
  env "$@" ACT=fused timeout 150 python3 bench/tune/profile_decode_step.py > "$OUT/prof-$name.txt" 2>&1
  grep -E "step|adds" "$OUT/prof-$name.txt" | sed -e 's/\[void qq::cuda::(anonymous namespace)::/[/' | cut -c1-150
}
for spec in ${SPECS:-"base:" "q4:QQ_KN_Q4=1"}; do
  name=${spec%%:*}; kn=${spec#*:}
  prof "$name-m1" $kn MODES=${MODES1:-nvfp4-decode,affine4-decode} M=1
done
for spec in ${SPECS8:-"base:" "d8s2q8:QQ_KN_D8=1 QQ_KN_Q8=1" "q8:QQ_KN_Q8=1" "old:QQ_KN_D8=2"}; do
  name=${spec%%:*}; kn=${spec#*:}
  prof "$name-m4" $kn MODES=${MODES4:-affine8-decode,mxfp8-decode} M=4
done
for f in $(git apply --numstat $P | cut -f3); do rm -f build/*/CMakeFiles/*/"$f".o; done
git apply -R $P
