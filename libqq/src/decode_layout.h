// decode_layout.h - the decode layout of nvfp4 / mxfp4 weights: the one home of
// its addressing and scale codes, for the CPU backend (cpu/decode.cpp) and the
// GPU (cuda/qmmp.cu). docs/formats.md ("Decode layout") is its contract.
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

namespace qq {

constexpr int kDecFB = 576;        // bytes per fragment block
constexpr int kDecTileRows = 64;   // N is padded to this
constexpr int kDecChunkK = 256;    // K must be a multiple of this
constexpr int kDecStage = 16 * kDecFB;  // one tile x chunk: 4 row blocks x 4 FBs

QQ_HD int64_t decode_layout_bytes(int64_t n, int64_t k) {
  return roundup(n, kDecTileRows) / 16 * (k / 64) * kDecFB;
}

// Offset of fragment block (row block R = n / 16, k block F = k / 64).
QQ_HD int64_t decode_fb(int64_t R, int64_t F, int64_t K) {
  return (((R >> 2) * (K / kDecChunkK) + (F >> 2)) * 4 + (R & 3)) * 4 * kDecFB + (F & 3) * kDecFB;
}

// Where element (n, k) of an [N, K] weight lives: the byte of its code and the
// nibble's shift, and the byte of its scale code.
struct DecPos {
  int64_t byte, sbyte;
  int shift;
};
QQ_HD DecPos decode_pos(int64_t n, int64_t k, int64_t K) {
  const int r = (int)(n & 15), kk = (int)(k & 63);
  const int g = r & 7, half = r >> 3, q = kk >> 4, j = (kk >> 2) & 3, e = kk & 3;
  const int nib = (e < 2 ? 0 : 2) + half + 4 * (e & 1), lane = 4 * g + q;
  const int64_t fb = decode_fb(n >> 4, k >> 6, K);
  DecPos p;
  p.byte = fb + 16 * lane + 4 * j + (nib >> 1);
  p.shift = 4 * (nib & 1);
  p.sbyte = fb + 512 + 2 * lane + half;
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
  return true;
}

}  // namespace qq

#endif  // QQ_DECODE_LAYOUT_H_
