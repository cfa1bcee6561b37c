#!/usr/bin/env bash
# Device run for tuning the small-M weight-only kernels (cuda/qmv.cu, cuda/qmma.cu): a
# timing sweep of the present build (bench/tune/qmv_sweep.py) and an ncu profile of the
# M = 1 kernels; with QQ_SASS=1 also an opcode histogram of their SASS. Logs under $OUT
# (nothing else is written). Run after `scripts/gpu_session.sh build` (an sm_90a build) in
# the repository root on the device:
#   OUT=/tmp/qq-out bench/tune/qmv_tune.sh
# There are no run-time knobs: the tuned values are constants in the sources (kQmvSteps in
# qmv.cu, the k-slice rule in qmma.cu's launch, kQmvMaxM / kQmmaMaxM in ops.cuh), so a
# candidate value is a rebuild. Record what a change gained in
# bench/results/qmm-small-m-h100-notes.md; the table of record is bench/bench_qmm.py's.
set -uo pipefail
OUT=${OUT:-/tmp/qq-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# QQ_SWEEP_ARGS: qmv_sweep.py's arguments (--ms, --shapes, --modes)
timeout 150 python3 bench/tune/qmv_sweep.py ${QQ_SWEEP_ARGS:-} 2>&1 | grep -E "GB/s|Error|error" | tee "$OUT/sweep.log"
if [ -n "${QQ_NCU:-1}" ]; then
  ncu --kernel-name regex:qm --launch-count 6 --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section LaunchStats python3 bench/tune/qmv_sweep.py --profile --ms 1 \
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
