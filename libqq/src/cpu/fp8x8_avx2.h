// cpu/fp8x8_avx2.h - eight E4M3 / E5M2 encodes at a time for the CPU's fp8 quantize (x86-64
// with AVX2; cpu/quantize.cpp picks it at run time).
//
// codec.h's encode_minifloat on eight lanes, the same steps: NaN -> the NaN code (no sign),
// |x| >= max_val -> the largest code (satfinite, +-Inf too), else e = max(floor(log2 |x|),
// emin), r = rint(|x| * 2^(mbits - e)) (exact scaling, then ties-to-even), the code r in the
// minimum binade and ((e + bias) << mbits) + r - 2^mbits above it, at most max_code; the sign
// in bit 7. The scalar encoder spent ~70 instructions an element (most of a [1, 32] mxfp8
// quantize's libqq time). tests/cpp/codec_proofs.cpp checks it against e4m3_encode and
// e5m2_encode on every input it checks e2m1 on. Not for nvcc (immintrin.h): host code only.
#ifndef QQ_CPU_FP8X8_AVX2_H_
#define QQ_CPU_FP8X8_AVX2_H_

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define QQ_FP8X8_AVX2 1
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

namespace qq {
namespace cpu {

// The codes of v[0..8) * f in out[0..8): E4M3 (e5m2 false) or E5M2, as e4m3_encode /
// e5m2_encode of each product.
__attribute__((target("avx2"))) inline void fp8x8_encode_avx2(const float* v, float f, bool e5m2, uint8_t* out) {
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, emin = 1 - bias;
  const int max_code = e5m2 ? 0x7b : 0x7e;
  const float max_val = e5m2 ? 57344.0f : 448.0f;
  const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(v), _mm256_set1_ps(f));
  const __m256i xb = _mm256_castps_si256(x);
  const __m256i ab = _mm256_and_si256(xb, _mm256_set1_epi32(0x7fffffff));
  const __m256 a = _mm256_castsi256_ps(ab);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  const __m256i sat = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(max_val), _CMP_GE_OQ));
  // e = max(exponent field - 127, emin); 2^(mbits - e) built as fp32 bits (mbits - e lies in
  // [mbits - 15, mbits - emin]: a normal number)
  const __m256i e = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(ab, 23), _mm256_set1_epi32(127)),
                                     _mm256_set1_epi32(emin));
  const __m256 scale = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(mbits + 127), e), 23));
  const __m256 rf = _mm256_round_ps(_mm256_mul_ps(a, scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i r = _mm256_cvtps_epi32(rf);  // (an integer already: exact)
  const __m256i normal = _mm256_sub_epi32(
      _mm256_add_epi32(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(bias)), mbits), r),
      _mm256_set1_epi32(1 << mbits));
  const __m256i in_min = _mm256_cmpeq_epi32(e, _mm256_set1_epi32(emin));
  __m256i code = _mm256_blendv_epi8(normal, r, in_min);
  code = _mm256_min_epi32(code, _mm256_set1_epi32(max_code));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(max_code), sat);
  code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(xb, 24), _mm256_set1_epi32(0x80)));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), nan);
  // eight int32 codes (0..255) to eight bytes
  const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
  const __m128i w8 = _mm_packus_epi16(w16, w16);
  const uint64_t b = (uint64_t)_mm_cvtsi128_si64(w8);
  memcpy(out, &b, 8);
}

}  // namespace cpu
}  // namespace qq

#endif
#endif  // QQ_CPU_FP8X8_AVX2_H_
