#!/bin/sh
# Host check of the qmv.cu bit-trick decoders (fp4x8, fp8x4, e4m3_scale, aff4x8,
# aff8x4, affgx8) against codec.h: every E2M1 / E4M3 / E5M2 code (NaN, Inf and
# subnormals included), scales from 2^-127 to 2^127 and NaN, affine 2..8 bits.
# Extracts the decoder section of qmv.cu verbatim and compiles it with g++; no GPU.
#   sh scripts/check_qmv_decoders.sh      -> "mismatches: 0"
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d)
{
cat <<'HEAD'
#include <cstdio>
#include <cstdint>
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
#define __host__
#define __ldg(p) (*(p))
#include "internal.h"
namespace qq { namespace cuda {
enum Fmt { FP4NV = 0, FP4MX = 1, FP8 = 2, AFF4 = 3, AFF8 = 4, AFFG = 5 };
HEAD
sed -n '/^struct Launch {/,/^};/p' "$ROOT/libqq/src/cuda/qmv.cu"
sed -n '/^\/\/ ---- element decoders/,/^\/\/ ---- x and out/p' "$ROOT/libqq/src/cuda/qmv.cu"
cat <<'MAIN'
}}
using namespace qq; using namespace qq::cuda;
static bool same(float a, float b) { return (a != a && b != b) || memcmp(&a, &b, 4) == 0; }
int main() {
  int bad = 0;
  const float scales[] = {1.0f, 0.171875f, 448.0f, 0x1p-9f, 0x1p-127f, 0x1p127f, 0x1p100f, NAN, 3.0f};
  for (float f : scales) {
    for (uint32_t w0 = 0; w0 < 65536; w0 += 1) {
      uint32_t w = w0 | ((w0 * 2654435761u) & 0xffff0000u);
      float v[8]; fp4x8(w, f, v);
      for (int i = 0; i < 8; ++i) if (!same(v[i], e2m1_decode((w >> (4*i)) & 15) * f)) { if (bad++ < 5) printf("fp4 w=%08x i=%d got %g want %g\n", w, i, v[i], e2m1_decode((w>>(4*i))&15)*f); }
    }
  }
  for (int kind = 1; kind <= 2; ++kind) {
    Launch L{}; L.f8_kind = kind;
    if (kind == ELEM_E4M3) { L.f8_shl = 4; L.f8_shr = 4; L.f8_mag = 0x07f007f0u; L.f8_fix = 0x1p120f; L.f8_nan_mask = 0x7f7f7f7fu; L.f8_nan_add = 0x01010101u; }
    else { L.f8_shl = 5; L.f8_shr = 3; L.f8_mag = 0x0fe00fe0u; L.f8_fix = 0x1p112f; L.f8_nan_mask = 0x7c7c7c7cu; L.f8_nan_add = 0x04040404u; }
    for (float f : scales)
      for (uint32_t a = 0; a < 256; ++a) for (uint32_t b = 0; b < 256; ++b) {
        uint32_t w = a | (b << 8) | (((a * 7 + b * 13) & 255) << 16) | (((a ^ b) & 255) << 24);
        float v[4]; fp8x4(w, f, L, v);
        for (int i = 0; i < 4; ++i) { float want = elem_decode(kind, (uint8_t)(w >> (8*i))) * f; if (!same(v[i], want)) { if (bad++ < 10) printf("fp8 k%d w=%08x i=%d got %g want %g\n", kind, w, i, v[i], want); } }
      }
  }
  for (uint32_t b = 0; b < 256; ++b) if (!same(e4m3_scale(b), e4m3_decode(b))) { if (bad++ < 20) printf("e4m3 scale %u\n", b); }
  const float ss[] = {0.013f, -0.5f, 1e-7f, 3.25f}, bs[] = {0.0f, -1.7f, 0.3f};
  for (float s : ss) for (float bb : bs) {
    for (uint32_t w0 = 0; w0 < 65536; ++w0) {
      uint32_t w = w0 | ((w0 * 2654435761u) & 0xffff0000u);
      float v[8]; aff4x8(w, s, bb, v);
      for (int i = 0; i < 8; ++i) if (!same(v[i], affine_decode((w >> (4*i)) & 15, s, bb))) bad++;
      aff8x4(w, s, bb, v);
      for (int i = 0; i < 4; ++i) if (!same(v[i], affine_decode((w >> (8*i)) & 255, s, bb))) bad++;
      for (int bits = 2; bits <= 8; ++bits) {
        uint64_t x = (uint64_t)w | ((uint64_t)(w * 31u) << 32);
        affgx8(x, bits, s, bb, v);
        for (int i = 0; i < 8; ++i) if (!same(v[i], affine_decode((uint32_t)(x >> (i*bits)) & ((1u<<bits)-1), s, bb))) bad++;
      }
    }
  }
  printf("mismatches: %d\n", bad);
  return bad != 0;
}
MAIN
} > "$T/check.cpp"
g++ -O1 -std=c++17 -I"$ROOT/libqq/src" -I"$ROOT/libqq/include" "$T/check.cpp" -o "$T/check"
"$T/check"
