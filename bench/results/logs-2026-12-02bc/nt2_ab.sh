#!/usr/bin/env bash
# Session bc, device call 1: two 64-row tiles a CTA at 33..64 rows (qmmp.cu's NT = 2).
# Build, the decode tests that reach it (and the forms beside it), memcheck of the new test,
# then decode_graph at 33 / 48 / 64 rows with the knob QQ_DECODE_NT1 off / on, twice, interleaved.
set -uo pipefail
O=$OUT/f; mkdir -p $O
QUICK=1 OUT=$O bash scripts/gpu_session.sh build > $O/build_step.txt 2>&1 || { tail -30 $O/build_step.txt; exit 1; }
timeout 300 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
  -k "two_tiles or same_bits or gated or gpu_matches or out_and_det or f16" > $O/pytest_decode.txt 2>&1
tail -3 $O/pytest_decode.txt; grep -E "^(FAILED|ERROR)" $O/pytest_decode.txt | head -20
for r in 1 2; do
  for nt1 in "" 1; do
    echo "== round $r NT1=${nt1:-off}"
    QQ_DECODE_NT1=$nt1 LAYOUTS=decode MS=33,48,64 SHAPES=16384x16384,28672x4096 MODES=nvfp4,mxfp4,mxfp8 \
      timeout 120 python3 bench/tune/decode_graph.py 2>&1 | grep -v "^$"
  done
done > $O/ab.txt 2>&1
cat $O/ab.txt | tail -60
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 python3 -m pytest -q -m gpu \
  -p no:cacheprovider --tb=line tests/test_decode.py -k "two_tiles and (nvfp4 or mxfp8)" > $O/memcheck.txt 2>&1
echo "memcheck rc=$?"; tail -3 $O/memcheck.txt
cd $O && tar czf $OUT/nt2.tgz *.txt logs 2>/dev/null; ls $OUT
