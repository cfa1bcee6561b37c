#!/usr/bin/env bash
# One device call for kernel patches that were compiled but not run: the tree as it is
# (base), then each patch of PATCHES applied on top of the ones before it; after each, an
# incremental sm_90a rebuild, tests and a measurement. Logs under $OUT; the patches are taken
# out at the end and their objects deleted (the library is left built with them: the next
# build recompiles those files).
#   PATCHES="a.patch.txt b.patch.txt" OUT=$OUT/ab bash bench/tune/patch_ab.sh
# SUITE picks the tests and the measurement:
#   qqmm (default): the small-M weight-only kernels' GPU tests (the fused x-quantization forms
#     against the unfused ones bit for bit, the code space, the M sweeps, qmv) and
#     bench/tune/qqmm_values_probe.py;
#   decode: every GPU test of test_decode.py and test_graphs.py (~230 s on an H200; set K to
#     narrow them) and bench_decode on the decode-layout modes with the SwiGLU fused into
#     gate/up (cuda/qmmp.cu patches);
#   quantize: every GPU test of test_quantize.py, test_colwise.py and test_qdq.py, and
#     bench_quantize --quick for row-wise and column-wise quantization (MODES: the modes whose
#     rows are printed, a grep -E pattern; ONLY="colwise": that family alone);
#   moe: every GPU test of test_qdq.py and test_grouped.py (the qdq kernels of qqmm.cu) and
#     bench/tune/moe_qdq_probe.py, then bench_moe (LINEAR=1: and bench_linear --quick);
#   gather: the gather tests of test_gather_qmm.py and test_decode.py, and bench/tune/gather_ab.py.
#   GRAPH_SHAPES=4096x4096,... (decode): bench/tune/decode_graph.py at those shapes too
#   (GRAPH_MS, GRAPH_MODES).
# BASE_K: run the base's tests too, narrowed by this -k expression (cases not yet run on a GPU).
# KNOB=QQ_X VALUES="0 1": a run-time knob of the tree instead of patches: after the base's
# build (and BASE_K's tests, the knob unset), the measurement once per value, REPS (2) rounds
# interleaved against drift; no patches. (Session aj's knob A/Bs ran this as knob_ab.sh,
# kept under bench/results/logs-2026-11-30aj/scripts/.)
# SKIP_BASE_RUN=1: build the base (the patches rebuild on top of it) but leave its run out;
# AGAIN=1: measure the last patch a second time.
# The logs are packed into $OUT.tgz (PACK_TO: elsewhere) after every step, so a call stopped by
# the device's time limit still brings back what was done. The device returns at most 8 files:
# keep OUT off the device's $OUT and only the archive in it (session bd's first call lost its
# test logs to both), e.g. OUT=/tmp/ab PACK_TO=$OUT/ab.tgz bash bench/tune/patch_ab.sh. BUDGET_S=480: start no further patch (or AGAIN)
# once that many seconds have passed (a patch's build, tests and measurement take ~3-4
# minutes with SUITE=decode and a narrow K).
# Session af: session ae's three qmv / qmma patches (landed as 1be8ebe), then with
# SUITE=decode the swiglu-only late trigger (slower) and the 8-bit four-per-SM rule (landed as
# 1c40614). Compiled, not run:
#   SUITE=decode PATCHES=bench/results/logs-2026-11-30af/qmmp_all_late_trigger.patch.txt bash bench/tune/patch_ab.sh
#   SUITE=quantize PATCHES=bench/results/logs-2026-11-30af/mxfp4_bf16x2_encoder.patch.txt bash bench/tune/patch_ab.sh
# Session ag ran those two (the encoder landed as 775c80a; the late trigger was slower). Compiled,
# not run: moe_qdq_kernel with bf16 values kept packed (no spills at 3 blocks an SM), then at 4:
#   SUITE=moe PATCHES="bench/results/logs-2026-11-30ag/moe_qdq_packed.patch.txt
#     bench/results/logs-2026-11-30ag/moe_qdq_packed_four_per_sm.patch.txt" bash bench/tune/patch_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/patch_ab}
SUITE=${SUITE:-qqmm}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
if [ "$SUITE" = decode ]; then
  TESTS=${TESTS:-"tests/test_decode.py tests/test_graphs.py"}
  K=${K:-}
elif [ "$SUITE" = quantize ]; then
  TESTS=${TESTS:-"tests/test_quantize.py tests/test_colwise.py tests/test_qdq.py"}
  K=${K:-}
elif [ "$SUITE" = moe ]; then
  TESTS=${TESTS:-"tests/test_qdq.py tests/test_grouped.py"}
  K=${K:-}
elif [ "$SUITE" = gather ]; then
  TESTS=${TESTS:-"tests/test_gather_qmm.py tests/test_decode.py"}
  K=${K:-"gather"}
else
  TESTS=${TESTS:-"tests/test_qqmm.py tests/test_qmma.py tests/test_qmv.py"}
  K=${K:-"in_the_launch or code_space or m_sweep or qmv"}
fi
T0=$SECONDS
pack() { tar czf "${PACK_TO:-$OUT.tgz}" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null; }
trap pack EXIT
in_budget() {
  [ -z "${BUDGET_S:-}" ] || [ $((SECONDS - T0)) -lt "$BUDGET_S" ] || { echo "BUDGET_S: stopping before $1 at $((SECONDS - T0)) s"; return 1; }
}
build() {
  python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a \
    > "$OUT/build-$1.log" 2>&1 || { tail -20 "$OUT/build-$1.log"; return 1; }
}
tests() {
  timeout 300 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider $TESTS ${K:+-k "$K"} > "$OUT/pytest-$1.log" 2>&1
  echo "tests $1: $(tail -1 "$OUT/pytest-$1.log")"
}
measure() {
  echo "== $1 $(date +%T)"
  if [ "$SUITE" = decode ]; then
    QQ_BENCH_OUT="$OUT/res-$1" timeout 150 python3 bench/bench_decode.py --acts fused --ms ${MS:-1,4,16} \
      --modes "${MODES:-nvfp4-decode,mxfp8-decode,affine4-decode,affine8-decode}" > "$OUT/decode-$1.log" 2>&1
    grep -E "fused +[0-9]+ +True" "$OUT/decode-$1.log" | cut -c1-60
    if [ -n "${GRAPH_SHAPES:-}" ]; then  # and decode_graph.py's per-call times at those shapes
      LAYOUTS=decode SHAPES=$GRAPH_SHAPES MS=${GRAPH_MS:-1,16} MODES=${GRAPH_MODES:-nvfp4,mxfp8} \
        timeout 200 python3 bench/tune/decode_graph.py > "$OUT/graph-$1.txt" 2>&1
      grep -v "^device" "$OUT/graph-$1.txt" | cut -c1-140
    fi
  elif [ "$SUITE" = gather ]; then
    timeout 200 python3 bench/tune/gather_ab.py --modes ${MODES:-nvfp4,mxfp8,affine4} > "$OUT/gather-$1.txt" 2>&1
    grep -v '^copy' "$OUT/gather-$1.txt" | cut -c1-100
  elif [ "$SUITE" = moe ]; then
    timeout 120 python3 bench/tune/moe_qdq_probe.py > "$OUT/moe_qdq-$1.txt" 2>&1
    grep "round" "$OUT/moe_qdq-$1.txt" | cut -c1-100
    QQ_BENCH_OUT="$OUT/res-$1" timeout 100 python3 bench/bench_moe.py > "$OUT/moe-$1.log" 2>&1
    grep step "$OUT/moe-$1.log" | cut -c1-110
    if [ -n "${LINEAR:-}" ]; then
      QQ_BENCH_OUT="$OUT/res-$1" timeout 100 python3 bench/bench_linear.py --quick > "$OUT/linear-$1.log" 2>&1
      grep -E "qqlinear_(step|fwd) +mxfp8" "$OUT/linear-$1.log" | cut -c1-110
    fi
  elif [ "$SUITE" = quantize ]; then
    for o in ${ONLY:-quantize colwise}; do
      QQ_BENCH_OUT="$OUT/res-$1" timeout 200 python3 bench/bench_quantize.py --quick --only $o > "$OUT/$o-$1.log" 2>&1
      grep -E "${MODES:-mxfp4}" "$OUT/$o-$1.log" | grep -E "copy" | cut -c1-110
    done
  else
    (cd bench/tune && MODES=${MODES:-mxfp8,nvfp4} SHAPES=${SHAPES:-4096x4096,6144x4096} MS=${MS:-1,2,4} \
      timeout 120 python3 qqmm_values_probe.py) > "$OUT/probe-$1.txt" 2>&1
    grep -v '^device' "$OUT/probe-$1.txt" | cut -c1-100
  fi
  pack
}
# the base's tests are the tree's own (main passed them); its measurement is the reference
build base && { [ -z "${BASE_K:-}" ] || K=$BASE_K tests base; } || exit 1
if [ -n "${KNOB:-}" ]; then
  for rep in $(seq 1 "${REPS:-2}"); do
    for v in $VALUES; do
      echo "== $KNOB=$v (round $rep)"
      ( export "$KNOB=$v"; measure "$v-$rep" )
    done
  done
  exit 0
fi
[ -n "${SKIP_BASE_RUN:-}" ] || measure base
n=0
applied=()
for p in ${PATCHES:-}; do
  n=$((n + 1))
  in_budget "p$n" || break
  git apply "$p" || { echo "patch $p does not apply"; break; }
  applied=("$p" "${applied[@]}")
  build "p$n" && tests "p$n" && pack && measure "p$n"
done
[ -n "${AGAIN:-}" ] && in_budget "p$n-again" && measure "p$n-again"
# (the device's .git may be older than the tree it got: take the patches back out, last first)
# and delete the objects built from the patched files: the next call's copy of the tree gives
# those sources their older mtimes again, so without this the next build kept the patched
# objects (session ap: a whole GPU test run and its tables on a rejected patch's library)
for p in "${applied[@]}"; do
  for f in $(git apply --numstat "$p" | cut -f3); do rm -f build/*/CMakeFiles/*/"$f".o; done
  git apply -R "$p"
done
