#!/usr/bin/env bash
# Session au: 33..64 rows with one warpgroup a parity (m64n64k16, each fragment block decoded
# once, 8 consumer warps) behind the temporary knob QQ_KN_WG8 (qmmp_wg8_knob.patch.txt),
# against today's two warpgroups a parity (16 warps, each block decoded twice). Session ai
# measured this form before the epilogue was rolled (its ~30-40 us fixed cost a tile);
# this is the re-measurement. Apply, build sm_90a, test_decode's bit / match tests with the
# knob on, then decode_graph at 32 / 64 rows with the knob off / on, two rounds interleaved.
set -uo pipefail
OUT=${OUT:-/tmp/wg8}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
P=bench/results/logs-2026-12-01au/qmmp_wg8_knob.patch.txt
git apply "$P" || { echo "patch does not apply"; exit 1; }
T0=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; git apply -R "$P"; exit 1; }
echo "built $(( $(date +%s) - T0 )) s"
QQ_KN_WG8=1 timeout 240 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
  -k "${K:-every_m or gpu_matches or non_finite or f16 or gated or long_k}" > "$OUT/pytest_wg8.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/pytest_wg8.log" | head -20; tail -1 "$OUT/pytest_wg8.log"
echo "tested $(( $(date +%s) - T0 )) s"
for r in 1 2; do
  for v in 0 1; do
    QQ_KN_WG8=$v LAYOUTS=decode MS=${MS:-32,64} MODES=${MODES:-nvfp4,mxfp8,affine4,affine8} \
      SHAPES=${SHAPES:-16384x16384,28672x4096,6144x4096,4096x14336,4096x4096} \
      timeout 100 python3 bench/tune/decode_graph.py > "$OUT/graph_wg8_${v}_r$r.txt" 2>&1
    echo "round $r knob $v $(( $(date +%s) - T0 )) s"
  done
done
python3 - "$OUT" <<'PY'
import re, sys, glob, collections
out = sys.argv[1]; t = collections.defaultdict(list)
for f in sorted(glob.glob(out + "/graph_wg8_*_r*.txt")):
    v = f.split("_")[-2]
    for line in open(f):
        m = re.match(r"(\S+)\s+\(\s*(\d+),\s*(\d+)\) M=(\d+):.*?decode\s+([\d.]+) us", line)
        if m: t[(m.group(1), m.group(2), m.group(3), m.group(4))].append((v, float(m.group(5))))
for k, l in sorted(t.items()):
    a = [u for v, u in l if v == "0"]; b = [u for v, u in l if v == "1"]
    print("%-8s %5s x %5s M=%-3s  16 warps %s  ->  8 warps %s" % (k + (" / ".join("%.1f" % u for u in a), " / ".join("%.1f" % u for u in b))))
PY
for f in $(git apply --numstat "$P" | cut -f3); do rm -f build/*/CMakeFiles/*/"$f".o; done
git apply -R "$P"
