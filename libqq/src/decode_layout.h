// decode_layout.h - the decode layout of nvfp4 / mxfp4 / mxfp8 / affine 4- and
// 8-bit weights: the one home of its addressing and scale codes, for the CPU
// backend (cpu/matmul.cpp) and the GPU (cuda/qmmp.cu). docs/formats.md ("Decode layout") is its contract.
//
// Why a second layout: the weight-only kernel for decode (M <= 16) is bound by
// how it reads the weights. In this layout a 16-row x 64-k block (a "fragment
// block", FB: 512 code bytes, then 64 scale codes) is exactly what one warp's
// tensor-core fragments consume: lane l = 4 g + q owns code bytes [16 l, 16 l +
// 16), word j of them is mma k-step j, nibbles (0, 4) / (1, 5) / (2, 6) / (3, 7)
// are its A registers a0 (row g) / a1 (row g + 8) / a2 (row g) / a3 (row g + 8),
// and a register's two elements are k = 16 q + 4 j + {0, 1} (a0, a1) or {2, 3}
// (a2, a3). So every element of a lane lies in scale slot q (k 16 q .. 16 q + 15
// of the FB): one scale pair per lane per FB (halfword l of the scale codes:
// row g, then row g + 8), and its x elements are 16 contiguous values. FBs are
// stored tile-major, [N/64][K/256][4 row blocks][4 FBs], so one CTA's stage (64
// rows x 256 k) is one contiguous 9216-byte span.
//
// mxfp8 (E4M3 elements) has its own fragment block: 16 rows x 32 k = 512 code
// bytes + 16 scale codes (one group per row), 528 bytes, stored [N/64][K/256][4
// row blocks][8 FBs] (a stage is again 64 rows x 256 k). Lane l's 16 bytes are
// words 2 t + h = k-step t, row g + 8 h: the codes of k = 8 q + 4 t + {0, 1, 2,
// 3} in bytes {0, 2, 1, 3}, so that bytes (0, 2) / (1, 3) are the pairs of the fp8
// placement (vec.cuh's fp8_place) for A registers a_h / a_{2+h}; lane q's x is 8
// contiguous values. Scale codes: halfword g = (row g, row g + 8), each the bf16
// exponent field of s * 2^111 (u + 111 for UE8M0 u; the placement's 2^-120 then
// leaves products e * s * 2^-9), which fits for u in [19, 143].
//
// Affine 4-bit weights (group 64 or 128) use fp4's fragment blocks and code
// order, affine 8-bit (group 32, 64 or 128) fp8's; both end in 64 bytes of
// bfloat16 scales and biases instead of scale codes: 8 bytes per row pair g,
// (s_g, s_g+8, b_g, b_g+8), so an FB is 576 bytes either way and stage 9216 /
// 18432 bytes. An FB lies inside one group (a 128-group's scale and bias are
// stored in both of its FBs); the kernel multiplies the codes exactly and applies
// s and b to each FB's fp32 partial sums. A scale or bias that is not exactly a
// bfloat16 value (from fp16 / fp32 scales) cannot be encoded.
//
// Scale codes: the bf16 bits of s * 2^117 are code * 16 + 0x7000 (an exponent
// offset of 5 bits above 224 and s's 3 mantissa bits), built in the kernel by
// one byte permute and one integer multiply-add. Every E4M3 scale fits; a UE8M0
// scale 2^(u - 127) fits for u in [107, 137]. A block whose codes are all zero
// takes code 0 whatever its scale (zero times any finite scale is zero); a zero
// scale zeroes its block's codes; a negative E4M3 scale flips its codes' signs.
// A NaN scale, or a UE8M0 scale outside the window over non-zero codes, cannot
// be encoded: the weight then stays in the packed layout (qqToDecodeLayout
// returns NOT_SUPPORTED).
#ifndef QQ_DECODE_LAYOUT_H_
#define QQ_DECODE_LAYOUT_H_

#include <stdint.h>

#include "codec.h"
#include "internal.h"

namespace qq {

constexpr int kDecFB = 576;        // bytes per fragment block (fp4; affine 4- and 8-bit too)
constexpr int kDecTileRows = 64;   // N is padded to this
constexpr int kDecChunkK = 256;    // K must be a multiple of this
constexpr int kDecMaxM = 64;       // rows of x the GPU kernel takes (cuda/qmmp.cu)
constexpr int kDecFB8 = 528;       // mxfp8: 16 rows x 32 k + 16 scale codes
constexpr int kDecU8Lo = 19, kDecU8Hi = 143;  // the UE8M0 scales mxfp8's codes hold

// The layout's formats: fp4 (nvfp4, mxfp4), fp8 (mxfp8, E4M3), affine 4- and 8-bit.
enum DecFmt : int { kDecFp4 = 0, kDecFp8 = 1, kDecAff4 = 2, kDecAff8 = 3 };
QQ_HD int decode_fmt(const QSpec& q) { return (q.mode == QQ_MODE_AFFINE ? 2 : 0) + (q.bits == 8 ? 1 : 0); }
QQ_HD constexpr bool dec_bits8(int f) { return (f & 1) != 0; }
QQ_HD constexpr bool dec_affine(int f) { return f >= kDecAff4; }
QQ_HD constexpr int dec_fb_bytes(int f) { return f == kDecFp8 ? kDecFB8 : kDecFB; }
QQ_HD constexpr int dec_fb_k(int f) { return dec_bits8(f) ? 32 : 64; }        // k per fragment block
QQ_HD constexpr int dec_fbs(int f) { return kDecChunkK / dec_fb_k(f); }        // FBs per row block and chunk
QQ_HD constexpr int dec_stage(int f) { return 4 * dec_fbs(f) * dec_fb_bytes(f); }  // 64 rows x 256 k

QQ_HD int64_t decode_layout_bytes(int64_t n, int64_t k, int fmt) {
  return roundup(n, kDecTileRows) / 16 * (k / dec_fb_k(fmt)) * dec_fb_bytes(fmt);
}

// Offset of fragment block (row block R = n / 16, k block F = k / dec_fb_k).
QQ_HD int64_t decode_fb(int fmt, int64_t R, int64_t F, int64_t K) {
  const int fbs = dec_fbs(fmt);
  return (((R >> 2) * (K / kDecChunkK) + F / fbs) * 4 + (R & 3)) * fbs * dec_fb_bytes(fmt) +
         (F % fbs) * dec_fb_bytes(fmt);
}

// Where element (n, k) of an [N, K] weight lives: the byte of its code and the
// nibble's shift (0 for 8-bit codes), and the byte of its scale code (affine: of
// its bf16 scale; the bias is 4 bytes further).
struct DecPos {
  int64_t byte, sbyte;
  int shift;
};
QQ_HD DecPos decode_pos(int fmt, int64_t n, int64_t k, int64_t K) {
  const int r = (int)(n & 15), g = r & 7, half = r >> 3;
  const int64_t fb = decode_fb(fmt, n >> 4, k / dec_fb_k(fmt), K);
  DecPos p;
  if (dec_bits8(fmt)) {
    const int kk = (int)(k & 31), q = kk >> 3, t = (kk >> 2) & 1, e = kk & 3;
    p.byte = fb + 16 * (4 * g + q) + 4 * (2 * t + half) + ((e & 1) << 1) + (e >> 1);
    p.shift = 0;
    p.sbyte = fb + 512 + 2 * g + half;
  } else {
    const int kk = (int)(k & 63), q = kk >> 4, j = (kk >> 2) & 3, e = kk & 3;
    const int nib = (e < 2 ? 0 : 2) + half + 4 * (e & 1), lane = 4 * g + q;
    p.byte = fb + 16 * lane + 4 * j + (nib >> 1);
    p.shift = 4 * (nib & 1);
    p.sbyte = fb + 512 + 2 * lane + half;
  }
  if (dec_affine(fmt)) p.sbyte = fb + 512 + 8 * g + 2 * half;
  return p;
}

// Scale code of a finite scale magnitude s > 0 (an E4M3 or UE8M0 value: at most
// 3 mantissa bits), or -1 when bf16(s * 2^117) is outside the code's range.
QQ_HD int decode_scale_code(float s) {
  const uint32_t b = f2u(s);
  int e = (int)((b >> 23) & 0xff) - 127;
  uint32_t m = b & 0x7fffffu;
  if (e == -127) {  // an fp32 subnormal: no E4M3 / UE8M0 scale in range is one
    return -1;
  }
  if (m & 0xfffffu) return -1;  // more than 3 mantissa bits (not a scale value)
  const int f = e + 244;          // bf16 exponent field of s * 2^117
  if (f < 224 || f > 254) return -1;
  return ((f - 224) << 3) | (int)(m >> 20);
}
// The scale a code stands for (s, without the 2^117): for the CPU backend.
QQ_HD float decode_scale_value(int code) {
  return (1.0f + (float)(code & 7) * 0.125f) * exp2i((code >> 3) - 20);
}

// The 4 code words of a 4-bit lane slot: c[h] holds the 16 codes of row g + 8h
// (element i in nibble i), word j the k-step j (see the top of this file).
QQ_HD void decode_words4(const uint64_t (&c)[2], uint32_t (&words)[4]) {
  for (int j = 0; j < 4; ++j) {
    uint32_t w = 0;
    for (int e = 0; e < 4; ++e)
      for (int h = 0; h < 2; ++h) {
        const uint32_t code = (uint32_t)(c[h] >> (4 * (4 * j + e))) & 15u;
        const int nib = (e < 2 ? 0 : 2) + h + 4 * (e & 1);
        w |= code << (4 * nib);
      }
    words[j] = w;
  }
}
// The 4 code words of an 8-bit lane slot: c[h] the 8 codes of row g + 8h (element i
// in byte i), word 2 t + h the k-step t of row g + 8h, bytes in the order {0, 2, 1, 3}.
QQ_HD void decode_words8(const uint64_t (&c)[2], uint32_t (&words)[4]) {
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2; ++h) {
      uint32_t w = 0;
      for (int e = 0; e < 4; ++e)
        w |= (uint32_t)((c[h] >> (8 * (4 * t + e))) & 0xff) << (8 * (((e & 1) << 1) + (e >> 1)));
      words[2 * t + h] = w;
    }
}

// One lane slot of a fragment block (16 k of rows g and g + 8): c[h] holds the 16
// E2M1 codes of row g + 8h (element i in nibble i, the packed layout's order),
// s[h] its decoded scale (any value). Fills the slot's 4 code words and 2 scale
// codes; false when a scale cannot be encoded (see the top of this file).
QQ_HD bool decode_pack_slot(const uint64_t (&c_in)[2], const float (&s_in)[2], uint32_t (&words)[4],
                            uint8_t (&sc)[2]) {
  uint64_t c[2] = {c_in[0], c_in[1]};
  for (int h = 0; h < 2; ++h) {
    float s = s_in[h];
    sc[h] = 0;
    if (!(s == s)) return false;                            // NaN: dequantize gives NaN even for zero codes
    if ((c[h] & 0x7777777777777777ull) == 0) continue;      // all codes +-0: any scale gives zeros
    if (s == 0.0f) {
      c[h] = 0;
      continue;
    }
    if (s < 0.0f) {
      c[h] ^= 0x8888888888888888ull;
      s = -s;
    }
    const int code = decode_scale_code(s);
    if (code < 0) return false;
    sc[h] = (uint8_t)code;
  }
  decode_words4(c, words);
  return true;
}

// mxfp8: one lane slot (8 k of rows g and g + 8): c[h] the 8 E4M3 codes of row
// g + 8h (element i in byte i), u[h] its UE8M0 scale. Fills the 4 code words and
// the 2 scale codes; false for a NaN code or scale, or a scale outside the
// window over non-zero codes (code 0 then stands for "these codes are zeros").
QQ_HD bool decode_pack_slot8(const uint64_t (&c)[2], const uint8_t (&u)[2], uint32_t (&words)[4], uint8_t (&sc)[2]) {
  for (int h = 0; h < 2; ++h) {
    if (u[h] == 255) return false;
    for (int i = 0; i < 8; ++i)
      if (((c[h] >> (8 * i)) & 0x7f) == 0x7f) return false;  // an E4M3 NaN code
    const bool zeros = (c[h] & 0x7f7f7f7f7f7f7f7full) == 0;
    if (u[h] >= kDecU8Lo && u[h] <= kDecU8Hi) {
      sc[h] = (uint8_t)(u[h] + 111);
    } else if (zeros) {
      sc[h] = 0;
    } else {
      return false;
    }
  }
  decode_words8(c, words);
  return true;
}

// An affine scale or bias as the layout stores it: its bfloat16 bits, when the value
// is exactly a bfloat16 (NaN and +-Inf included); false otherwise.
QQ_HD bool decode_affine_bf16(float v, uint16_t* out) {
  *out = f_to_bf16(v);
  return v != v || bf16_to_f(*out) == v;
}
// Element i of a float scale / bias row (fp32, fp16 or bf16).
QQ_HD float decode_load_float(const Mat& m, int64_t e, int64_t r, int64_t i) {
  if (m.dt == DType::F32) return m.at<float>(e, r)[i];
  const uint16_t h = m.at<uint16_t>(e, r)[i];
  return m.dt == DType::F16 ? fp16_to_f(h) : bf16_to_f(h);
}

// What makes a weight of q's mode unencodable, for the error messages.
inline const char* decode_unencodable(const QSpec& q) {
  return q.mode == QQ_MODE_AFFINE ? "a scale or bias that is not exactly a bfloat16 value: quantize a bfloat16 weight"
                                  : "a NaN scale or mxfp8 element, or an mx scale outside its window over non-zero "
                                    "codes: mxfp4 2^-20 .. 2^10, mxfp8 2^-108 .. 2^16";
}

// Gated layouts (qqToDecodeLayoutGated): a gate/up weight [2F, K] (the gate's F rows,
// then the up projection's; F a multiple of 32) is stored with each 64-row tile holding
// gate rows 32 t .. 32 t + 31, then up rows 32 t .. 32 t + 31. One CTA of the decode kernel
// then has both sums of an output column and applies SwiGLU where it makes them
// (qqDecodeGatedMatmul), instead of writing [M, 2F] for a second kernel to read.
// The weight row that layout row r holds:
QQ_HD int64_t decode_gated_row(int64_t r, int64_t F) {
  const int64_t t = r >> 6, j = r & 63;
  return j < 32 ? 32 * t + j : F + 32 * t + (j - 32);
}
QQ_HD int64_t decode_src_row(const DecodeLayoutArgs& a, int64_t r) { return a.gated ? decode_gated_row(r, a.gated) : r; }

// Number of lane slots of the conversion: 32 per fragment block, rows padded to 16
// (the rest of the 64-row padding stays zero).
QQ_HD int64_t decode_slots(const DecodeLayoutArgs& a) {
  return roundup(a.N, 16) / 16 * (a.K / dec_fb_k(decode_fmt(a.q))) * 32;
}
// Bytes of one expert's layout in a DecodeLayoutArgs' out.
QQ_HD int64_t decode_expert_bytes(const DecodeLayoutArgs& a) { return decode_layout_bytes(a.N, a.K, decode_fmt(a.q)); }
// The conversion of one lane slot of expert e (slot / 32 = fragment block in [row block][k
// block] order, slot % 32 = the lane), the same on the CPU and the GPU: reads the slot's
// codes of rows g and g + 8 (8 bytes each) and their scales (and biases) from a.w /
// a.scales (/ a.biases), writes the lane's 16 code bytes and its scale codes (8-bit
// codes and affine: lane q = 0 writes its row pair's) into a.out, byte by byte (a.out
// needs no alignment). False when a scale or bias cannot be encoded; rows past N read
// as zeros.
QQ_HD bool decode_convert_slot(const DecodeLayoutArgs& a, int64_t e, int64_t fbi, int lane) {
  const int fmt = decode_fmt(a.q);
  const bool f8 = dec_bits8(fmt), aff = dec_affine(fmt);
  const int g = lane >> 2, q = lane & 3;
  const int64_t kfb = a.K / dec_fb_k(fmt), R = fbi / kfb, F = fbi % kfb;
  const int64_t k0 = F * dec_fb_k(fmt) + (f8 ? 8 : 16) * q, kg = k0 / a.q.group;
  const int64_t c4 = roundup(a.K / a.q.group, 4);
  uint64_t c[2] = {0, 0};
  uint8_t sb[2] = {127, 127};  // mxfp8 rows past N: zero codes under 2^0
  float as[2] = {0.0f, 0.0f}, ab[2] = {0.0f, 0.0f};  // affine rows past N: zero scale and bias
  bool live[2] = {false, false};
  for (int h = 0; h < 2; ++h) {
    const int64_t r = R * 16 + g + 8 * h;  // the layout's row
    if (r >= a.N) continue;
    const int64_t n = decode_src_row(a, r);  // w's
    live[h] = true;
    const uint8_t* row = a.w.at<uint8_t>(e, n) + (f8 ? k0 : k0 / 2);
    for (int b = 0; b < 8; ++b) c[h] |= (uint64_t)row[b] << (8 * b);
    if (aff) {
      as[h] = decode_load_float(a.scales, e, n, kg);
      ab[h] = decode_load_float(a.biases, e, n, kg);
    } else {
      sb[h] = a.q.blocked ? a.scales.at<uint8_t>(e)[blocked_offset(n, kg, c4)] : a.scales.at<uint8_t>(e, n)[kg];
    }
  }
  uint32_t words[4];
  uint8_t sc[8];
  if (aff) {
    if (f8)
      decode_words8(c, words);
    else
      decode_words4(c, words);
    for (int h = 0; h < 2; ++h) {
      uint16_t sbits, bbits;
      if (!decode_affine_bf16(as[h], &sbits) || !decode_affine_bf16(ab[h], &bbits)) return false;
      sc[2 * h] = (uint8_t)sbits;
      sc[2 * h + 1] = (uint8_t)(sbits >> 8);
      sc[4 + 2 * h] = (uint8_t)bbits;
      sc[4 + 2 * h + 1] = (uint8_t)(bbits >> 8);
    }
  } else if (f8) {
    uint8_t s2[2];
    if (!decode_pack_slot8(c, sb, words, s2)) return false;
    sc[0] = s2[0], sc[1] = s2[1];
  } else {
    float s[2] = {0.0f, 0.0f};  // fp4 rows past N: zero codes under a zero scale
    for (int h = 0; h < 2; ++h)
      if (live[h]) s[h] = a.q.mode == QQ_MODE_NVFP4 ? e4m3_decode(sb[h]) : ue8m0_decode(sb[h]);
    uint8_t s2[2];
    if (!decode_pack_slot(c, s, words, s2)) return false;
    sc[0] = s2[0], sc[1] = s2[1];
  }
  uint8_t* fb = a.out + e * decode_expert_bytes(a) + decode_fb(fmt, R, F, a.K);
  for (int i = 0; i < 16; ++i) fb[16 * lane + i] = (uint8_t)(words[i >> 2] >> (8 * (i & 3)));
  if (aff) {
    if (q == 0)
      for (int i = 0; i < 8; ++i) fb[512 + 8 * g + i] = sc[i];
  } else if (!f8 || q == 0) {
    const int o = 512 + 2 * (f8 ? g : lane);
    fb[o] = sc[0];
    fb[o + 1] = sc[1];
  }
  return true;
}

}  // namespace qq

#endif  // QQ_DECODE_LAYOUT_H_
