#!/usr/bin/env bash
# A/B of qq.torch's QQLinear step on the device, one build: A = bench/tune/torch_linear_baseline.py
# (an older python/qq/torch.py, run against today's libqq - its calls must still exist), B = the
# working tree's python/qq/torch.py. bench_linear (or BENCH=bench_moe) runs A, B, A, B (the peer
# re-measured in each run: read the ratios); then profile_linear.py on A and B (PROFILE_MODES=none
# skips it). Logs under $OUT.
#   git show REV:python/qq/torch.py > bench/tune/torch_linear_baseline.py   (ignored: carry it)
#   bash bench/tune/ab_linear.sh        (after scripts/gpu_session.sh build)
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cp python/qq/torch.py /tmp/ab_torch_new.py
for side in ${SIDES:-a b a b}; do
  if [ $side = a ]; then cp bench/tune/torch_linear_baseline.py python/qq/torch.py; else cp /tmp/ab_torch_new.py python/qq/torch.py; fi
  echo "=== $side $(date +%T)"
  QQ_BENCH_OUT="$OUT/res_$side" timeout ${BENCH_TIMEOUT:-150} python3 bench/${BENCH:-bench_linear}.py ${QUICK:+--quick} \
    >> "$OUT/${BENCH:-bench_linear}_$side.log" 2>&1
  grep -E "qqlinear|moe_layer" "$OUT/${BENCH:-bench_linear}_$side.log" | tail -6
done
[ "${PROFILE_MODES:-}" = none ] || for side in a b; do
  if [ $side = a ]; then cp bench/tune/torch_linear_baseline.py python/qq/torch.py; else cp /tmp/ab_torch_new.py python/qq/torch.py; fi
  timeout ${PROFILE_TIMEOUT:-150} python3 bench/tune/profile_linear.py ${PROFILE_MODES:-mxfp8 nvfp4} > "$OUT/profile_linear_$side.log" 2>&1
done
cp /tmp/ab_torch_new.py python/qq/torch.py
echo "=== done $(date +%T)"
