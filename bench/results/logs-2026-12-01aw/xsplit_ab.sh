#!/usr/bin/env bash
# Session aw's A/B on the working tree with its knobs (QQ_KN_ASTAGE: 1 = affine's 9..16 rows
# staged where K is split, 3 = every format's; QQ_KN_XSPLIT = about how many blocks
# x_stage_kernel runs, its rows split over blockIdx.y). Build sm_90a, test_decode's bit / match
# / gather tests at ASTAGE=3 XSPLIT=128, decode_graph at M = 12 / 16 and the step at M = 16.
set -uo pipefail
OUT=${OUT:-/tmp/xsplit}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
T0=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "built $(( $(date +%s) - T0 )) s"
QQ_KN_ASTAGE=3 QQ_KN_XSPLIT=128 timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_decode.py \
  -k "every_m or gpu_matches or non_finite or f16 or long_k or gather" > "$OUT/pytest.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20; tail -n 1 "$OUT/pytest.log"
echo "tests $(( $(date +%s) - T0 )) s"
for cf in 0,0 0,128 1,128 3,128 1,0; do
  a=${cf%,*}; x=${cf#*,}
  QQ_KN_ASTAGE=$a QQ_KN_XSPLIT=$x LAYOUTS=decode MS=12,16 MODES=nvfp4,mxfp8,affine4,affine8 SHAPES=4096x14336,4096x4096,6144x4096,28672x4096 \
    timeout 60 python3 bench/tune/decode_graph.py > "$OUT/graph_${a}_$x.txt" 2>&1
done
echo "graphs $(( $(date +%s) - T0 )) s"
for cf in 0,0 1,128 3,128 0,128; do
  a=${cf%,*}; x=${cf#*,}
  QQ_KN_ASTAGE=$a QQ_KN_XSPLIT=$x MODES=nvfp4-decode,mxfp8-decode,affine4-decode,affine8-decode M=16 ACT=fused timeout 100 \
    python3 bench/tune/profile_decode_step.py > "$OUT/step_${a}_$x.txt" 2>&1
  echo "== step M=16 astage $a xsplit $x"; grep -E "step" "$OUT/step_${a}_$x.txt" | cut -c1-90
done
echo "steps $(( $(date +%s) - T0 )) s"
python3 - "$OUT" <<'PY'
import sys, glob, os, re
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/graph_*.txt")):
    cf = os.path.basename(f)[6:-4]
    for line in open(f):
        m = re.match(r"(\S+)\s+\(\s*(\d+),\s*(\d+)\) M=\s*(\d+):.*?decode\s+([\d.]+) us", line)
        if m:
            rows.setdefault(m.group(1, 2, 3, 4), {})[cf] = float(m.group(5))
cfs = ["0_0", "0_128", "1_128", "3_128", "1_0"]
print("graph us:", " ".join(cfs))
for k, v in rows.items():
    print(" ".join(k), " ".join(f"{v.get(c, float('nan')):7.2f}" for c in cfs))
PY
