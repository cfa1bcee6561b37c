#!/usr/bin/env bash
# The short 2-GPU run: an sm_90a build, then the tests that put arrays on cuda:1
# (tests/test_multi_gpu.py) and the mixed-device errors; log under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=32
nvidia-smi --query-gpu=index,name --format=csv | tee "$OUT/multi.log"
python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
python3 -m pytest -q -rs tests/test_multi_gpu.py tests/test_errors.py -k "device1 or mismatch or mixed" \
  -p no:cacheprovider --tb=short 2>&1 | tee -a "$OUT/multi.log" | tail -15
