#!/usr/bin/env bash
# One device call for run-time knobs of a temporary patch, judged by the decode step itself:
# apply PATCH, build (sm_90a), then bench/tune/profile_decode_step.py (graphed step, ACT=fused:
# what each kernel adds to the step, end to end) once per setting, and take the patch out.
# Per-call timings (decode_graph.py) miss what a configuration does to the kernel after it,
# which starts beside it under programmatic dependent launch (qmm-decode-h100-notes.md,
# session at). A setting is "name|VAR=v VAR2=w|modes|M" (empty VARs: the patch's defaults):
#   PATCH=bench/results/logs-2026-12-01at/qmmp_residency_knobs2.patch.txt \
#   SPECS="base||nvfp4-decode,affine4-decode|1 d4||nvfp4-decode|1" OUT=$OUT/k bash bench/tune/step_knobs.sh
# REPS=2 runs the list twice (against drift between processes).
set -uo pipefail
OUT=${OUT:-/tmp/step_knobs}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
git apply "$PATCH" || { echo "patch $PATCH does not apply"; exit 1; }
if python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a \
  > "$OUT/build.log" 2>&1; then
  for rep in $(seq 1 "${REPS:-1}"); do
    for spec in $SPECS; do
      IFS='|' read -r name vars modes m <<< "$spec"
      echo "== $name (M = $m${vars:+, ${vars//,/ }}) round $rep"
      env ${vars//,/ } MODES="$modes" M="$m" ACT=fused timeout 200 python3 bench/tune/profile_decode_step.py \
        > "$OUT/prof-$name-$rep.txt" 2>&1
      grep -E "step|adds" "$OUT/prof-$name-$rep.txt" | sed -e 's/\[void qq::cuda::(anonymous namespace)::/[/' | cut -c1-150
    done
  done
else
  tail -20 "$OUT/build.log"
fi
# (the device's .git may be older than the tree: delete the patched objects, so that the next
# build recompiles them, then take the patch out)
for f in $(git apply --numstat "$PATCH" | cut -f3); do rm -f build/*/CMakeFiles/*/"$f".o; done
git apply -R "$PATCH"
