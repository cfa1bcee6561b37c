#!/usr/bin/env bash
# The next session's first device call (written in session ba, not run): grouped_qqmm_wgrad's
# new Blackwell route (qqmm.cu grouped_wgrad_blockscaled, seg_qdq_kernel's code form), which
# no GPU has run yet, through its Hopper tests (emulate_grouped_blockscaled, force_blockscaled),
# memcheck over them (test_grouped.py whole: also grouped_qqmm's Blackwell route, whose code
# ca64c31 reshaped - shared helpers, behaviour unchanged - after it passed here on b1377a0),
# and the E = 8 MoE step's kernel times (seg_qdq_kernel's values form gained
# a template parameter and an unused argument: its time should stay at session ag's 276.8 us
# for x4, logs-2026-11-30ag/profile_moe8-cc1b1df.txt). The whole GPU suite is the second call.
#   OUT=$OUT QQ_COMMIT=<hash> bash bench/results/logs-2026-12-02ba/next.sh   (~7 minutes), with
#   carry [".cutlass", ".cublas"] (made as logs-2026-12-02az/next.sh says).
# Files that come back: $OUT/{b,a,m}/session.tgz and $OUT/profile_moe8.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
QUICK=1 OUT=$OUT/b bash scripts/gpu_session.sh build > /dev/null 2>&1 || { echo "build failed"; tail -30 $OUT/b/logs/build.log; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
TESTS="tests/test_grouped.py tests/test_graphs.py" WORKERS=16 OUT=$OUT/a bash scripts/gpu_session.sh test 2>&1 | tail -15
echo "subset $(( $(date +%s) - T0 )) s"
timeout 120 python3 bench/tune/profile_linear.py --moe 8 > $OUT/profile_moe8.txt 2>&1
grep -E "seg_qdq|moe_qdq|qdq_kernel|total" $OUT/profile_moe8.txt | head -12
echo "profile $(( $(date +%s) - T0 )) s"
TESTS="tests/test_grouped.py -k wgrad_blockscaled" OUT=$OUT/m timeout $(( 580 - ($(date +%s) - T0) )) \
  bash scripts/gpu_session.sh memcheck 2>&1 | tail -6
echo "all $(( $(date +%s) - T0 )) s"
