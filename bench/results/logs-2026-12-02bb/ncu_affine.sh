#!/usr/bin/env bash
# Session bb: instructions an element of the row-wise affine quantize kernel (bf16 16384^2,
# affine4 g64 and affine8 g64) with the exact quotient (the tree) and with the band-tested
# reciprocal quotient (affine_band_revert.patch.txt), from ncu's executed-instruction counters.
#   OUT=$OUT bash bench/results/logs-2026-12-02bb/ncu_affine.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
T0=$(date +%s)
PROG='import torch, qq
x = torch.randn(16384, 16384, dtype=torch.bfloat16, device="cuda")
for b in (4, 8):
    qq.quantize(x, mode="affine", bits=b, group_size=64)
torch.cuda.synchronize()'
M=smsp__inst_executed.sum,smsp__thread_inst_executed.sum,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
run() {
  python3 -m pip install --no-build-isolation --no-deps -e . -C cmake.define.QQ_CUDA_ARCHS=90a > $OUT/build-$1.log 2>&1 || { tail -20 $OUT/build-$1.log; return 1; }
  echo "build $1 $(( $(date +%s) - T0 )) s"
  ncu -k regex:quantize_affine --metrics $M python3 -c "$PROG" > $OUT/ncu-$1.txt 2>&1
  grep -E "quantize_affine|inst_executed|duration|issue_active|dram__|warps_active" $OUT/ncu-$1.txt | sed 's/  */ /g' | cut -c1-120
}
mkdir -p $OUT
run exact || exit 1
git apply bench/results/logs-2026-12-02bb/affine_band_revert.patch.txt && run band
git apply -R bench/results/logs-2026-12-02bb/affine_band_revert.patch.txt
echo "all $(( $(date +%s) - T0 )) s"
