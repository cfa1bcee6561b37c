#!/usr/bin/env bash
# The next session's first device call (written in session az, not run): grouped_qqmm's new
# Blackwell route (qqmm.cu grouped_qqmm_blockscaled, gemm.cu gemm_grouped_blockscaled), which
# no GPU has run yet, through its Hopper tests (the emulate_grouped_blockscaled and
# force_blockscaled hooks), memcheck over them, then the whole GPU suite on the same build.
#   OUT=$OUT QQ_COMMIT=<hash> bash bench/results/logs-2026-12-02az/next.sh   (~8 minutes), with
#   carry [".cutlass", ".cublas"]: .cutlass from the nvidia-cutlass wheel (pip download
#   "nvidia-cutlass>=4.2,<5"; its cutlass_library/source/include), .cublas/include from the
#   nvidia-cublas wheel's nvidia/cu13/include (pip download --no-deps nvidia-cublas==13.10.0.20,
#   or /tmp/pip-build-env-*/normal/lib/python3.11/site-packages/nvidia/cu13/include while a
#   local `pip install -e .` builds) (13.10, what the shipped wheel builds against:
#   with the H200's own 13.1 headers gemm.cu's grouped plan code is compiled out, and
#   test_grouped_blockscaled_forced_refusal skips).
# Files that come back: $OUT/{b,a,m,f}/session.tgz (and b2 if the first build failed).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
# the build, against the carried 13.10 headers; if that build fails, again with the venv's
if ! QUICK=1 OUT=$OUT/b bash scripts/gpu_session.sh build > /dev/null 2>&1; then
  echo "build with .cublas failed (logs in $OUT/b); building with the venv's cuBLASLt headers"
  mv .cublas .cublas.off 2>/dev/null
  QUICK=1 OUT=$OUT/b2 bash scripts/gpu_session.sh build 2>&1 | tail -5
fi
python3 -c "import qq; print('build_info cublaslt', qq.build_info()['cublaslt'], qq.cuda_info()['cublaslt_version'])"
TESTS="tests/test_grouped.py tests/test_route.py tests/test_graphs.py" WORKERS=16 OUT=$OUT/a \
  bash scripts/gpu_session.sh test 2>&1 | tail -15
echo "build + subset $(( $(date +%s) - T0 )) s"
TESTS="tests/test_grouped.py -k blockscaled" OUT=$OUT/m bash scripts/gpu_session.sh memcheck 2>&1 | tail -6
echo "memcheck $(( $(date +%s) - T0 )) s"
WORKERS=16 OUT=$OUT/f timeout 330 bash scripts/gpu_session.sh test 2>&1 | tail -12
echo "all $(( $(date +%s) - T0 )) s"
