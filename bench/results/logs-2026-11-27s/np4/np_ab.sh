set -x
export QQ_COMMIT=$1 QUICK=1
bash scripts/gpu_session.sh build > /dev/null 2>&1; tail -1 $OUT/logs/build.log
QQ_DEC_NP=4 timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider --tb=short tests/test_decode.py tests/test_graphs.py -k "not gather" > $OUT/pytest_np4.log 2>&1; tail -2 $OUT/pytest_np4.log
for np in 0 4 0 4; do echo "NP=$np"; QQ_DEC_NP=$np SHAPES=6144x4096,4096x4096,4096x14336 MODES=nvfp4,mxfp8,affine4 MS=1,8 timeout 60 python3 bench/tune/decode_graph.py 2>&1 | grep -v -i warn; done > $OUT/graph_ab.txt 2>&1
cat $OUT/graph_ab.txt
for np in 0 4; do QQ_DEC_NP=$np QQ_BENCH_OUT=$OUT/b$np timeout 150 python3 bench/bench_decode.py --modes nvfp4-decode,mxfp8-decode,affine4-decode --ms 1,4 --budget-s 120 2>&1 | grep -E "^ +[a-z0-9-]+ +qq" ; done > $OUT/step_ab.txt
cat $OUT/step_ab.txt
