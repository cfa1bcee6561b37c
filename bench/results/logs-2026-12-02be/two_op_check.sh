#!/usr/bin/env bash
# Session be, last call: quantized_matmul_swiglu past 16 kernel rows as the gated product
# plus qq's swiglu kernel (qmmp.cu decode_matmul). Build; the gated / swiglu GPU tests of
# test_decode.py and test_graphs.py; bench_decode at 16 and 64 tokens, acts qq / fused.
# $OUT/two.tgz after every step.
set -uo pipefail
O=/tmp/two; rm -rf $O; mkdir -p $O
pack() { tar czf "$OUT/two.tgz" -C /tmp two 2>/dev/null; }
trap pack EXIT
QUICK=1 OUT=$O bash scripts/gpu_session.sh build > $O/build_step.txt 2>&1 || { tail -30 $O/build_step.txt; exit 1; }
timeout 100 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE -k "gated or swiglu" \
  tests/test_decode.py tests/test_graphs.py > $O/pytest_gated.txt 2>&1; tail -1 $O/pytest_gated.txt
grep -E "^(FAILED|ERROR)" $O/pytest_gated.txt | head; pack
QQ_BENCH_OUT=$O/dec timeout 120 python3 bench/bench_decode.py --modes nvfp4-decode,mxfp8-decode,affine4-decode \
  --ms 16,64 --acts qq,fused --budget-s 80 > $O/decode.txt 2>&1
grep -E "graph=True" $O/decode.txt | grep torch_bf16_graph | awk '{print $2, $3, $5, $NF}'
