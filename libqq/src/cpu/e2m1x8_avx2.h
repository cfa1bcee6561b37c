// cpu/e2m1x8_avx2.h - eight E2M1 encodes at a time for the CPU's fp4 quantize (x86-64 with
// AVX2; cpu/quantize.cpp picks it at run time).
//
// codec.h's e2m1_encode on eight lanes: the same fp32 operations in the same order
// (e2m1_abs_sum: min(|x|, 6), max(., 1), the exponent k, a + M with M = 0x4a800000 +
// k * 0x800002; the code is the sum's low 3 bits, the sign x's bit 31), so the same codes.
// A NaN takes min's second operand, 6, as codec.h's select does. The scalar loop spent ~40
// instructions an element (most of a [1, 32] quantize's libqq time); this, ~2.
// tests/cpp/codec_proofs.cpp checks it against e2m1_encode on every input it checks that on.
// Not for nvcc (immintrin.h): host code only.
#ifndef QQ_CPU_E2M1X8_AVX2_H_
#define QQ_CPU_E2M1X8_AVX2_H_

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define QQ_E2M1X8_AVX2 1
#include <immintrin.h>
#include <stdint.h>

namespace qq {
namespace cpu {

// The codes of v[0..8) * f packed as an fp4 row stores them: v[i]'s in bits 4i..4i+3 (two a
// byte, low nibble first), equal to e2m1x8_encode of the eight products.
__attribute__((target("avx2"))) inline uint32_t e2m1x8_encode_avx2(const float* v, float f) {
  const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(v), _mm256_set1_ps(f));
  const __m256i xb = _mm256_castps_si256(x);
  const __m256 ax = _mm256_castsi256_ps(_mm256_and_si256(xb, _mm256_set1_epi32(0x7fffffff)));
  const __m256 a = _mm256_min_ps(ax, _mm256_set1_ps(6.0f));   // NaN -> 6 (the second operand)
  const __m256 a1 = _mm256_max_ps(a, _mm256_set1_ps(1.0f));
  const __m256i k = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(a1), 23), _mm256_set1_epi32(127));
  const __m256i m = _mm256_add_epi32(_mm256_set1_epi32(0x4a800000), _mm256_mullo_epi32(k, _mm256_set1_epi32(0x800002)));
  const __m256i s = _mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(m)));
  const __m256i code = _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(7)),
                                       _mm256_and_si256(_mm256_srli_epi32(xb, 28), _mm256_set1_epi32(8)));
  // lane i's code to bits 4i..4i+3, then the lanes or-ed (their bits do not overlap)
  const __m256i t = _mm256_sllv_epi32(code, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
  __m128i w = _mm_or_si128(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  w = _mm_or_si128(w, _mm_shuffle_epi32(w, 0x4e));
  w = _mm_or_si128(w, _mm_shuffle_epi32(w, 0xb1));
  return (uint32_t)_mm_cvtsi128_si32(w);
}

}  // namespace cpu
}  // namespace qq

#endif
#endif  // QQ_CPU_E2M1X8_AVX2_H_
