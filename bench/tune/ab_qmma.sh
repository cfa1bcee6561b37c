#!/usr/bin/env bash
# A/B of qmma.cu on the device (bench/tune/ab.sh with qmma's benches and tests): first
# `git show REV:libqq/src/cuda/qmma.cu > bench/tune/qmma_baseline.cu` (not committed; carry it).
cd "$(dirname "$0")/../.." || exit 1
SRC=libqq/src/cuda/qmma.cu BENCH="bench/bench_qmm.py --quick;bench/bench_decode.py" \
  TESTS="tests/test_qmma.py tests/test_qmm.py tests/test_qmv.py tests/test_gather_qmm.py" \
  exec bash bench/tune/ab.sh
