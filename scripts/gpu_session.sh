#!/usr/bin/env bash
# The one device script: build for the present GPU, run the GPU tests, the
# compute-sanitizer checks and the benchmarks, each step's log under $OUT.
#   QQ_COMMIT=<short hash> scripts/gpu_session.sh STEP...   (in the repository root on the
#   device; QQ_COMMIT stamps the result tables: the device's .git may be stale)
# Steps:
#   build      pip install (no isolation, no deps: the device has no network) for sm_90a;
#              CUTLASS's headers from .cutlass/ (carried: cp -r of the nvidia-cutlass wheel's
#              cutlass_library/source/include) when present, else whatever the venv has;
#              cuBLASLt's headers from .cublas/include (carried: the nvidia-cublas wheel's
#              nvidia/cu13/include, the version the shipped wheel builds against) when present,
#              else the venv's (13.1 on the H200: its grouped GEMM code is then compiled out)
#   test       every GPU test (pytest -m gpu, WORKERS=8 workers) + python -m qq; TESTS="..." narrows
#              it to those paths / -k expressions (e.g. TESTS="tests/test_grouped.py")
#   memcheck   compute-sanitizer memcheck over every GPU test (8 workers); TESTS as above
#   racecheck  racecheck + initcheck over the GPU tests of the kernels that use shared
#              memory (qmma, qmv, the quantize tile kernel, amax): slow (torch's kernels
#              are instrumented at start-up); `kernels` is the quick form
#   kernels    memcheck, racecheck and initcheck over scripts/sanitize_kernels.py (CuPy, no torch)
#   profile    ncu (SpeedOfLight, Occupancy) of bench/tune/profile_quantize.py
#   ncusrc     ncu's Source page (SASS, warp-stall samples per instruction) of decode-layout
#              calls: NCU_CASES="4096x14336:nvfp4:1 4096x4096:nvfp4:1" (bench/tune/ncu_dec.py)
#   clink      C linking without Python on a CUDA build (tests/test_install.py)
#   multi      the 2-GPU tests (tests/test_multi_gpu.py and the mixed-device errors)
#   bench      bench_overhead (GPU rows) and bench_decode (DECODE_ARGS="..." its arguments);
#              BENCHES="..." adds others
# One file comes back: $OUT/session.tgz (logs/ and results/). (Replaces gpu_check.sh,
# gpu_final.sh and gpu_multi.sh, cited by results notes before 2026-11-23.)
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
LOG="$OUT/logs"; RES="$OUT/results"
mkdir -p "$LOG" "$RES"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
rc=0
pack() { tar czf "$OUT/session.tgz" -C "$OUT" logs results; }
trap pack EXIT
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case $step in
    build)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOG/info.log"
      [ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
      LT=()
      [ -f .cublas/include/cublasLt.h ] && LT=(-C "cmake.define.QQ_CUBLASLT_ROOT=$PWD/.cublas")
      python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=${QQ_ARCHS:-90a} ${LT[@]+"${LT[@]}"} \
        > "$LOG/build.log" 2>&1 || { tail -40 "$LOG/build.log"; exit 1; }
      if [ -z "${QUICK:-}" ]; then
        python3 -m qq > "$LOG/main.log" 2>&1 || rc=1
        tail -25 "$LOG/main.log"
      fi
      ;;
    test)
      timeout 560 python3 -m pytest -q -m gpu -n ${WORKERS:-8} -p no:cacheprovider --tb=short -rfEs ${TESTS:-tests} \
        > "$LOG/pytest_gpu.log" 2>&1 || rc=1
      grep -E "^(FAILED|ERROR)" "$LOG/pytest_gpu.log" | head -40; tail -2 "$LOG/pytest_gpu.log"
      ;;
    memcheck)
      timeout 580 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
        --print-limit 20 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider --tb=line ${TESTS:-tests} \
        > "$LOG/memcheck.log" 2>&1 || rc=1
      grep -E "ERROR SUMMARY|Invalid|FAILED" "$LOG/memcheck.log" | sort | uniq -c | head -20
      tail -2 "$LOG/memcheck.log"
      ;;
    racecheck)
      # racecheck runs shared-memory kernels ~100x slower: one test family per kernel
      K='qmma_shapes or qmma_code_space or qmm_m_sweep or colwise_fp_equals or test_moe or test_random'
      for tool in racecheck initcheck; do
        timeout ${SAN_TIMEOUT:-270} compute-sanitizer --tool $tool --target-processes all --error-exitcode 9 \
          --print-limit 20 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider --tb=line -k "$K" \
          tests/test_qmma.py tests/test_qmm.py tests/test_colwise.py tests/test_amax.py \
          > "$LOG/$tool.log" 2>&1 || rc=1
        echo "$tool:"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG/$tool.log" | sort | uniq -c | head; tail -1 "$LOG/$tool.log"
      done
      ;;
    kernels)
      for tool in memcheck racecheck initcheck; do
        timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 20 \
          python3 scripts/sanitize_kernels.py > "$LOG/kernels-$tool.log" 2>&1 || rc=1
        # (the checks' count and the script's last line, "mismatches: N": a Python error stops
        # the workload while the sanitizer still reports 0 errors for what ran)
        echo "$tool: $(grep -cE ' ok$' "$LOG/kernels-$tool.log") checks ok, $(grep -cE 'MISMATCH$' "$LOG/kernels-$tool.log") mismatched;" \
          "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^mismatches|Traceback|Target application returned an error' "$LOG/kernels-$tool.log" | tr '\n' ' ')"
      done
      ;;
    profile)
      ncu --section SpeedOfLight --section Occupancy --section LaunchStats python3 bench/tune/profile_quantize.py \
        > "$LOG/ncu.log" 2>&1 || rc=1
      grep -E "quantize|dequantize|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Duration" \
        "$LOG/ncu.log" | head -80
      ;;
    ncusrc)
      # per-instruction SASS with ncu's warp-stall samples and execution counts (the Source
      # page as CSV) of one decode-layout call per NCU_CASES entry SHAPE:MODE:M (ncu_dec.py)
      for c in ${NCU_CASES:-4096x14336:nvfp4:1}; do
        IFS=: read -r shp md mm <<< "$c"
        n="ncu_src-$shp-$md-m$mm"
        SHAPE=$shp MODE=$md M=$mm timeout 200 ncu --section SourceCounters --section WarpStateStats \
          --section SchedulerStats --import-source no --launch-skip 3 --launch-count 1 -k regex:qmmp \
          -f -o "$LOG/$n" python3 bench/tune/ncu_dec.py > "$LOG/$n.log" 2>&1 || rc=1
        ncu -i "$LOG/$n.ncu-rep" --page source --csv --print-source sass > "$LOG/$n-sass.csv" 2>&1 || rc=1
        ncu -i "$LOG/$n.ncu-rep" > "$LOG/$n-details.txt" 2>&1 || rc=1
        echo "$c: $(wc -l < "$LOG/$n-sass.csv") SASS rows; $(grep -E 'Duration|Issue Slots Busy|No Eligible' "$LOG/$n-details.txt" | tr -s ' ' | tr '\n' ';')"
      done
      ;;
    clink)
      # C linking without Python, CUDA build: plain CMake build + install, examples/c via
      # find_package and pkg-config, run (tests/test_install.py)
      QQ_TEST_INSTALL_CUDA=${QQ_ARCHS:-90a} timeout 500 python3 -m pytest -q -n 0 -p no:cacheprovider --tb=short \
        tests/test_install.py > "$LOG/clink.log" 2>&1 || rc=1
      tail -3 "$LOG/clink.log"
      ;;
    multi)
      nvidia-smi --query-gpu=index,name --format=csv
      python3 -m pytest -q -n 0 -rs tests/test_multi_gpu.py tests/test_errors.py -k "device1 or mismatch or mixed" \
        -p no:cacheprovider --tb=short > "$LOG/multi.log" 2>&1 || rc=1
      tail -15 "$LOG/multi.log"
      ;;
    bench)
      QQ_BENCH_OUT="$RES" timeout 120 python3 bench/bench_overhead.py --gpu-only > "$LOG/bench_overhead.log" 2>&1 || rc=1
      tail -15 "$LOG/bench_overhead.log"
      QQ_BENCH_OUT="$RES" timeout 300 python3 bench/bench_decode.py ${DECODE_ARGS:-} > "$LOG/bench_decode.log" 2>&1 || rc=1
      tail -30 "$LOG/bench_decode.log"
      for b in ${BENCHES:-}; do
        QQ_BENCH_OUT="$RES" timeout 240 python3 bench/bench_$b.py > "$LOG/bench_$b.log" 2>&1 || rc=1
        tail -8 "$LOG/bench_$b.log"
      done
      ;;
    *) echo "unknown step $step"; rc=1 ;;
  esac
done
exit $rc
