#!/usr/bin/env bash
# Session bc, device call 3: two tiles a CTA at 17..32 rows too (knob QQ_DECODE_NT2_32=1),
# against the two-CTAs-an-SM form; the 17..32-row decode tests with the knob on.
set -uo pipefail
O=$OUT/h; mkdir -p $O
QUICK=1 OUT=$O bash scripts/gpu_session.sh build > $O/build_step.txt 2>&1 || { tail -30 $O/build_step.txt; exit 1; }
run() { LAYOUTS=decode MS=17,24,32 SHAPES=16384x16384,28672x4096 MODES=nvfp4,mxfp4,mxfp8 timeout 120 python3 bench/tune/decode_graph.py 2>&1 | grep -v "^$"; }
for r in 1 2; do
  echo "== round $r NT2_32"; QQ_DECODE_NT2_32=1 bash -c "$(declare -f run); run"
  echo "== round $r base"; env -u QQ_DECODE_NT2_32 bash -c "$(declare -f run); run"
done > $O/ab.txt 2>&1
grep -E "==|M=" $O/ab.txt | awk '{print $1,$2,$3,$8,$9}'
QQ_DECODE_NT2_32=1 timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider --tb=short tests/test_decode.py \
  -k "two_tiles or same_bits or gated" > $O/pytest.txt 2>&1; tail -2 $O/pytest.txt; grep -E "^(FAILED|ERROR)" $O/pytest.txt | head
cd $O && tar czf $OUT/nt2_32.tgz *.txt
