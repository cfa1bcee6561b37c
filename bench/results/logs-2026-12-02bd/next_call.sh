#!/usr/bin/env bash
# For the session after bd, first device call (~8 minutes: run with timeout_s 600):
#   bash bench/results/logs-2026-12-02bd/next_call.sh
# It checks session bd's landed wgmma descriptor change (97edffc) on the final library:
# - the build;
# - every GPU test of test_decode.py and test_graphs.py (~230 s of the suite's decode part;
#   bd ran only the two-tile, same-bits and gated ones);
# - compute-sanitizer racecheck over scripts/sanitize_kernels.py (memcheck ran in bd; its (17408, 4096) gated
#   two-tile case reaches the changed loop);
# bench_qmm --only decode for qmm_decode-h200.md is a second call (STEP=bench: the build, then
# that, ~4 minutes).
# Everything goes to $OUT/next.tgz after each step.
set -uo pipefail
O=/tmp/next; rm -rf $O; mkdir -p $O
pack() { tar czf "$OUT/next.tgz" -C /tmp next 2>/dev/null; }
trap pack EXIT
QUICK=1 OUT=$O bash scripts/gpu_session.sh build > $O/build_step.txt 2>&1 || { tail -30 $O/build_step.txt; exit 1; }
if [ "${STEP:-}" = bench ]; then
  QQ_COMMIT=${QQ_COMMIT:-} timeout 260 python3 bench/bench_qmm.py --only decode > $O/bench_qmm.txt 2>&1; echo "bench_qmm rc=$?"
  cp bench/results/qmm_decode-*.md bench/results/qmm_decode-*.json $O/ 2>/dev/null
  exit 0
fi
timeout 260 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py tests/test_graphs.py \
  > $O/pytest_decode.txt 2>&1
tail -2 $O/pytest_decode.txt; grep -E "^(FAILED|ERROR)" $O/pytest_decode.txt | head -20; pack
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 3 python3 scripts/sanitize_kernels.py \
  > $O/racecheck_kernels.txt 2>&1; echo "racecheck rc=$?"; tail -3 $O/racecheck_kernels.txt; pack
