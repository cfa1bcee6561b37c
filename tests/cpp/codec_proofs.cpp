// codec_proofs.cpp - proofs that codec.h's fast scalar paths give the bits of
// the forms they replaced:
//   1. e2m1_encode (branch-free, one fp32 magic-number add) against the
//      threshold-compare encoder it replaced (the oracle below, verbatim),
//      NaN, Inf, subnormals and both zeros included; also that byte 0 of
//      e2m1_abs_sum is the code of |x| with bits 3..7 zero (what
//      e2m1x8_encode's byte gathers rely on);
//   2. e2m1x8_encode (byte-permute packing) against eight e2m1_encode, for
//      random 8-tuples mixing all bit patterns, values within a few ulp of the
//      rounding thresholds, zeros, Inf and NaN (the host emulates prmt.b32);
//   3. affine_needs_div and affine_round_clamp (magic-number GPU forms)
//      against the trunc/roundf/cast code they replaced (the oracles below),
//      the latter for every bit width 2, 3, 4, 5, 6, 8;
//      The host's emulation of the GPU's round-down add (add_rd) is itself
//      checked against the FPU in FE_DOWNWARD mode for the operands it gets
//      there (c in [0, 256], then + 2^23);
//   4. e2m1_decode (built from bits) against its former formula, all 256 bytes;
//   5. div_const (multiply by the reciprocal + one FMA correction, the GPU
//      form) against the correctly rounded division x / c, for c = 6, 448 and
//      57344 (its guard sends tiny and non-finite x to the division; the check
//      covers the guard too);
//   6. e4m3_decode_bits (bit placement, the weight-only kernels' scale
//      decode) against e4m3_decode, all 256 bytes;
//   7. affine_band_clamped (the GPU's quotient test on the clamped quotient,
//      cuda/quant.cuh's affine_encode8): for every x it passes, the code the
//      fast path takes (affine_round_clamped of the clamped x) is the code of
//      x and of every quotient within 4 ulp of x, for every bit width - the
//      reciprocal quotient's distance from the divided one; and the code the
//      GPU's fast path reads from the band test's own sum (affine_rn_code) is
//      that code too.
//  10. e2m1x8_encode_mx (E2M1 of bf16 x times an MX factor 2^k in bf16x2 arithmetic, the
//      GPU's fp4 form for MX scales) against e2m1_encode of the fp32 products, for every
//      bf16 bit pattern (NaN, Inf, subnormals, both zeros) and every UE8M0 scale byte, in
//      both builds (the host emulates fma.rn / min / max.bf16x2: fp32, then one RNE to bf16;
//      exact here: x * 2^k and a + C fit fp32 exactly except products under 2^-142, which
//      any rounding leaves under 0.25 and so at code 0 with x's sign).
//  11. affine_quotient_fma (the GPU affine encoders' exact quotient without a division)
//      against the division: significand pairs (random, and a built within 2 ulp of a
//      rounding midpoint times b, the hard cases), and the affine code of the result against
//      the code of d / scale over the range codec.h's affine_fma_ok admits (scales 2^-64 ..
//      2^64 of either sign, quotients from subnormal to past the clamp). A sample: the proof
//      over all 2^46 significand pairs runs on a GPU (tests/cpp/quotient_proof.cu).
// `codec_proofs --exhaustive` checks 1, 3, 5 and 7 for all 2^32 fp32 bit
// patterns (add_rd for every operand in [0, 256]) and 20M tuples for 2: the
// proof, about 1 minute of CPU time, and 6 for the GPU forms (software fmaf). Without
// the flag it checks a sample in about a second: every pattern within a
// window of ulps around each edge the forms are built on (the E2M1
// thresholds, k + 0.5 and k + 0.5 +- 1e-3 for the affine rounding, the
// integers a code can be, 2^20, div_const's guard at 2^-100, zero, the
// subnormal and normal boundaries, FLT_MAX, Inf and NaN, both signs), a
// stride walk over all 2^32 patterns, random patterns, and 200k tuples.
// codec.h's GPU-only forms are compiled on the host with -DQQ_CODEC_GPU_FORMS
// (same IEEE fp32 multiply and fused multiply-add); both builds must pass.
// tests/test_codec_proofs.py builds and runs both, sampled in the normal
// suite and exhaustive with QQ_TEST_EXHAUSTIVE=1. By hand:
//   for d in "" -DQQ_CODEC_GPU_FORMS; do
//     c++ -O2 -std=c++17 -ffp-contract=off $d -Ilibqq/src tests/cpp/codec_proofs.cpp -o /tmp/codec_proofs &&
//       /tmp/codec_proofs --exhaustive || break
//   done
// Never with -ffast-math (the codecs need IEEE round-to-nearest-even and no
// flush-to-zero); -ffp-contract=off as the library itself is built.
#include <cstdio>
#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "codec.h"
#include "cpu/e2m1x8_avx2.h"
#include "cpu/fp8x8_avx2.h"

namespace {
// The oracle: codec.h's e2m1_encode before the change, verbatim.
inline uint8_t e2m1_encode_ref(float x) {
  float a = qq::abs_f(x);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return (uint8_t)(c | ((qq::f2u(x) >> 28) & 0x8u));
}
// The oracles of affine_encode's two steps: the code before the change.
inline bool affine_needs_div_ref(float t) {
  const float at = qq::abs_f(t);
  const float frac = at - qq::trunc_f(at);
  return qq::abs_f(frac - 0.5f) < 1e-3f || !(at < 1048576.0f);
}
inline uint32_t affine_round_clamp_ref(float t, float n) {
  float q = qq::round_half_away(t);
  q = q < 0.0f ? 0.0f : (q > n ? n : q);
  return (uint32_t)q;
}
#if defined(QQ_CODEC_GPU_FORMS)
// A real round-down add: the FPU in FE_DOWNWARD mode (noinline + volatile so
// that the compiler cannot move the add across fesetround).
__attribute__((noinline)) float add_fpu(float a, float b) {
  volatile float x = a, y = b;
  return x + y;
}
#endif
// The oracle of e2m1_decode: the formula before the change.
inline float e2m1_decode_ref(uint8_t c) {
  const uint32_t m = c & 7u;
  float v = (m < 4) ? 0.5f * (float)m : (float)(1u << ((m >> 1) - 1)) * ((m & 1) ? 1.5f : 1.0f);
  return (c & 8u) ? -v : v;
}
bool same(float a, float b) {  // equal bits, or both NaN
  return qq::f2u(a) == qq::f2u(b) || (a != a && b != b);
}

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint64_t rnd() {  // splitmix64
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Calls f(u) for every u in [center - w, center + w] (clipped to [lo, hi]).
template <typename F>
void window(uint32_t center, uint32_t w, uint32_t lo, uint32_t hi, F&& f) {
  const uint64_t a = center >= lo + (uint64_t)w ? center - w : lo;
  const uint64_t b = (uint64_t)center + w <= hi ? center + w : hi;
  for (uint64_t u = a; u <= b; ++u) f((uint32_t)u);
}

// The fp32 bit patterns checked by 1, 3 and 5: all of them (exhaustive), or
// the sample described at the top (patterns may repeat; that costs time only).
template <typename F>
uint64_t for_inputs(bool exhaustive, F&& f) {
  uint64_t n = 0;
  auto g = [&](uint32_t u) { f(u); ++n; };
  if (exhaustive) {
    uint32_t u = 0;
    do g(u); while (++u != 0);
    return n;
  }
  for (const uint32_t sign : {0u, 0x80000000u}) {
    // bit patterns (not values): zero / subnormals, smallest normal, Inf,
    // NaN, the largest NaN; div_const's guard 2^-100 and FLT_MAX
    for (const uint32_t b : {0x00000000u, 0x00800000u, 0x7f800000u, 0x7fc00000u, 0x7fffffffu})
      window(sign | b, 1u << 14, sign, sign | 0x7fffffffu, g);
    for (const float v : {0x1p-100f, 3.40282347e38f, 1048576.0f, 0.25f, 0.75f, 1.0f, 1.25f, 1.75f, 2.0f, 2.5f, 3.5f,
                          4.0f, 5.0f, 6.0f, 448.0f, 57344.0f})
      window(sign | qq::f2u(v), 1u << 14, sign, sign | 0x7fffffffu, g);
    for (int k = 0; k <= 256; ++k)  // affine: the rounding ties, the 1e-3 bands, the codes themselves
      for (const float v : {(float)k, k + 0.5f, k + 0.5f - 1e-3f, k + 0.5f + 1e-3f})
        window(sign | qq::f2u(v), 512, sign, sign | 0x7fffffffu, g);
  }
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) g((uint32_t)u);  // 4099: prime, so every bit position varies
  for (int i = 0; i < (1 << 18); ++i) g((uint32_t)rnd());
  return n;
}
}  // namespace

int main(int argc, char** argv) {
  const bool exhaustive = argc > 1 && strcmp(argv[1], "--exhaustive") == 0;
  if (argc > 1 && !exhaustive) {
    fprintf(stderr, "usage: %s [--exhaustive]\n", argv[0]);
    return 2;
  }
#if defined(QQ_CODEC_GPU_FORMS)
  printf("GPU forms (QQ_CODEC_GPU_FORMS), %s\n", exhaustive ? "exhaustive" : "sampled");
#else
  printf("host forms, %s\n", exhaustive ? "exhaustive" : "sampled");
#endif
  uint64_t bad = 0, bad_div = 0, bad_aff = 0, bad_band = 0, n_band = 0, bad_x8 = 0, n_x8 = 0;
  uint64_t bad_fp8 = 0, n_fp8 = 0;
  volatile float c6 = 6.0f, c448 = 448.0f, c57344 = 57344.0f;  // volatile: real divisions
#if defined(QQ_E2M1X8_AVX2)
  // 8. cpu/e2m1x8_avx2.h (the CPU's fp4 quantize, eight at a time) against e2m1_encode of
  // the same products, every input in groups of eight, times factors 1 and two others
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2");
  float x8[8];
  int n8 = 0;
#endif
  const uint64_t n = for_inputs(exhaustive, [&](uint32_t u) {
    const float x = qq::u2f(u);
#if defined(QQ_E2M1X8_AVX2)
    x8[n8++] = x;
    if (n8 == 8 && avx2) {
      for (const float f : {1.0f, 0.3f, 3.7e-5f}) {
        uint32_t want8 = 0;
        for (int i = 0; i < 8; ++i) want8 |= (uint32_t)qq::e2m1_encode(x8[i] * f) << (4 * i);
        const uint32_t got8 = qq::cpu::e2m1x8_encode_avx2(x8, f);
        if (got8 != want8 && bad_x8++ < 10)
          printf("e2m1x8_encode_avx2 MISMATCH at 0x%08x (f %g): 0x%08x, want 0x%08x\n", u, f, got8, want8);
        ++n_x8;
        // 9. cpu/fp8x8_avx2.h (the CPU's fp8 quantize) against e4m3_encode / e5m2_encode
        for (const bool e5 : {false, true}) {
          uint8_t got[8];
          qq::cpu::fp8x8_encode_avx2(x8, f, e5, got);
          for (int i = 0; i < 8; ++i) {
            const uint8_t want1 = e5 ? qq::e5m2_encode(x8[i] * f) : qq::e4m3_encode(x8[i] * f);
            if (got[i] != want1 && bad_fp8++ < 10)
              printf("fp8x8_encode_avx2 MISMATCH (%s) at 0x%08x (f %g): 0x%02x, want 0x%02x\n",
                     e5 ? "e5m2" : "e4m3", qq::f2u(x8[i]), f, got[i], want1);
          }
          ++n_fp8;
        }
      }
    }
    if (n8 == 8) n8 = 0;
#endif
    const uint8_t want = e2m1_encode_ref(x), got = qq::e2m1_encode(x);
    const uint32_t byte0 = qq::e2m1_abs_sum(x) & 0xffu;
    if ((want != got || byte0 != (want & 7u)) && bad++ < 10)
      printf("e2m1 MISMATCH 0x%08x (%g): ref %u new %u byte0 %u\n", u, x, want, got, byte0);
    const float q6 = qq::div_const(x, 6.0f, 1.0f / 6.0f), q448 = qq::div_const(x, 448.0f, 1.0f / 448.0f),
                q57344 = qq::div_const(x, 57344.0f, 1.0f / 57344.0f);
    if ((!same(q6, x / c6) || !same(q448, x / c448) || !same(q57344, x / c57344)) && bad_div++ < 10)
      printf("div_const MISMATCH 0x%08x (%g)\n", u, x);
    bool aff_ok = affine_needs_div_ref(x) == qq::affine_needs_div(x);
    if (x == x) {  // a NaN quotient never reaches the rounding (finite groups only)
      for (int bits : {2, 3, 4, 5, 6, 8}) {
        const float nmax = (float)((1 << bits) - 1);
        aff_ok = aff_ok && affine_round_clamp_ref(x, nmax) == qq::affine_round_clamp(x, nmax);
      }
    }
    if (!aff_ok && bad_aff++ < 10) printf("affine MISMATCH 0x%08x (%g)\n", u, x);
    // 7. affine_encode8's test on the clamped quotient: where it passes, x and every
    // quotient within 4 ulp of it give the code the fast path takes (rounding and clamping
    // are monotone, so the two ends of the window suffice; past |x| = 1024 the window's
    // quotients all clamp alike).
    if (x == x) {
      float lo = x, hi = x;
      for (int k = 0; k < 4; ++k) lo = nextafterf(lo, -INFINITY), hi = nextafterf(hi, INFINITY);
      for (int bits : {2, 3, 4, 5, 6, 8}) {
        const float nmax = (float)((1 << bits) - 1);
        const float c = qq::affine_clamp(x, nmax);
        if (qq::affine_band_clamped(c)) continue;
        const uint32_t q = qq::affine_round_clamped(c);
        bool ok = q == affine_round_clamp_ref(x, nmax) && qq::affine_rn_code(c) == q;
        if (qq::abs_f(x) < 1024.0f)
          ok = ok && q == affine_round_clamp_ref(lo, nmax) && q == affine_round_clamp_ref(hi, nmax);
        if (!ok && bad_band++ < 10) printf("affine band MISMATCH 0x%08x (%g) bits %d\n", u, x, bits);
      }
      ++n_band;
    }
  });
  printf("e2m1_encode: %llu inputs, %llu mismatches\n", (unsigned long long)n, (unsigned long long)bad);
  printf("e2m1x8_encode_avx2: %llu groups of eight (x 1, 0.3, 3.7e-5), %llu mismatches\n",
         (unsigned long long)n_x8, (unsigned long long)bad_x8);
  printf("fp8x8_encode_avx2 (e4m3, e5m2): %llu groups of eight, %llu mismatches\n", (unsigned long long)n_fp8,
         (unsigned long long)bad_fp8);
  printf("affine_needs_div, affine_round_clamp (bits 2..8): %llu inputs, %llu mismatches\n",
         (unsigned long long)n, (unsigned long long)bad_aff);
  printf("div_const (6, 448, 57344): %llu inputs each, %llu mismatches\n", (unsigned long long)n,
         (unsigned long long)bad_div);
  printf("affine_band_clamped + affine_round_clamped, x +- 4 ulp (bits 2..8): %llu inputs, %llu mismatches\n",
         (unsigned long long)n_band, (unsigned long long)bad_band);

  uint64_t bad_dec = 0;
  for (int c = 0; c < 256; ++c)
    if (qq::f2u(qq::e2m1_decode((uint8_t)c)) != qq::f2u(e2m1_decode_ref((uint8_t)c)) && bad_dec++ < 10)
      printf("e2m1_decode MISMATCH %d\n", c);
  printf("e2m1_decode: 256 bytes, %llu mismatches\n", (unsigned long long)bad_dec);
  if (bad_dec) return 1;

  // 6. e4m3_decode_bits (the weight-only kernels' bit-placement scale decode)
  // against e4m3_decode, every byte (NaN bytes give the same canonical NaN).
  uint64_t bad_e4 = 0;
  for (int c = 0; c < 256; ++c)
    if (qq::f2u(qq::e4m3_decode_bits((uint32_t)c)) != qq::f2u(qq::e4m3_decode((uint8_t)c)) && bad_e4++ < 10)
      printf("e4m3_decode_bits MISMATCH %d\n", c);
  printf("e4m3_decode_bits: 256 bytes, %llu mismatches\n", (unsigned long long)bad_e4);
  if (bad_e4) return 1;

#if defined(QQ_CODEC_GPU_FORMS)
  uint64_t bad_rd = 0, n_rd = 0;
  auto check_rd = [&](uint32_t v) {
    const float c = qq::u2f(v);
    fesetround(FE_DOWNWARD);
    const float s1 = add_fpu(c, 0.5f), s2 = add_fpu(s1, 8388608.0f);
    fesetround(FE_TONEAREST);
    const float e1 = qq::add_rd(c, 0.5f), e2 = qq::add_rd(e1, 8388608.0f);
    if ((qq::f2u(s1) != qq::f2u(e1) || qq::f2u(s2) != qq::f2u(e2)) && bad_rd++ < 10) printf("add_rd MISMATCH 0x%08x\n", v);
    ++n_rd;
  };
  constexpr uint32_t kRdMax = 0x43800000u;  // c in [0, 256]
  if (exhaustive) {
    for (uint32_t v = 0; v <= kRdMax; ++v) check_rd(v);
  } else {  // zero and the subnormals' start, every integer and half-integer, a stride walk
    window(0, 1u << 14, 0, kRdMax, check_rd);
    for (int k = 0; k <= 256; ++k)
      for (const float v : {(float)k, k + 0.5f}) window(qq::f2u(v), 512, 0, kRdMax, check_rd);
    for (uint32_t v = 0; v <= kRdMax; v += 4099) check_rd(v);
  }
  printf("add_rd emulation vs FE_DOWNWARD: %llu inputs, %llu mismatches\n", (unsigned long long)n_rd,
         (unsigned long long)bad_rd);
  if (bad_rd) return 1;
#endif

  // 10. e2m1x8_encode_mx: every bf16 pattern, eight consecutive patterns a call, for every
  // UE8M0 scale byte b (the factor 2^(127 - b) that quantize takes for it)
  uint64_t bad_mx = 0, n_mx = 0;
  for (int b = 0; b < 255; ++b) {
    const float f = qq::ue8m0_inverse((uint8_t)b);
    for (uint32_t h0 = 0; h0 < 65536; h0 += 8) {
      uint32_t x[4], want = 0;
      for (int i = 0; i < 4; ++i) x[i] = (h0 + 2 * i) | ((h0 + 2 * i + 1) << 16);
      for (int i = 0; i < 8; ++i) want |= (uint32_t)qq::e2m1_encode(qq::bf16_to_f((uint16_t)(h0 + i)) * f) << (4 * i);
      const uint32_t got = qq::e2m1x8_encode_mx(x, f);
      if (got != want && bad_mx++ < 10)
        printf("e2m1x8_encode_mx MISMATCH at bf16 0x%04x.. (scale byte %d): 0x%08x, want 0x%08x\n", h0, b, got, want);
      ++n_mx;
    }
  }
  printf("e2m1x8_encode_mx: %llu groups of eight bf16 (every pattern x every UE8M0 factor), %llu mismatches\n",
         (unsigned long long)n_mx, (unsigned long long)bad_mx);
  if (bad_mx) return 1;

  // e2m1x8_encode: random tuples
  uint64_t bad8 = 0;
  const float edges[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 8.0f};
  const uint32_t specials[] = {0x7f800000u, 0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0x00000001u, 0x007fffffu, 0x7f7fffffu};
  const uint64_t kTuples = exhaustive ? 20000000 : 200000;
  for (uint64_t t = 0; t < kTuples; ++t) {
    float v[8];
    for (int i = 0; i < 8; ++i) {
      const uint64_t z = rnd();
      uint32_t b;
      switch (z & 3) {
        case 0: b = (uint32_t)(z >> 32); break;                                    // any pattern
        case 1: b = qq::f2u(edges[(z >> 8) & 15]) + (uint32_t)((z >> 16) & 7) - 3u; break;  // near a threshold
        case 2: b = specials[((z >> 8) & 0xff) % 7]; break;
        default: b = qq::f2u(qq::u2f(0x3f800000u | (uint32_t)(z >> 41)) * 3.0f - 3.0f); break;  // [0, 3)
      }
      if ((z >> 63) & 1) b ^= 0x80000000u;
      v[i] = qq::u2f(b);
    }
    uint32_t want = 0;
    for (int i = 0; i < 8; ++i) want |= (uint32_t)qq::e2m1_encode(v[i]) << (4 * i);
    const uint32_t got = qq::e2m1x8_encode(v);
    if (want != got && bad8++ < 10) printf("e2m1x8 MISMATCH tuple %llu: want 0x%08x got 0x%08x\n", (unsigned long long)t, want, got);
  }
  printf("e2m1x8_encode: %llu random 8-tuples, %llu mismatches\n", (unsigned long long)kTuples, (unsigned long long)bad8);

  // 11. affine_quotient_fma: the quotient, then the code
  uint64_t n_qf = 0, bad_qf = 0;
  const uint64_t kQf = exhaustive ? (1ull << 26) : (1ull << 20);
  auto check_q = [&](float a, float b) {
    const float got = qq::affine_quotient_fma(a, b, 1.0f / b), want = a / b;
    ++n_qf;
    if (qq::f2u(got) != qq::f2u(want) && bad_qf++ < 10) printf("affine_quotient_fma MISMATCH a 0x%08x b 0x%08x\n", qq::f2u(a), qq::f2u(b));
  };
  for (uint64_t i = 0; i < kQf; ++i) {
    const uint64_t z = rnd();
    const float b = qq::u2f(0x3f800000u | (uint32_t)(z & 0x7fffffu));
    check_q(qq::u2f(0x3f800000u | (uint32_t)((z >> 23) & 0x7fffffu)), b);
    // a midpoint m between two floats of (0.5, 2), and the a whose quotient lies nearest it
    const int e = (int)((z >> 46) & 1);  // m in [0.5, 1) or [1, 2)
    const float m_lo = qq::u2f((uint32_t)(0x3f000000u + (e << 23)) | (uint32_t)((z >> 47) & 0x7fffffu));
    const double mid = (double)m_lo + std::ldexp(1.0, -25 + e);
    const float a0 = (float)(mid * (double)b);
    for (int k = -2; k <= 2; ++k) {
      const float a = qq::u2f(qq::f2u(a0) + (uint32_t)k);
      if (a >= 1.0f && a < 2.0f) check_q(a, b);
    }
  }
  uint64_t n_qc = 0, bad_qc = 0;
  for (uint64_t i = 0; i < kQf; ++i) {
    const uint64_t z = rnd();
    const int bits = 2 + (int)(z % 7);  // 2..8
    const float n = (float)((1 << bits) - 1);
    // a scale of either sign and any exponent affine_fma_ok admits
    float scale = std::ldexp(qq::u2f(0x3f800000u | (uint32_t)((z >> 3) & 0x7fffffu)), (int)((z >> 26) % 129) - 64);
    if (scale > qq::kAffineFmaMax) scale = qq::kAffineFmaMax;
    if ((z >> 35) & 1) scale = -scale;
    // quotients near the codes' .5 boundaries, random ones up to past the clamp, tiny ones
    const uint64_t y = rnd();
    double t;
    switch (y & 3) {
      case 0: t = (double)(y >> 8 & 511) * 0.5 + std::ldexp((double)(int)((y >> 17) & 0xff) - 128.0, -30); break;
      case 1: t = std::ldexp((double)(y >> 11), -53) * 2.0 * n; break;
      case 2: t = std::ldexp((double)(y >> 11), -53 - (int)((y >> 2) & 127)); break;
      default: t = -std::ldexp((double)(y >> 11), -53 - (int)((y >> 2) & 7)); break;
    }
    const float d = (float)(t * (double)scale);
    if (!qq::affine_fma_ok(scale) || !std::isfinite(d)) continue;
    const uint32_t got = qq::affine_round_clamped(qq::affine_clamp(qq::affine_quotient_fma(d, scale, 1.0f / scale), n));
    const uint32_t want = qq::affine_round_clamp(d / scale, n);
    ++n_qc;
    if (got != want && bad_qc++ < 10)
      printf("affine_quotient_fma code MISMATCH d 0x%08x scale 0x%08x bits %d: %u, want %u\n", qq::f2u(d), qq::f2u(scale), bits, got, want);
  }
  printf("affine_quotient_fma: %llu significand pairs (random and next to midpoints), %llu affine codes, %llu mismatches\n",
         (unsigned long long)n_qf, (unsigned long long)n_qc, (unsigned long long)(bad_qf + bad_qc));
  return bad || bad_div || bad_aff || bad_band || bad8 || bad_x8 || bad_fp8 || bad_qf || bad_qc ? 1 : 0;
}
