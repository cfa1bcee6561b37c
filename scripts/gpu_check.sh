#!/usr/bin/env bash
# One device run: build, test, benchmark; logs and result tables under $OUT.
#   scripts/gpu_check.sh [steps...]   steps: info build test sanitize bench (default: all but sanitize)
# The device machine has no network: install without build isolation and
# without dependency resolution (torch's nvidia-cublas, numpy, ml_dtypes and
# cuda-pathfinder are already there).
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=${*:-info build test bench}
rc=0
for step in $steps; do
  echo "=== $step"
  case $step in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/info.log"
      python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/info.log"
      ;;
    build)
      # QQ_ARCHS (e.g. 90a): build only those architectures (a faster device build)
      python3 -m pip install --no-build-isolation --no-deps -e ".[test]" \
        ${QQ_ARCHS:+-C cmake.define.QQ_CUDA_ARCHS=$QQ_ARCHS} >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
      python3 -m qq 2>&1 | tee "$OUT/main.log" || rc=1
      ;;
    test)
      python3 -m pytest -q -rs -x --timeout=600 tests 2>&1 | tee "$OUT/pytest.log" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;
    sanitize)
      # memcheck over every GPU test; racecheck over the kernels that share
      # memory between threads (the tile kernel, amax).
      compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -x -m gpu tests 2>&1 \
        | tee "$OUT/sanitize-memcheck.log" | tail -6
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -x -m gpu \
        tests/test_colwise.py tests/test_amax.py 2>&1 | tee "$OUT/sanitize-racecheck.log" | tail -6
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;
    profile)
      ncu --section SpeedOfLight --section Occupancy --section LaunchStats python3 scripts/profile_quantize.py \
        > "$OUT/ncu.log" 2>&1 || rc=1
      grep -E "quantize|dequantize|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Duration" \
        "$OUT/ncu.log" | head -80
      ;;
    bench)
      for b in bench/bench_*.py; do
        QQ_BENCH_OUT="$OUT" python3 "$b" ${QQ_BENCH_ARGS:-} 2>&1 | tee "$OUT/$(basename "$b" .py).log" || rc=1
      done
      ;;
  esac
done
exit $rc
