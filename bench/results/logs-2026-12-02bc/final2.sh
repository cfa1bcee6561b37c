#!/usr/bin/env bash
# Session bc, device call 5: the final library (2b33a83's qmmp.cu): the gather_qmm, swiglu and
# route tests, which call 4 did not run.
set -uo pipefail
O=$OUT/j; mkdir -p $O
QUICK=1 OUT=$O bash scripts/gpu_session.sh build > $O/build_step.txt 2>&1 || { tail -30 $O/build_step.txt; exit 1; }
timeout 150 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider --tb=short -rfE tests/test_gather_qmm.py tests/test_swiglu.py \
  tests/test_route.py tests/test_torch_moe.py > $O/pytest.txt 2>&1
tail -2 $O/pytest.txt; grep -E "^(FAILED|ERROR)" $O/pytest.txt | head -20
cp $O/pytest.txt $OUT/call5_pytest.txt
