# EXPERIMENT (session p): colaff_kernel variants picked by QQ_COLAFF_VAR, one build
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
for v in ${VARS:-1 5 1 5}; do
  echo "=== var $v"
  QQ_COLAFF_VAR=$v QQ_BENCH_OUT=/tmp/bo python3 bench/bench_quantize.py --quick --only colwise 2>&1 | grep affine
done > $OUT/vars.log
cat $OUT/vars.log
for v in ${TVARS:-5}; do QQ_COLAFF_VAR=$v timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_colwise.py -k affine 2>&1 | tail -1; done
