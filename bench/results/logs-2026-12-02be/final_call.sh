#!/usr/bin/env bash
# Session be's checks of the final library (the code of 0097bb1; run with timeout_s 600, carry
# .cutlass/.cublas, QQ_COMMIT set). STEP=tests (default): the build, every GPU test (-n 16),
# memcheck and initcheck over scripts/sanitize_kernels.py (racecheck ran in call 1).
# STEP=bench: the build, bench_decode (decode-h200.md) and bench_qmm --only gather
# (gather_qmm-h200.md). $OUT/fin.tgz is rewritten after every step.
set -uo pipefail
O=/tmp/fin; rm -rf $O; mkdir -p $O
pack() { tar czf "$OUT/fin.tgz" -C /tmp fin 2>/dev/null; }
trap pack EXIT
QUICK=1 OUT=$O bash scripts/gpu_session.sh build > $O/build_step.txt 2>&1 || { tail -30 $O/build_step.txt; exit 1; }
if [ "${STEP:-tests}" = bench ]; then
  QQ_BENCH_OUT=$O timeout 330 python3 bench/bench_decode.py --budget-s 290 > $O/bench_decode.txt 2>&1; echo "bench_decode rc=$?"; tail -3 $O/bench_decode.txt; pack
  [ -n "${NO_GATHER:-}" ] && exit 0
  timeout 200 python3 bench/bench_qmm.py --only gather > $O/bench_gather.txt 2>&1; echo "bench_gather rc=$?"
  cp bench/results/gather_qmm-h200.* $O/ 2>/dev/null  # (bench_decode wrote its tables to $O)
  exit 0
fi
timeout 300 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests > $O/pytest_gpu.txt 2>&1
tail -2 $O/pytest_gpu.txt; grep -E "^(FAILED|ERROR)" $O/pytest_gpu.txt | head -20; pack
for tool in memcheck initcheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 20 python3 scripts/sanitize_kernels.py \
    > $O/kernels-$tool.txt 2>&1; echo "$tool rc=$? $(grep -cE ' ok$' $O/kernels-$tool.txt) ok; $(grep -E 'ERROR SUMMARY|^mismatches' $O/kernels-$tool.txt | tr '\n' ' ')"; pack
done
