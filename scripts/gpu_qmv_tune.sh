#!/usr/bin/env bash
# Device run for tuning the small-M kernels: a quick sm_90a-only build, the qmv tests,
# a sweep of QQ_QMV_STEPS and an ncu profile of the M=1 kernels; logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
timeout 240 python3 -m pytest -q -x -m gpu tests/test_matmul_gpu.py tests/test_matmul.py -k "${QQ_TEST_K:-qmm or quantized or qmv or qmma or qqmm}" \
  -p no:cacheprovider --tb=short 2>&1 | tail -5
# QQ_SWEEP_ENVS: space-separated settings, one sweep each (e.g. "QQ_QMMA=0 QQ_QMMA=1")
for e in ${QQ_SWEEP_ENVS:-QQ_QMMA=0 QQ_QMMA=1}; do
  env "$e" timeout 150 python3 scripts/qmv_sweep.py ${QQ_SWEEP_ARGS:-} 2>&1 | sed "s/^/$e /" | grep -E "GB/s|Error|error"
done | tee "$OUT/sweep.log"
if [ -n "${QQ_NCU:-1}" ]; then
  ncu --kernel-name regex:qm --launch-count 6 --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section LaunchStats python3 scripts/qmv_sweep.py --profile --ms 1 \
    --shapes 16384x16384 --modes nvfp4,mxfp8,affine4 > "$OUT/ncu.log" 2>&1
  grep -E "qmv_t|qmma_k|Duration|Memory Throughput|DRAM Through|Compute \(SM\)|Achieved Occ|Registers Per|Issued Ipc|No Eligible|Stall|Warp Cycles Per Issued|Block Limit Reg|Grid Size|Threads  " \
    "$OUT/ncu.log" | head -120
fi
if [ -n "${QQ_SASS:-}" ]; then
  # opcode histogram of the small-M kernels (which instructions a weight costs)
  lib=$(python3 -c "import qq, os; print(os.path.join(os.path.dirname(qq._qq.__file__), 'lib', 'libqq.so.0'))")
  cuobjdump -sass "$lib" > "$OUT/sass.txt" 2>&1
  python3 - "$OUT/sass.txt" <<'PY'
import re, sys, collections
cur, hist = None, collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m:
        cur = m.group(1) if re.search(r"qmma_kernelILi[012]ELi8E|qmv_t_kernelI.*5XBF16ELi0ELi1ELb0", m.group(1)) else None
        continue
    if cur:
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", line)
        if m:
            hist[cur][m.group(1)] += 1
for f, h in hist.items():
    print(f[:80], sum(h.values()), " ".join(f"{k}:{v}" for k, v in h.most_common(22)))
PY
  gzip -f "$OUT/sass.txt"
fi
