#!/usr/bin/env bash
# The session's closing device run: build, every GPU test, then all benchmarks;
# results and logs come back as $OUT/final.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
mkdir -p "$OUT/logs" "$OUT/results"
export CMAKE_BUILD_PARALLEL_LEVEL=16 PYTHONUNBUFFERED=1 QQ_ARCHS=${QQ_ARCHS:-90a}
bash scripts/gpu_check.sh info build > "$OUT/logs/build.log" 2>&1 || { tail -30 "$OUT/logs/build.log"; exit 1; }
timeout 300 python3 -m pytest -q -m gpu --timeout=250 tests -p no:cacheprovider --tb=short -rf > "$OUT/logs/pytest.log" 2>&1
grep -E "^FAILED" "$OUT/logs/pytest.log" | sed -e 's/ - .*//' | head -30; tail -1 "$OUT/logs/pytest.log"
# the adapters in full (CPU and GPU cases; JAX is installed on the device machine)
timeout 200 python3 -m pytest -q tests/test_torch_adapter.py tests/test_jax_adapter.py -p no:cacheprovider --tb=short -rf \
  > "$OUT/logs/pytest_adapters.log" 2>&1
grep -E "^FAILED|Error" "$OUT/logs/pytest_adapters.log" | head -20; tail -1 "$OUT/logs/pytest_adapters.log"
for b in ${QQ_BENCHES:-qmm qqmm grouped linear quantize}; do
  QQ_BENCH_OUT="$OUT/results" timeout 200 python3 bench/bench_$b.py > "$OUT/logs/bench_$b.log" 2>&1
  echo "bench_$b rc=$?"
done
# one file back (the device returns a limited number of files)
tar czf "$OUT/final.tgz" -C "$OUT" logs results && rm -rf "$OUT/logs" "$OUT/results"
