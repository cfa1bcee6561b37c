#!/usr/bin/env bash
# Session bb's A/B of the affine encoders' exact quotient (codec.h affine_quotient_fma, used by
# cuda/quant.cuh affine_encode8 and the GPU form of affine_encode) against the band-tested
# reciprocal quotient it replaced (affine_band_revert.patch.txt), in one device call:
#   1. tests/cpp/quotient_proof.cu --exhaustive (all 2^46 significand pairs), on the GPU while
#      the base builds;
#   2. bench/tune/patch_ab.sh SUITE=quantize: base = the new encoders (their tests: every
#      affine GPU test of test_quantize / test_colwise / test_qdq and the codec proofs), then
#      the revert (the near-tie tests), bench_quantize --quick (quantize, colwise) for each.
#   OUT=$OUT bash bench/results/logs-2026-12-02bb/affine_fma_ab.sh   (~6-7 minutes)
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
mkdir -p $OUT/ab
(nvcc -O3 -arch=sm_90a tests/cpp/quotient_proof.cu -o /tmp/quotient_proof &&
  /usr/bin/time -f "%e s" timeout 400 /tmp/quotient_proof --exhaustive) > $OUT/ab/proof.txt 2>&1 &
PROOF=$!
TESTS="tests/test_quantize.py tests/test_colwise.py tests/test_qdq.py tests/test_codec_proofs.py" \
  BASE_K="affine or quotient or codec" K="near_ties" SUITE=quantize MODES="affine" \
  PATCHES=bench/results/logs-2026-12-02bb/affine_band_revert.patch.txt OUT=$OUT/ab \
  timeout 520 bash bench/tune/patch_ab.sh
wait $PROOF
echo "proof:"; cat $OUT/ab/proof.txt
echo "all $(( $(date +%s) - T0 )) s"
tar czf $OUT/ab.tgz -C $OUT ab
