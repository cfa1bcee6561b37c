#!/usr/bin/env bash
# The next session's first device call (written in session ay, not run): the GPU tests edited
# after ay's last device call (route assertions, 4b88b7d), every skip's reason listed (which
# come from conftest's NotSupportedError-to-skip hook), and capture_sync_probe.py.
#   OUT=$OUT bash bench/results/logs-2026-12-02ay/next.sh     (~8 minutes: build, the edited tests, the whole GPU suite again for its skips, the probe)
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
TESTS="tests/test_qmma.py tests/test_qmv.py tests/test_qqmm.py tests/test_decode.py tests/test_quantize.py tests/test_interop.py tests/test_amax.py" \
  WORKERS=16 OUT=$OUT/s bash scripts/gpu_session.sh build test 2>&1 | tail -12
echo "tests $(( $(date +%s) - T0 )) s"
# every skip of the whole GPU suite with its reason (-rs), collection only where possible
timeout 240 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider -rs tests 2>&1 | grep -E "^SKIPPED" \
  | sed -E 's/^SKIPPED \[[0-9]+\] //' | sort | uniq -c | sort -rn > "$OUT/skips.txt"
grep -c "" "$OUT/skips.txt"; grep -i "not supported by this build" "$OUT/skips.txt" | head -20
echo "skips $(( $(date +%s) - T0 )) s"
(cd bench/tune && CUDA_LOG_FILE=stdout timeout 90 python3 capture_sync_probe.py 2>&1 \
  | grep -v "cuCtxGetDevice\|No CUDA context" | tee "$OUT/capture_sync_probe.txt")
echo "all $(( $(date +%s) - T0 )) s"
