#!/usr/bin/env bash
# Session av: grouped gather_qmm (decode layout) behind the temporary knob QQ_KN_GORDER
# (bit 0: work items tile-major, so that the items of one expert read a tile at about the
# same time, the second from L2; bit 1: each item's rows of x staged once by
# gx_stage_kernel, one bulk copy a stage instead of one a row, and the four-CTA 16-row
# form). Build sm_90a, the decode gather tests with the knob at 3 and 1, then
# bench/tune/gather_ab.py per knob value, rounds interleaved.
set -uo pipefail
OUT=${OUT:-/tmp/gorder}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
[ -d .cutlass/cutlass ] && export QQ_CUTLASS_DIR="$PWD/.cutlass"
T0=$(date +%s)
if [ -z "${NOBUILD:-}" ]; then
  python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
  echo "built $(( $(date +%s) - T0 )) s"
fi
for v in ${TESTV:-3 1}; do
  QQ_KN_GORDER=$v timeout 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE \
    tests/test_decode.py tests/test_gather_qmm.py -k gather > "$OUT/pytest_$v.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_$v.log" | head -20; echo "knob $v: $(tail -1 "$OUT/pytest_$v.log")"
done
echo "tested $(( $(date +%s) - T0 )) s"
for r in ${ROUNDS:-1 2}; do
  for v in ${VALUES:-0 1 2 3}; do
    QQ_KN_GORDER=$v timeout 150 python3 bench/tune/gather_ab.py --no-dense --modes ${MODES:-nvfp4,mxfp8,affine4} \
      --tokens ${TOKENS:-4,16,64} > "$OUT/gather_${v}_r$r.txt" 2>&1
    echo "round $r knob $v $(( $(date +%s) - T0 )) s"
  done
done
python3 - "$OUT" <<'PY'
import re, sys, glob, collections
out = sys.argv[1]; t = collections.defaultdict(list)
for f in sorted(glob.glob(out + "/gather_*_r*.txt")):
    v = f.split("_")[-2]
    for line in open(f):
        m = re.match(r"(\S+)\s+(\S+)\s+t=(\d+)\s+([\d.]+) us\s+([\d.]+)", line)
        if m: t[(m.group(1), m.group(2), int(m.group(3)))].append((v, float(m.group(4)), float(m.group(5))))
vals = sorted({v for l in t.values() for v, _, _ in l})
print("us a call (fraction of copy), knob values " + " / ".join(vals))
for k, l in sorted(t.items()):
    cols = []
    for v in vals:
        u = [x for w, x, _ in l if w == v]; f = [y for w, _, y in l if w == v]
        cols.append("%s (%s)" % ("/".join("%.1f" % x for x in u), "/".join("%.2f" % y for y in f)))
    print("%-8s %-13s t=%-3d " % k + "  |  ".join(cols))
PY
