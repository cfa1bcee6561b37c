#!/usr/bin/env bash
# Session bc, device call 4: the final library (no knobs): build, the decode tests, the CUDA-graph
# tests, bench_qmm --only decode (qmm_decode-h200.md), decode_graph 1 / 16 / 33 / 64 rows.
set -uo pipefail
O=$OUT/i; mkdir -p $O
QUICK=1 OUT=$O bash scripts/gpu_session.sh build > $O/build_step.txt 2>&1 || { tail -30 $O/build_step.txt; exit 1; }
timeout 220 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py tests/test_graphs.py \
  -k "two_tiles or same_bits or gated or gpu_matches or out_and_det or f16 or decode" > $O/pytest.txt 2>&1
tail -2 $O/pytest.txt; grep -E "^(FAILED|ERROR)" $O/pytest.txt | head -20
QQ_COMMIT=${QQ_COMMIT:-} timeout 260 python3 bench/bench_qmm.py --only decode > $O/bench_qmm.txt 2>&1; echo "bench_qmm rc=$?"
cp bench/results/qmm_decode-*.md bench/results/qmm_decode-*.json $O/ 2>/dev/null
LAYOUTS=decode MS=1,16,33,64 MODES=nvfp4,mxfp4,mxfp8 timeout 90 python3 bench/tune/decode_graph.py > $O/decode_graph.txt 2>&1
grep "M=" $O/decode_graph.txt | sed -E 's/packed +nan us \(nan of copy\) +//; s/xnan.*//'
cd $O && tar czf $OUT/final.tgz *.txt *.md *.json 2>/dev/null; ls $OUT
