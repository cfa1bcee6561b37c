#!/usr/bin/env bash
# Session be: does the gated gate/up kernel (SwiGLU fused) want the early trigger at 33..64
# rows? The tree carries a temporary knob, QQ_KN_SWIGLU_EARLY=R (swiglu mode triggers its
# dependents at the start from R kernel rows on; unset: never, as landed).
# Steps: build; gated64_probe.py (the gate/up + down pair, graphs) knob unset / 33;
# bench_decode --ms 64 (and 16) for three modes, acts qq / fused, knob unset / 33; the gated
# decode tests under the knob; the probe again. (As run in call 7.) $OUT/early.tgz after every step.
set -uo pipefail
O=/tmp/early; rm -rf $O; mkdir -p $O
pack() { tar czf "$OUT/early.tgz" -C /tmp early 2>/dev/null; }
trap pack EXIT
QUICK=1 OUT=$O bash scripts/gpu_session.sh build > $O/build_step.txt 2>&1 || { tail -30 $O/build_step.txt; exit 1; }
probe() {
  for v in off 33; do
    if [ $v = off ]; then env -u QQ_KN_SWIGLU_EARLY timeout 100 python3 bench/tune/gated64_probe.py 16 32 64
    else QQ_KN_SWIGLU_EARLY=$v timeout 100 python3 bench/tune/gated64_probe.py 16 32 64; fi >> $O/probe.txt 2>&1
    pack
  done
}
probe
grep knob= $O/probe.txt
for v in off 33; do
  A="--modes nvfp4-decode,mxfp8-decode,affine4-decode --ms 16,64 --acts qq,fused --budget-s 100"
  if [ $v = off ]; then env -u QQ_KN_SWIGLU_EARLY QQ_BENCH_OUT=$O/dec_$v timeout 150 python3 bench/bench_decode.py $A
  else QQ_KN_SWIGLU_EARLY=$v QQ_BENCH_OUT=$O/dec_$v timeout 150 python3 bench/bench_decode.py $A; fi > $O/decode_$v.txt 2>&1
  grep -E "graph=True" $O/decode_$v.txt | grep torch_bf16_graph | awk -v v=$v '{print v, $2, $3, $5, $NF}'; pack
done
QQ_KN_SWIGLU_EARLY=33 timeout 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -k "gated or swiglu" \
  tests/test_decode.py tests/test_graphs.py > $O/pytest_gated_knob33.txt 2>&1; tail -1 $O/pytest_gated_knob33.txt
probe  # a second round where time is left
