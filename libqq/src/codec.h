// codec.h - the scalar codecs of libqq, shared by the CPU and the CUDA backend.
//
// Everything that touches the bits of E2M1, E4M3, E5M2, UE8M0, the rounding
// rules and the blocked scale layout lives here and nowhere else (STYLE.md 3).
// All functions are QQ_HD (host + device) and use only fp32 arithmetic and
// integer bit manipulation, so that the CPU and the GPU produce identical bits.
// The CPU backend is the reference; the GPU must equal it.
//
// Numerics contract: docs/formats.md (every rule below is stated there).
#ifndef QQ_CODEC_H_
#define QQ_CODEC_H_

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define QQ_HD __host__ __device__ __forceinline__
#else
#define QQ_HD inline
#endif

namespace qq {

// ---- bit casts ---------------------------------------------------------------
QQ_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
QQ_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}
QQ_HD bool is_finite_f(float f) { return (f2u(f) & 0x7f800000u) != 0x7f800000u; }
QQ_HD float abs_f(float f) { return u2f(f2u(f) & 0x7fffffffu); }
// max that propagates NaN (fmaxf would drop it; docs/formats.md: NaN stays visible).
QQ_HD float nanmax_f(float a, float b) {
  return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
}
// 2^e for e in [-149, 127] exactly (subnormal results included).
QQ_HD float exp2i(int e) {
  if (e >= -126) return u2f((uint32_t)(e + 127) << 23);
  return u2f(1u << (e + 149));
}

// ---- small-float encoders (fp32 -> code, round to nearest even, satfinite) ----
// Generic: `mbits` mantissa bits, exponent bias `bias`, largest finite code
// `max_code` (sign excluded) whose value is `max_val`. NaN -> nan_code.
// Method: for |x| < max_val, let e = floor(log2|x|) clamped below to the
// format's minimum normal exponent; the quantum is 2^(e - mbits) and
// r = rint(|x| / quantum) is exact to compute in fp32 because the division is
// by a power of two and |x| / quantum < 2^(mbits + 1) + 1. With that r,
// code = r for subnormals (r == 2^mbits lands on the minimum normal) and
// ((e + bias) << mbits) + r - 2^mbits for normals (a carry to the next binade
// falls out of the addition).
QQ_HD float rint_f(float v) {
  // Round to nearest, ties to even (the default FP environment; libqq never
  // changes it and never builds with -ffast-math).
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return __builtin_rintf(v);
#endif
}

// sign_shift: 3 for 4-bit formats, 7 for 8-bit ones.
QQ_HD uint8_t encode_minifloat(float x, int mbits, int bias, int sign_shift,
                               uint32_t max_code, float max_val, uint8_t nan_code) {
  const uint8_t sign = (uint8_t)((f2u(x) >> 31) << sign_shift);
  const float a = abs_f(x);
  if (a != a) return nan_code;
  if (a >= max_val) return (uint8_t)(sign | max_code);  // satfinite (also +-Inf)
  int e = (int)((f2u(a) >> 23) & 0xff) - 127;            // floor(log2 a) for normal a
  const int emin = 1 - bias;
  if (e < emin) e = emin;  // target subnormals (and fp32 subnormals) use the min quantum
  const uint32_t r = (uint32_t)rint_f(a * exp2i(mbits - e));  // exact scaling, then RNE
  // In the minimum binade (e == emin) the code is r itself: r < 2^mbits is a
  // subnormal, r in [2^mbits, 2^(mbits+1)] is exponent field 1 (or 2 after a
  // carry) with mantissa r - 2^mbits. Above it the carry falls out of the sum.
  uint32_t code = (e == emin) ? r : (((uint32_t)(e + bias) << mbits) + r - (1u << mbits));
  if (code > max_code) code = max_code;
  return (uint8_t)(sign | code);
}

// E2M1 (fp4): codes 0..7 = {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign.
// Round to nearest, ties to even (0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2,
// 2.5->2, 3.5->4, 5->4), saturating (|x| > 5 and +-Inf -> 6; NaN -> code 7
// with x's sign: callers never encode NaN, the group rule zeroes such groups).
// Branch-free, with one rounding done by the fp32 adder: a = min(|x|, 6); a
// magic number M whose ulp is the E2M1 quantum of a's binade makes a + M round
// a exactly once, ties to even, and the low 3 bits of the sum are the code:
//   a < 2        M = 2^22      ulp 0.5  bits = bits(M) + rne(2a)         0..4
//   2 <= a < 4   M = 2^23 + 2  ulp 1    bits = bits(2^23) + 2 + rne(a)   4..6
//   4 <= a <= 6  M = 2^24 + 8  ulp 2    bits = bits(2^24) + 4 + rne(a/2) 6, 7
// (the offsets 2 and 8 are even multiples of the ulp, so they keep the tie
// parity). With k = max(exponent(a), 0) in {0, 1, 2}, bits(M) = 0x4a800000 +
// k * 0x800002. tests/cpp/codec_proofs.cpp proves this equal, for all 2^32 inputs
// (its --exhaustive run; the test suite runs a sample of it), to the threshold form
// this replaced:
//   a <= 0.25 -> 0, < 0.75 -> 1, <= 1.25 -> 2, < 1.75 -> 3, <= 2.5 -> 4,
//   < 3.5 -> 5, <= 5 -> 6, else 7.
// About 6 instructions on the GPU (FMNMX x2, SHF, IMAD, FADD, LOP3) instead of
// seven compares and a chain of selects or branches.
// The fp32 sum a + M: its byte 0 is the code of |x| (bits 3..7 are zero; the
// checker proves that too), the rest is M's exponent.
QQ_HD uint32_t e2m1_abs_sum(float x) {
#if defined(__CUDA_ARCH__)
  // fabsf: an operand modifier (|x|) of the min below, where abs_f's mask was one more
  // instruction an element (colq_kernel's nvfp4 SASS). A NaN's payload may differ; it
  // becomes 6 either way.
  const float ax = fabsf(x);
#else
  const float ax = abs_f(x);
#endif
  // NaN compares false -> 6. nvcc compiles both selects to min.f32/max.f32
  // (whose NaN rule, "the other operand", gives the same 6).
  const float a = ax < 6.0f ? ax : 6.0f;
  const float a1 = a > 1.0f ? a : 1.0f;
  const uint32_t k = (f2u(a1) >> 23) - 127u;
  return f2u(a + u2f(0x4a800000u + k * 0x800002u));
}
QQ_HD uint8_t e2m1_encode(float x) {
  return (uint8_t)((e2m1_abs_sum(x) & 7u) | ((f2u(x) >> 28) & 0x8u));
}
QQ_HD float e2m1_decode(uint8_t c) {
  // Built as fp32 bits, no int -> float conversion (a quarter-rate GPU op):
  // codes 2..7 are (m << 22) + 0x3f000000 (exponent field m / 2 + 126, one
  // mantissa bit m % 2), code 1 is 0.5, code 0 is 0; bit 3 is the sign.
  // tests/cpp/codec_proofs.cpp checks all 256 bytes against the former formula.
  const uint32_t m = c & 7u;
  const uint32_t mag = m >= 2 ? (m << 22) + 0x3f000000u : (m ? 0x3f000000u : 0u);
  return u2f(mag | ((uint32_t)(c & 8u) << 28));
}

QQ_HD uint8_t e4m3_encode(float x) { return encode_minifloat(x, 3, 7, 7, 0x7e, 448.0f, 0x7f); }
QQ_HD uint8_t e5m2_encode(float x) { return encode_minifloat(x, 2, 15, 7, 0x7b, 57344.0f, 0x7f); }

// Pairs (lo in the low byte / nibble). On GPUs that have the conversion in
// hardware (fp8: sm_89+; fp4: the sm_100a/sm_120a families) these use it: the
// same RNE + satfinite rule, so the codes equal the software path's (the GPU
// tests compare with the CPU backend bit for bit). Hopper's fp4 and the CPU
// use the software encoders above.
#if defined(__CUDA_ARCH__) &&                                                        \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL) ||   \
     defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL))
#define QQ_HW_E2M1 1
#endif
// (as a constant for quant.cuh's kMxfp4Bf16x2: e2m1x8_encode_mx's bf16x2 form only without
// it, where the hardware conversion of the fp32 path is shorter)
#if defined(QQ_HW_E2M1)
constexpr bool kHwE2M1 = true;
#else
constexpr bool kHwE2M1 = false;
#endif
QQ_HD uint8_t e2m1x2_encode(float lo, float hi) {
#if defined(QQ_HW_E2M1)
  uint32_t r;
  asm("{\n\t.reg .b8 t;\n\tcvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n\tcvt.u32.u8 %0, t;\n\t}"
      : "=r"(r) : "f"(hi), "f"(lo));
  return (uint8_t)r;
#else
  return (uint8_t)(e2m1_encode(lo) | (e2m1_encode(hi) << 4));
#endif
}
// prmt.b32 (byte permute): result byte i = byte (sel >> 4i) & 7 of the pair
// b:a (a = bytes 0..3); if bit 3 of that selector nibble is set, the byte's
// sign bit replicated instead. One instruction on the GPU; emulated on the host
// (only the checker runs it there).
QQ_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t x = ((uint64_t)b << 32) | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t n = (sel >> (4 * i)) & 15u;
    uint32_t byte = (uint32_t)(x >> (8 * (n & 7))) & 0xffu;
    if (n & 8) byte = (byte & 0x80u) ? 0xffu : 0u;
    d |= byte << (8 * i);
  }
  return d;
#endif
}
// Eight E2M1 codes packed little-endian into a word (v[i] in bits 4i..4i+3),
// the layout of an fp4 row (docs/formats.md, Modes: packing); equal to eight e2m1_encode.
// Software path: byte permutes gather the codes of the even and the odd
// elements (byte 0 of e2m1_abs_sum) into E and O, and the sign bits (byte 3
// of each input, sign-replicated) into masks; w = E | O << 4 | signs. About
// two instructions per 8 values less than shifting and or-ing code by code.
QQ_HD uint32_t e2m1x8_encode(const float* v) {
#if defined(QQ_HW_E2M1)
  uint32_t w = 0;
  for (int i = 3; i >= 0; --i) w = (w << 8) | e2m1x2_encode(v[2 * i], v[2 * i + 1]);
  return w;
#else
  uint32_t r[8];
  for (int i = 0; i < 8; ++i) r[i] = e2m1_abs_sum(v[i]);
  // byte 0 of a, byte 0 of b -> bytes 0, 1; then two such pairs -> 4 bytes
  const uint32_t e = prmt(prmt(r[0], r[2], 0x40u), prmt(r[4], r[6], 0x40u), 0x5410u);
  const uint32_t o = prmt(prmt(r[1], r[3], 0x40u), prmt(r[5], r[7], 0x40u), 0x5410u);
  // 0xFB: bytes 0, 1 = sign of byte 3 of a, of b, replicated
  const uint32_t se = prmt(prmt(f2u(v[0]), f2u(v[2]), 0xfbu), prmt(f2u(v[4]), f2u(v[6]), 0xfbu), 0x5410u);
  const uint32_t so = prmt(prmt(f2u(v[1]), f2u(v[3]), 0xfbu), prmt(f2u(v[5]), f2u(v[7]), 0xfbu), 0x5410u);
  return (e + (o << 4)) | (se & 0x08080808u) | (so & 0x80808080u);
#endif
}
QQ_HD uint16_t e4m3x2_encode(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint16_t)(e4m3_encode(lo) | (e4m3_encode(hi) << 8));
#endif
}
QQ_HD uint16_t e5m2x2_encode(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint16_t)(e5m2_encode(lo) | (e5m2_encode(hi) << 8));
#endif
}

// One E4M3 code (the hardware conversion where there is one; same rule).
QQ_HD uint8_t e4m3_rn(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return (uint8_t)(e4m3x2_encode(x, 0.0f) & 0xff);
#else
  return e4m3_encode(x);
#endif
}

QQ_HD float minifloat_decode(uint8_t c, int ebits, int mbits, int bias) {
  const uint32_t sign = c >> (ebits + mbits);
  const uint32_t ef = (c >> mbits) & ((1u << ebits) - 1);
  const uint32_t mf = c & ((1u << mbits) - 1);
  float v;
  if (ef == 0) v = (float)mf * exp2i(1 - bias - mbits);
  else v = (float)((1u << mbits) | mf) * exp2i((int)ef - bias - mbits);
  return sign ? -v : v;
}
QQ_HD float e4m3_decode(uint8_t c) {
  if ((c & 0x7f) == 0x7f) return u2f(0x7fc00000u);  // E4M3FN has only NaN, no Inf
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // Hardware: E4M3 -> f16 -> f32, both exact (every E4M3 value is an f16).
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((uint16_t)c));
  return __half2float(__ushort_as_half((unsigned short)(h2 & 0xffff)));
#else
  return minifloat_decode(c, 4, 3, 7);
#endif
}
// e4m3_decode by bit placement, for the weight-only kernels' scale loads (a
// shift and one multiply, no conversion instruction): the 7 magnitude bits go
// to fp32 bits 20..26, so E4M3's exponent field sits in fp32's, read with bias
// 127 instead of 7: the value is 2^-120 of the right one and the multiply by
// 2^120 restores it exactly. A subnormal (field 0) becomes an fp32 subnormal,
// which the multiply also scales exactly. Equal to e4m3_decode for every
// byte (tests/cpp/codec_proofs.cpp checks all 256).
QQ_HD float e4m3_decode_bits(uint32_t b) {
  if ((b & 0x7fu) == 0x7fu) return u2f(0x7fc00000u);
  return u2f(((b & 0x7fu) << 20) | ((b & 0x80u) << 24)) * 0x1p120f;
}
QQ_HD float e5m2_decode(uint8_t c) {
  if ((c & 0x7c) == 0x7c) {  // exponent all ones: Inf or NaN (IEEE-like)
    if (c & 3) return u2f(0x7fc00000u);
    return (c & 0x80) ? -u2f(0x7f800000u) : u2f(0x7f800000u);
  }
  return minifloat_decode(c, 5, 2, 15);
}

// ---- exact division by a constant ------------------------------------------
// x / c, correctly rounded, for the element maxima c = 6, 448, 57344 with
// rc = 1/c rounded to fp32. On the GPU: q = x * rc, then one FMA correction
// step q + (x - q*c) * rc (Markstein) - three instructions instead of a
// division's reciprocal, refinement and slow-path check. tests/cpp/codec_proofs.cpp
// proves it equal to x / c for every finite |x| >= 2^-100 and these three c;
// for smaller x (quotients near the subnormal range, where the correction can
// be off by one ulp) and non-finite x the division itself runs.
QQ_HD float div_const(float x, float c, float rc) {
#if defined(__CUDA_ARCH__) || defined(QQ_CODEC_GPU_FORMS)  // (the checker builds this on the host)
  const float a = abs_f(x);
  if (!(a >= 0x1p-100f && a <= 3.40282347e38f)) return x / c;
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(x, rc);
  return __fmaf_rn(__fmaf_rn(-q, c, x), rc, q);
#else
  const float q = x * rc;
  return __builtin_fmaf(__builtin_fmaf(-q, c, x), rc, q);
#endif
#else
  (void)rc;
  return x / c;
#endif
}

// ---- UE8M0 scales (mxfp4, mxfp8) --------------------------------------------
// elem_max: 6 (E2M1), 448 (E4M3), 57344 (E5M2); emax_elem: 2, 8, 15.
// Returns the scale byte; 0xFF for a non-finite amax. amax >= 0.
// elem_rcp = 1 / elem_max rounded (for div_const).
QQ_HD uint8_t ue8m0_ceil(float amax, float elem_max, float elem_rcp) {
  if (!is_finite_f(amax)) return 0xff;
  if (amax == 0.0f) return 0;
  const float q = div_const(amax, elem_max, elem_rcp);  // correctly rounded fp32 quotient
  const uint32_t u = f2u(q);
  const uint32_t e = (u >> 23) & 0xff;
  const uint32_t m = u & 0x7fffff;
  if (e == 0) return (m > 0x400000u) ? 1 : 0;  // subnormal: > 2^-127 rounds up to 2^-126
  if (m != 0 && e < 254) return (uint8_t)(e + 1);
  return (uint8_t)e;
}
QQ_HD uint8_t ue8m0_floor(float amax, int emax_elem) {
  if (!is_finite_f(amax)) return 0xff;
  if (amax == 0.0f) return 0;
  const uint32_t u = f2u(amax);
  int fl;  // floor(log2 amax)
  const uint32_t e = (u >> 23) & 0xff;
  if (e != 0) {
    fl = (int)e - 127;
  } else {  // subnormal amax: position of the highest set mantissa bit
    uint32_t m = u & 0x7fffff;
    int msb = 0;
    while (m >>= 1) ++msb;
    fl = msb - 149;
  }
  int x = fl - emax_elem;
  if (x < -127) x = -127;
  if (x > 127) x = 127;
  return (uint8_t)(x + 127);
}
// Scale factor 2^(b-127) (b < 255) and its inverse 2^(127-b), both exact.
QQ_HD float ue8m0_decode(uint8_t b) {
  if (b == 0xff) return u2f(0x7fc00000u);
  return exp2i((int)b - 127);
}
QQ_HD float ue8m0_inverse(uint8_t b) { return exp2i(127 - (int)b); }

// ---- float <-> bf16 / fp16 ----------------------------------------------------
QQ_HD float bf16_to_f(uint16_t h) { return u2f((uint32_t)h << 16); }
QQ_HD uint16_t f_to_bf16(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (uint16_t)(u >> 16);
}
// ---- E2M1 of bf16 x with an MX factor, two elements an instruction -------------
// bf16x2 arithmetic on two bf16 halves of a word: a * b + c with one RNE rounding
// (fma.rn.bf16x2: a product is x * F + (-0), a sum a * 1 + C) and IEEE minNum / maxNum
// (min / max.bf16x2: a NaN operand gives the other). GPU: one instruction each, sm_80+.
// Host (tests/cpp/codec_proofs.cpp only): fp32 (a bf16 product is exact there), then one
// rounding to bf16 - exact for what e2m1x8_encode_mx gives them (the proof says why).
QQ_HD float bf16_half(uint32_t w, int h) { return bf16_to_f((uint16_t)(w >> (16 * h))); }
QQ_HD uint32_t bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h)
    r |= (uint32_t)f_to_bf16(bf16_half(a, h) * bf16_half(b, h) + bf16_half(c, h)) << (16 * h);
  return r;
#endif
}
template <bool kMax> QQ_HD uint32_t bf16x2_minmax(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if constexpr (kMax) asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  uint32_t r = 0;
  for (int h = 0; h < 2; ++h) {
    const float x = bf16_half(a, h), y = bf16_half(b, h);
    const float v = x != x ? y : y != y ? x : ((x < y) != kMax ? x : y);
    r |= (uint32_t)f_to_bf16(v) << (16 * h);
  }
  return r;
#endif
}
// Eight E2M1 codes of bf16 x times an MX factor f = 2^k (x[i] holds elements 2i (low half)
// and 2i + 1), packed as e2m1x8_encode packs them, equal
// to e2m1_encode(x * f) of each (codec_proofs, every bf16 x and every UE8M0 scale).
// Why it is the same: x * 2^k is exact in bf16 wherever it is at least 2^-126, as it is in
// fp32; below that both are under 0.25 (code 0, x's sign). Then e2m1_abs_sum's rounding in
// bf16: a = min(|y|, 6), and one add of C with the E2M1 grid's spacing in a's binade as its
// ulp - 2^6 (spacing 0.5), 2^7 + 2 (1), 2^8 + 4 (2) for max(a, 1) in [1, 2), [2, 4), [4, 8);
// the +2 / +4 put the binade's first code (4, 6) in the sum's low mantissa bits, so those
// 3 bits are the code. C's bits are E * 0x82 + 0x202 for E the exponent field of max(a, 1),
// both halves in one integer multiply-add. On the GPU about 6 instructions an element
// where the unpack, fp32 multiply and e2m1_abs_sum take about 9.
QQ_HD uint32_t e2m1x8_encode_mx(const uint32_t (&x)[4], float f) {
  const uint32_t F = (f2u(f) >> 16) * 0x10001u;  // f in bf16 (exact: a power of two), both halves
  uint32_t m[4];
  for (int i = 0; i < 4; ++i) {
    const uint32_t a = bf16x2_minmax<false>(bf16x2_fma(x[i], F, 0x80008000u) & 0x7fff7fffu, 0x40c040c0u);  // min(|y|, 6)
    const uint32_t e = (bf16x2_minmax<true>(a, 0x3f803f80u) >> 7) & 0x00ff00ffu;  // of max(a, 1)
    m[i] = bf16x2_fma(a, 0x3f803f80u, e * 0x82u + 0x02020202u);  // a * 1 + C
  }
  // codes of elements 0, 2, 4, 6 (byte 0 of each m) and 1, 3, 5, 7 (byte 2); x's sign bits
  // replicated over bytes (prmt's sign mode) for the same two sets
  const uint32_t c01 = prmt(m[0], m[1], 0x6240u), c23 = prmt(m[2], m[3], 0x6240u);
  const uint32_t ev = prmt(c01, c23, 0x5410u) & 0x07070707u, od = prmt(c01, c23, 0x7632u) & 0x07070707u;
  const uint32_t s01 = prmt(x[0], x[1], 0xfbd9u), s23 = prmt(x[2], x[3], 0xfbd9u);
  const uint32_t se = prmt(s01, s23, 0x5410u), so = prmt(s01, s23, 0x7632u);
  return (ev + (od << 4)) | (se & 0x08080808u) | (so & 0x80808080u);
}

QQ_HD float fp16_to_f(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return u2f(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = (float)m * exp2i(-24);
    return (h & 0x8000u) ? -v : v;
  }
  return u2f(sign | ((e + 112) << 23) | (m << 13));
}
QQ_HD uint16_t f_to_fp16(float f) {
  const uint32_t u = f2u(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const float a = abs_f(f);
  if (a != a) return (uint16_t)(sign | 0x7e00u);
  if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);  // rounds to Inf (IEEE)
  // Same scheme as encode_minifloat with 10 mantissa bits, bias 15.
  int e = (int)((f2u(a) >> 23) & 0xff) - 127;
  if (e < -14) e = -14;
  const uint32_t r = (uint32_t)rint_f(a * exp2i(10 - e));
  const uint32_t code = (e == -14) ? r : (((uint32_t)(e + 15) << 10) + r - 1024u);
  return (uint16_t)(sign | code);
}

// ---- blocked (cuBLASLt 1D block-scaling) layout ------------------------------
// Scale (r, c) of a matrix with C4 = roundup(cols, 4) columns lives at
// (r/128)*128*C4 + (c/4)*512 + (r%32)*16 + ((r%128)/32)*4 + (c%4):
// 128x4 tiles of 512 bytes, tiles row-major over (r/128, c/4); inside a tile
// the 32 rows of each 32-row quarter are interleaved 16 bytes apart.
QQ_HD int64_t blocked_offset(int64_t r, int64_t c, int64_t c4) {
  return (r >> 7) * 128 * c4 + (c >> 2) * 512 + (r & 31) * 16 + ((r & 127) >> 5) * 4 + (c & 3);
}
QQ_HD int64_t roundup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// ---- affine (MLX-compatible) -------------------------------------------------
QQ_HD float round_half_away(float v) {
  // roundf is half-away-from-zero on host and device.
#if defined(__CUDA_ARCH__)
  return roundf(v);
#else
  return __builtin_roundf(v);
#endif
}

// ---- group rules: one function per mode, used by both backends ---------------
// Element formats of the fp modes.
enum ElemKind { ELEM_E2M1 = 0, ELEM_E4M3 = 1, ELEM_E5M2 = 2 };

QQ_HD uint8_t elem_encode(int kind, float v) {
  return kind == ELEM_E2M1 ? e2m1_encode(v) : (kind == ELEM_E4M3 ? e4m3_encode(v) : e5m2_encode(v));
}
QQ_HD float elem_decode(int kind, uint8_t c) {
  return kind == ELEM_E2M1 ? e2m1_decode(c) : (kind == ELEM_E4M3 ? e4m3_decode(c) : e5m2_decode(c));
}
QQ_HD float elem_max(int kind) { return kind == ELEM_E2M1 ? 6.0f : (kind == ELEM_E4M3 ? 448.0f : 57344.0f); }
QQ_HD float elem_rcp(int kind) {  // 1 / elem_max(kind), rounded to fp32
  return kind == ELEM_E2M1 ? 1.0f / 6.0f : (kind == ELEM_E4M3 ? 1.0f / 448.0f : 1.0f / 57344.0f);
}
QQ_HD int elem_emax(int kind) { return kind == ELEM_E2M1 ? 2 : (kind == ELEM_E4M3 ? 8 : 15); }
// Element code of a NaN group: 0x7F for fp8, 0 for fp4 (docs/formats.md, Scales).
QQ_HD uint8_t elem_nan_code(int kind) { return kind == ELEM_E2M1 ? 0 : 0x7f; }

// NVFP4. enc = 2688 / global_scale (1 without one). Scale byte
// s = E4M3_rn_satfinite((amax / 6) * enc); a non-finite amax gives 0x7F (NaN);
// amax == 0 gives 0. Elements: E2M1(x * (enc / float(s))), in exactly this
// order (MLX's CUDA kernel does the same; keep it for bit-exactness).
//
// The global scale g is the tensor's amax. It is used only when it is a
// finite number >= 1e-30: below that, enc / (the smallest E4M3 scale, 2^-9)
// = 2688 * 512 / g overflows fp32 and a zero element would encode as
// 0 * inf = NaN. Any other value - 0 (the amax of an all-zero tensor),
// negative, NaN, +-Inf, tiny - means "no global scale" (factor 1) in every
// backend, in quantize, dequantize and the matmuls alike, so a round trip
// with the same g stays exact (docs/errors.md). The API refuses such values
// where it can read them without a synchronization (host tensors), 0 apart.
constexpr float kNvfp4MinGlobalScale = 1e-30f;
QQ_HD bool nvfp4_gs_valid(float g) { return g >= kNvfp4MinGlobalScale && g <= 3.40282347e38f; }
QQ_HD float nvfp4_gs(float g) { return nvfp4_gs_valid(g) ? g : 2688.0f; }
QQ_HD float nvfp4_enc(float global_scale) { return 2688.0f / nvfp4_gs(global_scale); }
QQ_HD uint8_t nvfp4_scale(float amax, float enc) {
  if (!is_finite_f(amax)) return 0x7f;
  if (amax == 0.0f) return 0;
  return e4m3_rn(div_const(amax, 6.0f, 1.0f / 6.0f) * enc);
}
// Factor applied to each element before E2M1 encoding; 0 when the group
// encodes as zeros (s == 0) or NaN (s is NaN: the codes are 0 by rule).
QQ_HD float nvfp4_elem_factor(uint8_t s, float enc) {
  if ((s & 0x7f) == 0 || (s & 0x7f) == 0x7f) return 0.0f;
  return enc / e4m3_decode(s);
}
// Dequantize factor of the global scale: global_scale / 2688.
QQ_HD float nvfp4_dec(float global_scale) { return nvfp4_gs(global_scale) / 2688.0f; }
// A product's alpha from its two operands' global scales (nullptr: none, 1):
// (gx / 2688) * (gw / 2688), the product of the two dequantize factors.
QQ_HD float nvfp4_alpha(const float* gx, const float* gw) {
  return (gx ? nvfp4_dec(*gx) : 1.0f) * (gw ? nvfp4_dec(*gw) : 1.0f);
}

// MX (mxfp4, mxfp8): UE8M0 byte by rounding rule; elements x * 2^(127-b).
QQ_HD uint8_t mx_scale(float amax, int kind, int floor_rounding) {
  return floor_rounding ? ue8m0_floor(amax, elem_emax(kind)) : ue8m0_ceil(amax, elem_max(kind), elem_rcp(kind));
}

// One fp group's scale, the one home of the per-group rule (quantize on both
// backends, colwise, qqmm's on-the-fly x): the scale byte, the factor that
// takes the group's values onto the element grid, and whether the group is a
// NaN group (its codes are 0: docs/formats.md, Scales).
struct FpGroupScale {
  uint8_t code;
  float factor;
  bool nan_group;
};
// nvfp4's rule with the factor of a scale byte from `factor` (nvfp4_elem_factor, or a
// table of it: colq_kernel's per block, where the division is most of a group's cost).
template <typename Factor> QQ_HD FpGroupScale nvfp4_group_scale(float amax, float enc, Factor factor) {
  FpGroupScale s;
  s.code = nvfp4_scale(amax, enc);  // amax >= 0 or NaN: s < 0x80
  s.factor = factor(s.code);
  s.nan_group = (s.code & 0x7f) == 0x7f;
  return s;
}
QQ_HD FpGroupScale fp_group_scale(float amax, bool nvfp4, float enc, int kind, int floor_rounding) {
  FpGroupScale s;
  if (nvfp4) {
    s = nvfp4_group_scale(amax, enc, [enc](uint8_t c) { return nvfp4_elem_factor(c, enc); });
  } else {
    s.code = mx_scale(amax, kind, floor_rounding);
    s.nan_group = s.code == 0xff;
    s.factor = s.nan_group ? 0.0f : ue8m0_inverse(s.code);
  }
  return s;
}

// Affine (bit-exact with MLX's CUDA kernels; docs/formats.md, Affine).
// wmin = min(w), wmax = max(0, max(w)), both over a finite group.
QQ_HD void affine_params(float wmin, float wmax, int bits, float* scale_out, float* bias_out) {
  const float n = (float)((1 << bits) - 1);
  // A group spanning more than FLT_MAX (wmax - wmin = inf) takes the range
  // as wmax/n - wmin/n: finite, so the group decodes to finite values
  // instead of 0 * inf = NaN. Every finite range keeps MLX's formula.
  const float range = wmax - wmin;
  float scale = is_finite_f(range) ? range / n : wmax / n - wmin / n;
  if (!(scale >= 1e-7f)) scale = 1e-7f;
  float edge;
  if (abs_f(wmin) > abs_f(wmax)) {
    edge = wmin;
  } else {
    edge = wmax;
    scale = -scale;
  }
  const float q0 = round_half_away(edge / scale);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  *scale_out = scale;
  *bias_out = bias;
}
// q = clamp(round_half_away((w - bias) / scale), 0, n), exactly. inv = 1/scale
// (computed once per group): the quotient is taken as (w - bias) * inv, within
// a few ulp of the correctly rounded division, and the true division is done
// only where that could change the rounding - near a .5 boundary (or for huge
// quotients, which a finite group never has). Same result, a fraction of the
// cost of a division per element.
QQ_HD float trunc_f(float v) {
#if defined(__CUDA_ARCH__)
  return truncf(v);
#else
  return __builtin_truncf(v);
#endif
}
// The two steps of affine_encode, each with a host form (trunc, roundf and a
// float -> int conversion) and a GPU form (magic-number adds: the host form's
// FRND and F2I run in the GPU's quarter-rate conversion pipe, three per
// element). tests/cpp/codec_proofs.cpp proves the forms equal for all 2^32 fp32
// inputs (and every bit width), so the CPU and the GPU agree.
// Is |t| within 1e-3 of a .5 boundary, or too large for the reciprocal path?
QQ_HD bool affine_needs_div(float t) {
  const float at = abs_f(t);
#if defined(__CUDA_ARCH__) || defined(QQ_CODEC_GPU_FORMS)
  // ri = |t| rounded to an integer (2^23 magic, exact for |t| < 2^22); the
  // distance to it is min(frac, 1 - frac), so |frac - 0.5| = 0.5 - distance.
  const float ri = (at + 8388608.0f) - 8388608.0f;
  return 0.5f - abs_f(at - ri) < 1e-3f || !(at < 1048576.0f);
#else
  const float frac = at - trunc_f(at);
  return abs_f(frac - 0.5f) < 1e-3f || !(at < 1048576.0f);
#endif
}
// Round-down addition (add.rm.f32 on the GPU; the host emulates it only for
// the checker, for operands >= 0).
QQ_HD float add_rd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rd(a, b);
#else
  const float s = a + b, bb = s - a;
  const float err = (a - (s - bb)) + (b - bb);  // exact a + b - s (TwoSum)
  return err < 0.0f ? u2f(f2u(s) - 1u) : s;       // s > 0 here
#endif
}
// clamp(t, 0, n), and round_half_away(c) of a clamped 0 <= c <= 255 in the GPU form:
// for such c, floor(RD(c + 0.5)) = floor(c + 0.5) = round_half_away(c) (RD never crosses
// an integer), and RD(x + 2^23) = 2^23 + floor(x).
QQ_HD float affine_clamp(float t, float n) {
#if defined(__CUDA_ARCH__)
  return fminf(fmaxf(t, 0.0f), n);  // two FMNMX; fmaxf takes a NaN to 0 as the select form does
#elif defined(QQ_CODEC_GPU_FORMS)
  return __builtin_fminf(__builtin_fmaxf(t, 0.0f), n);
#else
  return t > 0.0f ? (t < n ? t : n) : 0.0f;
#endif
}
QQ_HD uint32_t affine_round_clamped(float c) { return f2u(add_rd(add_rd(c, 0.5f), 8388608.0f)) - 0x4b000000u; }
// clamp(round_half_away(t), 0, n) as an integer, n = 2^bits - 1.
QQ_HD uint32_t affine_round_clamp(float t, float n) {
#if defined(__CUDA_ARCH__) || defined(QQ_CODEC_GPU_FORMS)
  // Clamping first is equal (rounding is monotone and 0, n are integers).
  return affine_round_clamped(affine_clamp(t, n));
#else
  float q = round_half_away(t);
  q = q < 0.0f ? 0.0f : (q > n ? n : q);
  return (uint32_t)q;
#endif
}
// The GPU's quotient test (cuda/quant.cuh, affine_encode8): the 1e-3 band on the
// clamped quotient c = affine_clamp(t, n) instead of on |t|. A quotient outside [0, n]
// gives 0 or n whatever its last bits, so only c can sit near a .5 boundary, and c <= 255
// needs no huge-quotient guard; the clamp is shared with the rounding. Safe for the same
// reason as affine_needs_div: the reciprocal quotient (w - bias) * inv lies within 4 ulp
// of the divided one (two roundings against one, each half an ulp), and
// tests/cpp/codec_proofs.cpp proves for every fp32 t that when this test passes, t and
// every quotient within 4 ulp of it round and clamp to the same code.
// (In two steps so that the GPU can test eight quotients at once on the largest distance.)
QQ_HD float affine_round_dist(float c) {  // |c - the integer nearest c|, in [0, 0.5]
  const float ri = (c + 8388608.0f) - 8388608.0f;  // c rounded to an integer (0 <= c <= 255)
#if defined(__CUDA_ARCH__)
  return fabsf(c - ri);  // (the |.| folds into the instruction that reads it; abs_f's mask does not)
#else
  return abs_f(c - ri);
#endif
}
QQ_HD bool affine_dist_in_band(float dist) { return dist > 0.499f; }
QQ_HD bool affine_band_clamped(float c) { return affine_dist_in_band(affine_round_dist(c)); }
// The code of a clamped quotient outside that band: c + 2^23, rounded to nearest, holds the
// integer nearest c in its low bits, and away from a .5 boundary that integer is
// round_half_away(c) = affine_round_clamped(c) (codec_proofs check 7). The sum is the band
// test's own, so the fast path's code costs no instruction beyond the test; the two
// round-down adds of affine_round_clamped are left to the quotients inside the band.
constexpr uint32_t kAffineCodeBias = 0x4b000000u;  // the bits of 2^23: code = bits(2^23 + code) - this
QQ_HD uint32_t affine_rn_code(float c) { return f2u(c + 8388608.0f) - kAffineCodeBias; }
// The correctly rounded quotient d / scale without a division, from inv = RN(1 / scale):
// q = RN(d * inv) (a few ulp off), r = RN(d - q * scale) in one fma, then RN(q + r * inv)
// in another (Markstein's correction step). tests/cpp/quotient_proof.cu checks it against
// IEEE division on a GPU for every pair of fp32 significands in [1, 2) (all 2^46), and that
// covers every d with every scale of kAffineFmaMin <= |scale| <= kAffineFmaMax whose
// quotient has |d / scale| >= 1/4: there inv, q, the result and any nonzero residual (a
// multiple of ulp(q) * ulp(scale) >= 2^-112) are normal, so each rounding is the
// significands' rounding scaled by a power of two. Below 1/4 the result is within a few
// ulp of the quotient (a subnormal residual's rounding adds at most 2^-150 * inv <= 2^-86),
// so the affine code is 0 either way. An affine group's |scale| is at least ~5e-8
// (affine_params' floor) and reaches 2^64 only for values beyond ~1e20; such groups take
// the reciprocal quotient with its band test instead.
constexpr float kAffineFmaMin = 0x1p-64f, kAffineFmaMax = 0x1p64f;
QQ_HD bool affine_fma_ok(float scale) {
  const float a = abs_f(scale);
  return a >= kAffineFmaMin && a <= kAffineFmaMax;
}
QQ_HD float affine_quotient_fma(float d, float scale, float inv) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(d, inv);  // (the _rn forms: never contracted into other operations)
  return __fmaf_rn(__fmaf_rn(-q, scale, d), inv, q);
#else
  const float q = d * inv;
  return __builtin_fmaf(__builtin_fmaf(-q, scale, d), inv, q);
#endif
}
// The code of d / scale clamped to [0, n], from the exact quotient (affine_fma_ok(scale)
// must hold), rounded half away from zero: the GPU encoders' one form of it (affine_encode
// below, quant.cuh's affine_encode8).
QQ_HD uint32_t affine_code_exact(float d, float scale, float inv, float n) {
  return affine_round_clamped(affine_clamp(affine_quotient_fma(d, scale, inv), n));
}
// The host form is the reference: the reciprocal quotient, divided near a .5 boundary. The
// GPU takes the exact quotient where affine_fma_ok holds (no band test, no branch: 8 floating
// point instructions an element), the same codes (both are the code of RN(d / scale)).
QQ_HD uint32_t affine_encode(float w, float scale, float inv, float bias, int bits) {
  const float d = w - bias;
#if defined(__CUDA_ARCH__)
  if (affine_fma_ok(scale)) return affine_code_exact(d, scale, inv, (float)((1 << bits) - 1));
#endif
  float t = d * inv;
  if (affine_needs_div(t)) t = d / scale;
  return affine_round_clamp(t, (float)((1 << bits) - 1));
}
// Dequantize: fma(q, scale, bias), one rounding (what MLX's CUDA kernels
// compile to; std::fma on the CPU gives the same bits).
QQ_HD float affine_decode(uint32_t q, float scale, float bias) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn((float)q, scale, bias);
#else
  return __builtin_fmaf((float)q, scale, bias);
#endif
}

}  // namespace qq

#endif  // QQ_CODEC_H_
