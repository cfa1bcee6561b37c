// cpu/quantize.cpp - the CPU reference backend: quantize, dequantize,
// swizzle/unswizzle, amax, and the row helpers the CPU matmuls reuse.
//
// Straight loops over rows, every group computed with the codecs of codec.h
// (the same functions the CUDA kernels call), rows spread over threads.
// This backend is the reference the GPU must equal bit for bit.
#include <math.h>
#include <string.h>

#include <algorithm>
#include <thread>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "../codec.h"
#include "../internal.h"
#include "e2m1x8_avx2.h"
#include "fp8x8_avx2.h"
#include "rows.h"

#define QQ_CPU_TRY(expr)                      \
  do {                                        \
    qqStatus_t st_ = (expr);                  \
    if (st_ != QQ_STATUS_SUCCESS) return st_; \
  } while (0)

namespace qq {
namespace cpu {

void parallel_for(int64_t n, int64_t cost, void (*fn)(void*, int64_t, int64_t), void* ctx) {
  // Threads pay off above ~1M element-operations; below that one thread.
  const int64_t total = n * (cost > 0 ? cost : 1);
  if (total < (int64_t(2) << 20) || n < 2) {
    fn(ctx, 0, n);
    return;
  }
  // hardware_concurrency() reads /sys/devices/system/cpu/online (three syscalls) on
  // glibc: asked once, and only by calls large enough to use threads.
  static const int hw = std::max(1, (int)std::thread::hardware_concurrency());
  int nt = (int)std::min<int64_t>(hw, total / (1 << 20));
  nt = (int)std::min<int64_t>(nt, n);
  if (nt <= 1) {
    fn(ctx, 0, n);
    return;
  }
  std::vector<std::thread> ts;
  ts.reserve(nt);
  for (int t = 0; t < nt; ++t) {
    const int64_t b = n * t / nt, e = n * (t + 1) / nt;
    ts.emplace_back([=] { fn(ctx, b, e); });
  }
  for (auto& t : ts) t.join();
}

// ---- row conversions ---------------------------------------------------------
// Built twice on x86-64 (GCC / Clang target_clones: the loader picks one by the CPU): AVX2's copy converts 8 16-bit values
// a step where the baseline's took 4 (qqmm's prepared bf16 weight is read through it on every
// call: ~2 instructions an element were a fifth of a qqmm of [1, 32] x [32, 32]). The
// conversions are exact either way.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
__attribute__((target_clones("avx2", "default")))
#endif
void load_row(const void* p, DType dt, int64_t n, float* out) {
  switch (dt) {
    case DType::F32:
      if (n > 0) memcpy(out, p, n * 4);  // (an empty row may have a NULL pointer: memcpy(NULL, 0) is UB)
      break;
    case DType::F16: {
      const uint16_t* h = (const uint16_t*)p;
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_f(h[i]);
      break;
    }
    case DType::BF16: {
      const uint16_t* h = (const uint16_t*)p;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f(h[i]);
      break;
    }
    default: break;
  }
}
void store_row(const float* in, int64_t n, DType dt, void* p) {
  switch (dt) {
    case DType::F32:
      if (n > 0) memcpy(p, in, n * 4);
      break;
    case DType::F16: {
      uint16_t* h = (uint16_t*)p;
      for (int64_t i = 0; i < n; ++i) h[i] = f_to_fp16(in[i]);
      break;
    }
    case DType::BF16: {
      uint16_t* h = (uint16_t*)p;
      for (int64_t i = 0; i < n; ++i) h[i] = f_to_bf16(in[i]);
      break;
    }
    default: break;
  }
}
float round_to(float v, DType dt) {
  if (dt == DType::F16) return fp16_to_f(f_to_fp16(v));
  if (dt == DType::BF16) return bf16_to_f(f_to_bf16(v));
  return v;
}

// ---- one row: quantize --------------------------------------------------------
namespace {
// A group's fp4 codes: g values of v times f into g / 2 bytes (low nibble first): codec.h's
// e2m1_encode a pair at a time, or eight at a time with AVX2 (e2m1x8_avx2.h: the same codes).
using Fp4Encode = void (*)(const float* v, int g, float f, uint8_t* d);
void fp4_encode_generic(const float* v, int g, float f, uint8_t* d) {
  for (int i = 0; i < g; i += 2) d[i / 2] = (uint8_t)(e2m1_encode(v[i] * f) | (e2m1_encode(v[i + 1] * f) << 4));
}
#if defined(QQ_E2M1X8_AVX2)
__attribute__((target("avx2"))) void fp4_encode_avx2(const float* v, int g, float f, uint8_t* d) {
  int i = 0;
  for (; i + 8 <= g; i += 8) {
    const uint32_t w = e2m1x8_encode_avx2(v + i, f);
    memcpy(d + i / 2, &w, 4);
  }
  fp4_encode_generic(v + i, g - i, f, d + i / 2);
}
#endif
// A group's fp8 codes: g values of v times f into g bytes, element kind `elem` (E4M3 or
// E5M2): codec.h's elem_encode one at a time, or eight at a time with AVX2 (fp8x8_avx2.h:
// the same codes).
using Fp8Encode = void (*)(const float* v, int g, float f, int elem, uint8_t* d);
void fp8_encode_generic(const float* v, int g, float f, int elem, uint8_t* d) {
  for (int i = 0; i < g; ++i) d[i] = elem_encode(elem, v[i] * f);
}
#if defined(QQ_FP8X8_AVX2)
__attribute__((target("avx2"))) void fp8_encode_avx2(const float* v, int g, float f, int elem, uint8_t* d) {
  int i = 0;
  for (; i + 8 <= g; i += 8) fp8x8_encode_avx2(v + i, f, elem == ELEM_E5M2, d + i);
  fp8_encode_generic(v + i, g - i, f, elem, d + i);
}
#endif
// The encoders for the CPU at hand, picked once.
struct Encoders {
  Fp4Encode fp4;
  Fp8Encode fp8;
};
const Encoders& encoders() {
  static const Encoders e = [] {
    Encoders r{&fp4_encode_generic, &fp8_encode_generic};
#if defined(QQ_E2M1X8_AVX2) && defined(QQ_FP8X8_AVX2)  // (x86-64, GCC or Clang: both or neither)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) r.fp4 = &fp4_encode_avx2, r.fp8 = &fp8_encode_avx2;
#endif
    return r;
  }();
  return e;
}
}  // namespace

// x: K fp32 values. Writes the packed row to `data`, the group scales to
// sc[g] (bytes for fp modes; fp32 values for affine in scf/bif, already
// rounded to the storage dtype `sdt`).
// gamax: per-group amax to use instead of the group's own (the 32x32 MoE
// scaling shares one amax over a 32x32 tile), or nullptr.
void quantize_row(const float* x, int64_t K, const QSpec& q, float enc, uint8_t* data, uint8_t* sc, float* scf,
                  float* bif, DType sdt, const float* gamax) {
  const int g = q.group;
  const int64_t ng = K / g;
  if (q.fp()) {
    const Encoders& codes = encoders();
    for (int64_t gi = 0; gi < ng; ++gi) {
      const float* v = x + gi * g;
      float amax = 0.0f;
      if (gamax) amax = gamax[gi];
      else
        for (int i = 0; i < g; ++i) amax = nanmax_f(amax, abs_f(v[i]));
      const FpGroupScale gsc = fp_group_scale(amax, q.mode == QQ_MODE_NVFP4, enc, q.elem, q.floor_rounding);
      const float f = gsc.factor;
      const bool nan_group = gsc.nan_group;
      sc[gi] = gsc.code;
      if (q.bits == 4) {
        uint8_t* d = data + gi * g / 2;
        if (nan_group) memset(d, 0, (size_t)(g / 2));
        else codes.fp4(v, g, f, d);
      } else {
        uint8_t* d = data + gi * g;
        if (nan_group) memset(d, elem_nan_code(q.elem), (size_t)g);
        else codes.fp8(v, g, f, q.elem, d);
      }
    }
    return;
  }
  // affine: bit stream, element i at bits [i*bits, (i+1)*bits)
  const int bits = q.bits;
  memset(data, 0, (size_t)(K * bits / 8));
  for (int64_t gi = 0; gi < ng; ++gi) {
    const float* v = x + gi * g;
    float wmin = v[0], wmax = 0.0f;
    bool finite = true;
    for (int i = 0; i < g; ++i) {
      finite = finite && is_finite_f(v[i]);
      wmin = v[i] < wmin ? v[i] : wmin;
      wmax = v[i] > wmax ? v[i] : wmax;
    }
    if (!finite) {
      scf[gi] = bif[gi] = u2f(0x7fc00000u);
      continue;  // codes stay 0
    }
    float scale, bias;
    affine_params(wmin, wmax, bits, &scale, &bias);
    scf[gi] = round_to(scale, sdt);
    bif[gi] = round_to(bias, sdt);
    const float inv = 1.0f / scale;
    for (int i = 0; i < g; ++i) {
      const uint64_t code = affine_encode(v[i], scale, inv, bias, bits);
      const int64_t bit = (gi * g + i) * bits;
      const int64_t byte = bit >> 3;
      const int sh = (int)(bit & 7);
      const uint32_t wide = (uint32_t)(code << sh);
      data[byte] |= (uint8_t)wide;
      if (sh + bits > 8) data[byte + 1] |= (uint8_t)(wide >> 8);
    }
  }
}

// ---- one row: dequantize -------------------------------------------------------
// scale(g) gives the group's scale byte (fp) or scf/bif (affine, fp32 values).
namespace {
// The codes' decoded values, from the codecs of codec.h (built once): a table lookup per
// element instead of a decode, the same values. e2m1[c] = the E2M1 value of code c (0..15);
// fp8[kind][b] = the e4m3 / e5m2 value of byte b.
struct DecodeTables {
  float e2m1[16];
  float e2m1_pair[256][2];  // a byte's two codes (low nibble first)
  float fp8[3][256];
  DecodeTables() {
    for (int c = 0; c < 16; ++c) e2m1[c] = e2m1_decode((uint8_t)c);
    for (int b = 0; b < 256; ++b) e2m1_pair[b][0] = e2m1[b & 15], e2m1_pair[b][1] = e2m1[b >> 4];
    for (int b = 0; b < 256; ++b) {
      fp8[ELEM_E2M1][b] = 0.0f;  // unused: e2m1 elements are packed two to a byte
      fp8[ELEM_E4M3][b] = e4m3_decode((uint8_t)b);
      fp8[ELEM_E5M2][b] = e5m2_decode((uint8_t)b);
    }
  }
};
const DecodeTables& decode_tables() {
  static const DecodeTables t;
  return t;
}
}  // namespace

// The steps of dequantize_row over a whole row (ng groups of g), each a function of its own so
// that it can be built twice, the copy for the CPU at hand picked once (row_kernels()): a
// call a row, where one a group (and the tables and constants fetched again in each) made
// the dequantization of a [32, 32] nvfp4 weight ~380 instructions a row, most of a tiny
// quantized_matmul.
//  - affine: out[i] = affine_decode(c[i], s, b) = fma(c[i], s, b) over each group's codes.
//    x86-64's baseline has no FMA instruction, so there fmaf is a libm call per element
//    (affine quantized_matmul at M = 1 read ~0.9 ns a weight on a 2-core host, four times the
//    fp modes' ~0.2); with FMA the multiply-adds are inline and vectorized. Same bits: fma
//    rounds once either way (and -ffp-contract=off keeps every other product and sum apart).
//  - fp4: out[i] = e2m1(code i) * f, f the group's factor (g / 2 bytes a group, low nibble
//    first): with AVX2 eight codes at a time (the byte's nibbles shifted into lanes, the
//    magnitude from an 8-entry table in a register, the sign bit or-ed in), the same products
//    as the table lookups of the portable copy.
//  - fp8: out[i] = lut[code i] * f: with AVX2 eight lookups put into one register and one
//    multiply (AVX2's gathers took x [1, 4096] @ mxfp8 [4096, 4096] from 2.6 to 4.0 ms on an
//    AMD EPYC host), the same products.
namespace {
// The fp groups' scale factor: nvfp4's E4M3 byte (the table: e4m3_decode's values), else
// UE8M0.
inline float fp_group_factor(const DecodeTables& t, bool nv, uint8_t s) {
  return nv ? t.fp8[ELEM_E4M3][s] : ue8m0_decode(s);
}
constexpr int kMaxAffineGroup = 128;  // affine group sizes: 32, 64, 128 (validate.cpp)
// fp rows for the fp kernels: rows of ng groups of g codes (d, dld bytes apart) with their
// scale bytes (sc, sld apart), into o (ng * g values a row, contiguous): a call for a block
// of rows where the scale bytes lie in rows (linear), one a row otherwise.
struct FpRows {
  const uint8_t* d;
  int64_t dld;
  const uint8_t* sc;
  int64_t sld;
  int64_t rows, ng;
  int g;
  bool nv;           // nvfp4: E4M3 scale bytes, else UE8M0
  const float* lut;  // fp8: the codes' values
  float* o;
};
// affine rows, as FpRows: codes d (dld bytes apart), the groups' fp32 scales and biases (scf,
// bif; sld, bld apart).
struct AffineRows {
  const uint8_t* d;
  int64_t dld;
  const float *scf, *bif;
  int64_t sld, bld;
  int64_t rows, ng;
  int g, bits;
  float* o;
};
struct RowKernels {
  void (*affine)(const AffineRows& a);
  void (*fp4)(const FpRows& f);
  void (*fp8)(const FpRows& f);
};
// Group gi's codes of an affine row as bytes (4-bit: two a byte, low nibble first; 8-bit: the
// data itself; other widths bit by bit), in codes[] where they need unpacking.
inline const uint8_t* affine_codes(const uint8_t* data, int64_t gi, int g, int bits, uint8_t* codes) {
  if (bits == 8) return data + gi * g;
  if (bits == 4) {  // (g is even: a group starts on a byte)
    const uint8_t* d = data + gi * g / 2;
    for (int i = 0; i < g / 2; ++i) codes[2 * i] = d[i] & 15u, codes[2 * i + 1] = d[i] >> 4;
    return codes;
  }
  const uint32_t mask = (1u << bits) - 1;
  for (int i = 0; i < g; ++i) {
    const int64_t bit = (gi * g + i) * bits;
    const int64_t byte = bit >> 3;
    const int sh = (int)(bit & 7);
    uint32_t w = data[byte];
    if (sh + bits > 8) w |= (uint32_t)data[byte + 1] << 8;
    codes[i] = (uint8_t)((w >> sh) & mask);
  }
  return codes;
}
void affine_generic(const AffineRows& a) {
  uint8_t codes[kMaxAffineGroup];
  float* o = a.o;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t gi = 0; gi < a.ng; ++gi, o += a.g) {
      const uint8_t* c = affine_codes(a.d + r * a.dld, gi, a.g, a.bits, codes);
      const float s = a.scf[r * a.sld + gi], b = a.bif[r * a.bld + gi];
      for (int i = 0; i < a.g; ++i) o[i] = affine_decode(c[i], s, b);
    }
}
void fp4_generic(const FpRows& f) {
  // a byte's two values from one lookup, times the scale: the products e2m1 * f of the
  // codec (the group's 16 scaled values first, then two lookups a byte, took ~0.5 ns an
  // element; a multiply an element with the byte re-read after each store ~1 ns)
  const DecodeTables& t = decode_tables();
  const int g = f.g;
  float* o = f.o;
  for (int64_t r = 0; r < f.rows; ++r)
    for (int64_t gi = 0; gi < f.ng; ++gi, o += g) {
      const float s = fp_group_factor(t, f.nv, f.sc[r * f.sld + gi]);
      const uint8_t* d = f.d + r * f.dld + gi * g / 2;
      for (int i = 0; i < g / 2; ++i) {
        const float* pr = t.e2m1_pair[d[i]];
        o[2 * i] = pr[0] * s;
        o[2 * i + 1] = pr[1] * s;
      }
    }
}
// (the fields in locals and G = 32, mxfp8's group, for the loop's sake, as fp4_avx2_rows's)
template <int G> void fp8_rows(const FpRows& f) {
  const DecodeTables& t = decode_tables();
  const int g = G ? G : f.g;
  const int64_t rows = f.rows, ng = f.ng, dld = f.dld, sld = f.sld;
  const float* lut = f.lut;
  const bool nv = f.nv;
  float* o = f.o;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* d = f.d + r * dld;
    const uint8_t* sc = f.sc + r * sld;
    for (int64_t gi = 0; gi < ng; ++gi, d += g, o += g) {
      const float s = fp_group_factor(t, nv, sc[gi]);
      for (int i = 0; i < g; ++i) o[i] = lut[d[i]] * s;
    }
  }
}
void fp8_generic(const FpRows& f) { f.g == 32 ? fp8_rows<32>(f) : fp8_rows<0>(f); }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// (4- and 8-bit codes eight at a time into lanes, as fp4_avx2 takes them: the same codes as
// affine_codes, converted exactly)
__attribute__((target("avx2,fma"))) void affine_fma_x86(const AffineRows& a) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), low4 = _mm256_set1_epi32(15);
  uint8_t codes[kMaxAffineGroup];
  const int g = a.g;
  float* o = a.o;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t gi = 0; gi < a.ng; ++gi, o += g) {
      const float s = a.scf[r * a.sld + gi], b = a.bif[r * a.bld + gi];
      const uint8_t* d = a.d + r * a.dld;
      if (a.bits == 4 || a.bits == 8) {  // (g is 32, 64 or 128)
        const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
        for (int i = 0; i < g; i += 8) {
          __m256i c;
          if (a.bits == 4) {
            uint32_t w;
            memcpy(&w, d + (gi * g + i) / 2, 4);
            c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), shifts), low4);
          } else {
            int64_t w;
            memcpy(&w, d + gi * g + i, 8);
            c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(w));
          }
          _mm256_storeu_ps(o + i, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), vs, vb));
        }
        continue;
      }
      const uint8_t* c = affine_codes(d, gi, g, a.bits, codes);
      for (int i = 0; i < g; ++i) o[i] = __builtin_fmaf((float)c[i], s, b);
    }
}
// The fields in locals (the stores through o could alias f) and G, NV the format's (nvfp4:
// 16, E4M3; mx: 32, UE8M0; G = 0: any g) so that the group loop is straight code: a group of
// 16 took ~60 instructions for its two steps of 14 otherwise.
template <int G, bool NV> __attribute__((target("avx2"))) inline void fp4_avx2_rows(const FpRows& f) {
  const DecodeTables& t = decode_tables();
  const __m256 mag = _mm256_loadu_ps(t.e2m1);  // codes 0..7: the magnitudes
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i low4 = _mm256_set1_epi32(15), sign = _mm256_set1_epi32((int)0x80000000u);
  const int g = G ? G : f.g;
  const int64_t rows = f.rows, ng = f.ng, dld = f.dld, sld = f.sld;
  float* o = f.o;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* d = f.d + r * dld;
    const uint8_t* sc = f.sc + r * sld;
    for (int64_t gi = 0; gi < ng; ++gi, d += g / 2, o += g) {
      const __m256 vf = _mm256_set1_ps(fp_group_factor(t, NV, sc[gi]));
      for (int i = 0; i < g; i += 8) {  // (g is 16 or 32)
        uint32_t w;
        memcpy(&w, d + i / 2, 4);
        const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), shifts), low4);
        const __m256 v = _mm256_or_ps(_mm256_permutevar8x32_ps(mag, c),
                                      _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c, 28), sign)));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(v, vf));
      }
    }
  }
}
__attribute__((target("avx2"))) void fp4_avx2(const FpRows& f) {
  if (f.nv) f.g == 16 ? fp4_avx2_rows<16, true>(f) : fp4_avx2_rows<0, true>(f);
  else f.g == 32 ? fp4_avx2_rows<32, false>(f) : fp4_avx2_rows<0, false>(f);
}
template <int G> __attribute__((target("avx2"))) inline void fp8_avx2_rows(const FpRows& f) {
  const DecodeTables& t = decode_tables();
  const int g = G ? G : f.g;
  const int64_t rows = f.rows, ng = f.ng, dld = f.dld, sld = f.sld;
  const float* lut = f.lut;
  const bool nv = f.nv;
  float* o = f.o;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* d = f.d + r * dld;
    const uint8_t* sc = f.sc + r * sld;
    for (int64_t gi = 0; gi < ng; ++gi, d += g, o += g) {
      const __m256 vf = _mm256_set1_ps(fp_group_factor(t, nv, sc[gi]));
      for (int i = 0; i < g; i += 8) {
        const __m256 v = _mm256_setr_ps(lut[d[i]], lut[d[i + 1]], lut[d[i + 2]], lut[d[i + 3]], lut[d[i + 4]],
                                        lut[d[i + 5]], lut[d[i + 6]], lut[d[i + 7]]);
        _mm256_storeu_ps(o + i, _mm256_mul_ps(v, vf));
      }
    }
  }
}
__attribute__((target("avx2"))) void fp8_avx2(const FpRows& f) {
  f.g == 32 ? fp8_avx2_rows<32>(f) : fp8_avx2_rows<0>(f);
}
#endif
const RowKernels& row_kernels() {
  static const RowKernels k = [] {
    RowKernels r{&affine_generic, &fp4_generic, &fp8_generic};
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) r.fp4 = &fp4_avx2, r.fp8 = &fp8_avx2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) r.affine = &affine_fma_x86;
#endif
    return r;
  }();
  return k;
}
}  // namespace

namespace {
// The fp rows' values: the kernel's products, then nvfp4's global factor (a second product).
void fp_rows(const FpRows& f, float gdec) {
  (f.lut ? row_kernels().fp8 : row_kernels().fp4)(f);
  if (f.nv && gdec != 1.0f)
    for (int64_t i = 0; i < f.rows * f.ng * f.g; ++i) f.o[i] = f.o[i] * gdec;
}
FpRows fp_rows_of(const QSpec& q, int64_t K, const uint8_t* data, const uint8_t* sc, float* out) {
  return FpRows{data, 0, sc, 0, 1, K / q.group, q.group, q.mode == QQ_MODE_NVFP4,
                q.bits == 4 ? nullptr : decode_tables().fp8[q.elem], out};
}
}  // namespace

void dequantize_row(const uint8_t* data, int64_t K, const QSpec& q, const uint8_t* sc, const float* scf,
                    const float* bif, float gdec, float* out) {
  if (q.fp()) fp_rows(fp_rows_of(q, K, data, sc, out), gdec);
  else row_kernels().affine(AffineRows{data, 0, scf, bif, 0, 0, 1, K / q.group, q.group, q.bits, out});
}

// ---- operands ------------------------------------------------------------------
// Gather the scales of groups [g0, g0 + ng) of row r of batch b (linear or blocked) into
// sc / scf / bif.
void gather_scales(const Mat& scales, const Mat* biases, bool blocked, int64_t b, int64_t r, int64_t g0, int64_t ng,
                   uint8_t* sc, float* scf, float* bif) {
  if (scales.dt == DType::U8) {
    if (blocked) {
      const uint8_t* base = scales.at<uint8_t>(b);
      const int64_t c4 = scales.cols;
      for (int64_t g = 0; g < ng; ++g) sc[g] = base[blocked_offset(r, g0 + g, c4)];
    } else {
      memcpy(sc, scales.at<uint8_t>(b, r) + g0, (size_t)ng);
    }
    return;
  }
  const int es = dtype_size(scales.dt);
  load_row((const char*)scales.ptr + (scales.offset(b) + r * scales.ld + g0) * es, scales.dt, ng, scf);
  const int eb = dtype_size(biases->dt);
  load_row((const char*)biases->ptr + (biases->offset(b) + r * biases->ld + g0) * eb, biases->dt, ng, bif);
}

void dequantize_block(const Mat& data, const Mat& scales, const Mat* biases, bool blocked, const QSpec& q,
                      float gdec, int64_t b, int64_t r0, int64_t rows, int64_t c0, int64_t n, float* out) {
  const int64_t ng = n / q.group, g0 = c0 / q.group;
  if (q.fp() && scales.dt == DType::U8 && !blocked && rows > 0) {
    // linear scale bytes: the rows in one call, their bytes read where they lie (a call and a
    // copy of the scales a row were ~2/3 of the dequantization of a [32, 32] nvfp4 weight)
    FpRows f = fp_rows_of(q, n, data.at<uint8_t>(b, r0) + c0 * q.bits / 8, scales.at<uint8_t>(b, r0) + g0, out);
    f.dld = data.ld;
    f.sld = scales.ld;
    f.rows = rows;
    fp_rows(f, gdec);
    return;
  }
  if (!q.fp() && scales.dt == DType::F32 && biases->dt == DType::F32 && rows > 0) {  // fp32 ones: the same
    row_kernels().affine(AffineRows{data.at<uint8_t>(b, r0) + c0 * q.bits / 8, data.ld, scales.at<float>(b, r0) + g0,
                                    biases->at<float>(b, r0) + g0, scales.ld, biases->ld, rows, ng, q.group, q.bits,
                                    out});
    return;
  }
  Scratch buf(2 * ng + (ng + 3) / 4);  // fp32 scales and biases, then the scale bytes
  float* scf = buf.data();
  float* bif = scf + ng;
  uint8_t* sc = (uint8_t*)(bif + ng);
  for (int64_t r = r0; r < r0 + rows; ++r) {
    gather_scales(scales, biases, blocked, b, r, g0, ng, sc, scf, bif);
    dequantize_row(data.at<uint8_t>(b, r) + c0 * q.bits / 8, n, q, sc, scf, bif, gdec, out + (r - r0) * n);
  }
}

void dequantize_rows(const Mat& data, const Mat& scales, const Mat* biases, bool blocked, const QSpec& q,
                     float gdec, int64_t b, int64_t r0, int64_t rows, int64_t K, float* out) {
  dequantize_block(data, scales, biases, blocked, q, gdec, b, r0, rows, 0, K, out);
}

// ---- quantize ------------------------------------------------------------------
namespace {
struct QuantizeJob {
  const QuantizeArgs* a;
  float enc;
};
void quantize_range(void* ctx, int64_t begin, int64_t end) {
  const QuantizeJob& j = *(const QuantizeJob*)ctx;
  const QuantizeArgs& a = *j.a;
  const int64_t K = a.x.cols, ng = K / a.q.group, M = a.x.rows;
  // row (K floats), the fp32 scales and biases (ng each) and the scale bytes (ng)
  Scratch buf(K + 2 * ng + (ng + 3) / 4);
  float* row = buf.data();
  float* scf = row + K;
  float* bif = scf + ng;
  uint8_t* sc = (uint8_t*)(bif + ng);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = i / M, r = i % M;
    load_row((const char*)a.x.ptr + (a.x.offset(b) + r * a.x.ld) * dtype_size(a.x.dt), a.x.dt, K, row);
    uint8_t* d = (uint8_t*)a.data.ptr + i * a.data.cols;
    quantize_row(row, K, a.q, j.enc, d, sc, scf, bif, a.x.dt);
    if (a.q.fp()) {
      if (a.q.blocked) {
        uint8_t* base = (uint8_t*)a.scales.ptr + b * a.scales.rows * a.scales.cols;
        for (int64_t g = 0; g < ng; ++g) base[blocked_offset(r, g, a.scales.cols)] = sc[g];
      } else {
        memcpy((uint8_t*)a.scales.ptr + i * ng, sc, (size_t)ng);
      }
    } else {
      store_row(scf, ng, a.x.dt, (char*)a.scales.ptr + i * ng * dtype_size(a.x.dt));
      store_row(bif, ng, a.x.dt, (char*)a.biases.ptr + i * ng * dtype_size(a.x.dt));
    }
  }
}
}  // namespace

qqStatus_t quantize(const QuantizeArgs& a) {
  if (a.gs_stride != 0)
    return set_error(QQ_STATUS_INTERNAL_ERROR, "quantize: a global scale per batch entry is a GPU-only internal form");
  if (a.q.blocked) {
    // Padding of the blocked layout is zero (docs/formats.md, Scale layouts): clear the
    // whole buffer first, then scatter the real scales.
    memset(a.scales.ptr, 0, (size_t)(a.x.batch() * a.scales.rows * a.scales.cols));
  }
  QuantizeJob j{&a, a.gs ? nvfp4_enc(*a.gs) : 1.0f};
  const int64_t n = a.x.batch() * a.x.rows;
  parallel_for(n, a.x.cols * 4, quantize_range, &j);
  return QQ_STATUS_SUCCESS;
}

void tile32_amax(const float* v, int64_t R, int64_t C, float* tamax) {
  std::fill(tamax, tamax + (R / 32) * (C / 32), 0.0f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      float& t = tamax[(r / 32) * (C / 32) + c / 32];
      t = nanmax_f(t, abs_f(v[r * C + c]));
    }
}

// ---- quantize along rows (x^T), MoE 3D ------------------------------------------
namespace {
struct ColJob {
  const ColwiseArgs* a;
  const float* xt;  // fp32 x^T of the current batch entry, [K, M]
  const float* tamax;  // 32x32 tile amaxes [K/32, M/32] or nullptr
  int64_t b;
  float enc;
};
void colwise_range(void* ctx, int64_t k0, int64_t k1) {
  const ColJob& j = *(const ColJob*)ctx;
  const ColwiseArgs& a = *j.a;
  const int64_t M = a.M, K = a.K, ng = M / a.q.group, b = j.b;
  std::vector<float> scf(ng), bif(ng);
  std::vector<uint8_t> sc(ng);
  for (int64_t k = k0; k < k1; ++k) {
    uint8_t* d = (uint8_t*)a.data_t.ptr + (b * K + k) * a.data_t.cols;
    quantize_row(j.xt + k * M, M, a.q, j.enc, d, sc.data(), scf.data(), bif.data(), a.x.dt,
                 j.tamax ? j.tamax + (k / 32) * ng : nullptr);
    if (!a.q.fp()) {
      const int es = dtype_size(a.x.dt);
      store_row(scf.data(), ng, a.x.dt, (char*)a.scales_t.ptr + (b * K + k) * ng * es);
      store_row(bif.data(), ng, a.x.dt, (char*)a.biases_t.ptr + (b * K + k) * ng * es);
      continue;
    }
    uint8_t* s = (uint8_t*)a.scales_t.ptr;
    for (int64_t g = 0; g < ng; ++g) {
      switch (a.scale_kind) {
        case COL_SCALE_T_LINEAR: s[(b * K + k) * ng + g] = sc[g]; break;
        case COL_SCALE_BLOCKED:
          s[b * a.scales_t.rows * a.scales_t.cols + blocked_offset(k, g, a.scales_t.cols)] = sc[g];
          break;
        default:  // COL_SCALE_D1_LINEAR
          if (!a.tile32) s[(b * ng + g) * K + k] = sc[g];
          else if (k % 32 == 0) s[(b * ng + g) * (K / 32) + k / 32] = sc[g];
      }
    }
  }
}
}  // namespace

qqStatus_t quantize_colwise(const ColwiseArgs& a) {
  if (a.rowwise) QQ_CPU_TRY(quantize(a.row));
  const int64_t M = a.M, K = a.K, nb = a.x.batch();
  if (a.scale_kind == COL_SCALE_BLOCKED)
    memset(a.scales_t.ptr, 0, (size_t)(nb * a.scales_t.rows * a.scales_t.cols));
  std::vector<float> xt(M * K), row(a.x.cols), tamax;
  for (int64_t b = 0; b < nb; ++b) {
    const int es = dtype_size(a.x.dt);
    for (int64_t r = 0; r < a.x.rows; ++r) {
      load_row((const char*)a.x.ptr + (a.x.offset(b) + r * a.x.ld) * es, a.x.dt, a.x.cols, row.data());
      if (a.x_colmajor) memcpy(&xt[r * M], row.data(), M * 4);  // physical row r is column k = r
      else
        for (int64_t k = 0; k < K; ++k) xt[k * M + r] = row[k];
    }
    if (a.tile32) {  // amax of each 32x32 tile: [K/32, M/32]
      tamax.resize((K / 32) * (M / 32));
      tile32_amax(xt.data(), K, M, tamax.data());
    }
    ColJob j{&a, xt.data(), a.tile32 ? tamax.data() : nullptr, b, a.gs ? nvfp4_enc(*a.gs) : 1.0f};
    parallel_for(K, M * 4, colwise_range, &j);
  }
  return QQ_STATUS_SUCCESS;
}

// ---- dequantize ----------------------------------------------------------------
namespace {
void dequantize_range(void* ctx, int64_t begin, int64_t end) {
  const DequantizeArgs& a = *(const DequantizeArgs*)ctx;
  const int64_t K = a.out.cols, M = a.data.rows;
  Scratch row(K);
  const float gdec = a.gs ? nvfp4_dec(*a.gs) : 1.0f;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = i / M, r = i % M;
    dequantize_rows(a.data, a.scales, &a.biases, a.q.blocked, a.q, gdec, b, r, 1, K, row.data());
    store_row(row.data(), K, a.out.dt, (char*)a.out.ptr + i * K * dtype_size(a.out.dt));
  }
}
}  // namespace

qqStatus_t dequantize(const DequantizeArgs& a) {
  parallel_for(a.data.batch() * a.data.rows, a.out.cols * 4, dequantize_range, (void*)&a);
  return QQ_STATUS_SUCCESS;
}

// ---- swizzle -------------------------------------------------------------------
qqStatus_t swizzle(const Mat& lin, const Mat& blk, bool to_blocked) {
  const int64_t nb = lin.batch(), R = lin.rows, C = lin.cols, c4 = blk.cols;
  const int64_t per = blk.rows * blk.cols;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* base = (uint8_t*)blk.ptr + b * per;
    if (to_blocked) {
      memset(base, 0, (size_t)per);
      for (int64_t r = 0; r < R; ++r) {
        const uint8_t* src = lin.at<uint8_t>(b, r);
        for (int64_t c = 0; c < C; ++c) base[blocked_offset(r, c, c4)] = src[c];
      }
    } else {
      for (int64_t r = 0; r < R; ++r) {
        uint8_t* dst = lin.at<uint8_t>(b, r);
        for (int64_t c = 0; c < C; ++c) dst[c] = base[blocked_offset(r, c, c4)];
      }
    }
  }
  return QQ_STATUS_SUCCESS;
}

// ---- amax ----------------------------------------------------------------------
qqStatus_t amax(const Mat& x, float* out) {
  float m = 0.0f;
  if (x.batch() == 0 || x.rows == 0 || x.cols == 0) {  // (an empty x's other extents may be huge)
    *out = m;
    return QQ_STATUS_SUCCESS;
  }
  std::vector<float> row(x.cols);
  for (int64_t b = 0; b < x.batch(); ++b)
    for (int64_t r = 0; r < x.rows; ++r) {
      load_row((const char*)x.ptr + (x.offset(b) + r * x.ld) * dtype_size(x.dt), x.dt, x.cols, row.data());
      for (int64_t i = 0; i < x.cols; ++i) m = nanmax_f(m, abs_f(row[i]));
    }
  *out = m;
  return QQ_STATUS_SUCCESS;
}

}  // namespace cpu
}  // namespace qq
