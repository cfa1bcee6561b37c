// cuda/qmma.cu - weight-only matmul on the tensor cores for small and medium M
// (M <= kQmmaMaxM), x in bf16, fp weights (nvfp4, mxfp4, mxfp8), transpose=True:
//   out[b, m, n] = alpha * sum_k x[b, m, k] * W[b][n, k] (+ bias[n])
// with alpha = the nvfp4 global factor of w (or the caller's device scalar).
//
// Why a second small-M kernel: qmv.cu's CUDA-core kernel spends ~13
// instructions per weight (decode to fp32, scale, one FMA per row of x) and
// measured instruction bound at M=1 (ncu, H100, 16384^2 nvfp4: SM 76 %, DRAM
// 29 %, 0.31 of copy bandwidth); for M = 16..64 its FMAs alone take longer
// than reading the weights. Here a weight costs about 3-4 instructions: two
// are decoded at once into a bf16 pair (shifts and masks), scaled with packed
// bf16 multiplies, and mma.sync m16n8k16 (bf16 in, fp32 accumulate) does the
// multiply-adds, 8 rows of x per instruction for the price of one. Measured:
// ~0.6 of copy bandwidth at M = 1 (16384^2, fp4 modes), bound by the integer
// ALU pipe (62 % of its peak: masks and shifts of the decode); streaming the
// weights through shared memory or in another layout did not help
// (bench/results/qmm-decode-h100-notes.md).
//
// Exactness: a decoded weight e * s is exact in bf16 (fp4 values have 2
// significant bits, e4m3 4, times a power of two or an E4M3 scale of 4 bits:
// at most 8 bits), and so is x, so every product is exact in fp32 and only
// the order of the fp32 sums differs from dequantize + matmul, as on the
// cuBLAS path. nvfp4's global factor (or alpha) multiplies each fp32 sum once
// instead of each weight: one extra rounding, inside the accumulation bound.
//
// Layout ("swap AB"): mma A = 16 weight rows x 16 k, B = 16 k x 8 rows of x.
// Lane (g = lane / 4, q = lane % 4) owns weight rows n0 + g and n0 + g + 8 and
// loads 16-byte chunk c = 4 * step + q of each, so a warp reads 64 contiguous
// bytes of each of 16 rows per step. The order of k inside an mma is free as
// long as A and B agree, so a lane's A registers are just the pairs its
// decoder yields - (e_j, e_j+4) of an fp4 word, (e_j, e_j+2) of an fp8 word -
// and its B registers the same pairs of x row m = 8t + g (one prmt each) from
// the matching bytes of x. Loads run kDepth steps ahead of the math (a ring
// of registers). A row tile's K is split over KS warps of the CTA, whose
// partial sums are added in shared memory in a fixed order: no atomics, the
// same result on every run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "../codec.h"
#include "../internal.h"
#include "common.cuh"
#include "ops.cuh"
#include "qdq.cuh"
#include "vec.cuh"

namespace qq {
namespace cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;

// Formats: the fp modes, and affine 4 / 8 bits whose step (4 chunks of a row:
// 128 / 64 codes) holds 1 or 2 scale groups (G1: group_size 128 (4-bit) or
// 64 / 128 (8-bit); G2: 64 (4-bit), 32 (8-bit)).
enum QF { QNV4 = 0, QMX4 = 1, QMX8 = 2, QA4G1 = 3, QA4G2 = 4, QA8G1 = 5, QA8G2 = 6 };
constexpr bool is_aff(int F) { return F >= QA4G1; }
constexpr bool bytes8(int F) { return F == QMX8 || F == QA8G1 || F == QA8G2; }  // a code per byte
constexpr int aff_groups(int F) { return F == QA4G2 || F == QA8G2 ? 2 : 1; }

// Steps of loads in flight per warp: 4, or 2 where the accumulators of 32 or
// 64 rows of x need the registers (the kernel must fit 2 CTAs per SM: 128).
// Affine at 16 rows of x holds its group partials and x sums besides: 2.
template <int F, int MT> constexpr int depth() { return MT <= 8 || (MT <= 16 && !is_aff(F)) ? 4 : 2; }

struct QL {
  int64_t C;     // 16-byte chunks per weight row
  int KS, logKS; // warps (k-slices) per row tile
  int M;
  // fp8 element decode (E4M3 / E5M2), as qmv.cu's fp8x4 but into bf16 pairs
  int f8_kind;
  uint32_t f8_shl, f8_shr, f8_mag, f8_nan_mask, f8_nan_add;
  uint32_t fix2;  // bf16x2 of 2^fix, the power of two that undoes the decoders' placement
  int fix;        // 126 (fp4), 120 (E4M3), 112 (E5M2)
  uint32_t f4_mul[2];  // 65 << 6, 65 << 2 (fp4_pairs)
  int lgs;             // affine: log2(group_size)
  uint32_t ngroups;    // affine: groups per row (K / group_size)
};

// One step's loads of a lane: its chunk of rows g and g + 8 and their scale bytes
// (row g in bits 0..15, row g + 8 in 16..31; nvfp4 has two per row).
struct Ld {
  uint4 d[2];
  uint32_t s;
  // affine: bf16 scales of the step's groups h = 0, 1 (sb[h]) and biases (sb[2 + h]),
  // row g in bits 0..15, row g + 8 in 16..31
  uint32_t sb[4];
};

// x's B registers matching the decoders' pairs: fp8 / 8-bit word i of w <->
// x elements 4i..4i+3 (x words 2i, 2i+1 of a 16-element unit): (x0, x2), (x1,
// x3); fp4 / 4-bit word i <-> the 8 elements of xv (one uint4): (x_j, x_j+4).
__device__ __forceinline__ void x_pairs8(const uint4 (&xv)[4], int i, uint32_t& b0, uint32_t& b1) {
  const uint4 v = xv[i >> 1];
  const uint32_t lo = i & 1 ? v.z : v.x, hi = i & 1 ? v.w : v.y;
  b0 = prmt(lo, hi, 0x5410u);
  b1 = prmt(lo, hi, 0x7632u);
}
__device__ __forceinline__ void x_pairs4(const uint4& v, uint32_t& b0, uint32_t& b1, uint32_t& b2, uint32_t& b3) {
  b0 = prmt(v.x, v.z, 0x5410u);
  b1 = prmt(v.x, v.z, 0x7632u);
  b2 = prmt(v.y, v.w, 0x5410u);
  b3 = prmt(v.y, v.w, 0x7632u);
}

// Scale factors as bf16x2 (both halves equal). UE8M0 u is 2^(u-127); times
// 2^fix it is the bf16 with exponent field u + fix (valid while u + fix <=
// 254; the caller checks). Without the 2^fix: exponent field u, except u = 0
// (2^-127, a bf16 subnormal) and u = 255 (NaN).
__device__ __forceinline__ uint32_t ue8m0_fix_bf2(uint32_t u, int fix) { return dup16((u + fix) << 7); }
__device__ __forceinline__ uint32_t ue8m0_bf2(uint32_t u) {
  return dup16(u == 0 ? 0x0040u : (u == 255 ? 0x7fc0u : u << 7));
}
// E4M3 scale s -> bf16x2 of s * 2^117 (exact: 4 significant bits, at most
// 448 * 2^117 < 2^127); 0x7F / 0xFF are NaN. The 2^117 with the fp4
// decoder's 2^-126 leaves products 2^-9 too small, which the epilogue undoes.
__device__ __forceinline__ uint32_t e4m3_fix_bf2(uint32_t b) {
  const float f = e4m3_decode_bits(b) * 0x1p117f;  // NaN stays NaN
  return dup16(f_to_bf16(f));
}

// Two E4M3 scales (bytes of `pair`, low byte first) -> bf16x2 of s * 2^117
// each (both halves equal), as e4m3_fix_bf2 but in 7 instructions on sm_89+:
// the hardware's e4m3x2 -> f16x2 conversion (exact, every code: zero,
// subnormals, NaN), then fp32 (exact) times 2^117 and one packing
// conversion that duplicates the value (exact: 4 significant bits).
__device__ __forceinline__ void e4m3x2_fix_bf2(uint32_t pair, uint32_t& s0, uint32_t& s1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 p, lo, hi;\n .reg .b32 h;\n .reg .f32 f0, f1;\n"
      " cvt.u16.u32 p, %2;\n"
      " cvt.rn.f16x2.e4m3x2 h, p;\n"
      " mov.b32 {lo, hi}, h;\n"
      " cvt.f32.f16 f0, lo;\n cvt.f32.f16 f1, hi;\n"
      " mul.f32 f0, f0, 0f7A000000;\n mul.f32 f1, f1, 0f7A000000;\n"  // 2^117
      " cvt.rn.bf16x2.f32 %0, f0, f0;\n cvt.rn.bf16x2.f32 %1, f1, f1;\n}"
      : "=r"(s0), "=r"(s1)
      : "r"(pair));
#else
  s0 = e4m3_fix_bf2(pair & 0xffu);
  s1 = e4m3_fix_bf2((pair >> 8) & 0xffu);
#endif
}

// fp8 word (4 codes) -> pairs (e0, e2), (e1, e3) times the scale, exact in
// bf16: the decoder's placement gives e * 2^-fix, then one multiply by S =
// s * 2^fix (kTwo = false) or two, by 2^fix and by S = s (kTwo, when s * 2^fix
// would overflow). Not for codes with an all-ones exponent (fp8_special).
template <bool kTwo>
__device__ __forceinline__ void fp8_pairs(uint32_t w, const QL& L, uint32_t S, uint32_t& p0, uint32_t& p1) {
  fp8_place(w, L.f8_shl, L.f8_shr, L.f8_mag, p0, p1);
  if (kTwo) {
    p0 = bmul(p0, L.fix2);
    p1 = bmul(p1, L.fix2);
  }
  p0 = bmul(p0, S);
  p1 = bmul(p1, S);
}
// The same pairs through the codec (any code), with the UE8M0 scale byte u; element kind
// `kind`. Returned by value: out of line, a result written through references into the
// caller's A array would put that array in local memory on every path (it did: four
// 16-byte local stores and six loads before each step's mma on the common path too).
__device__ __noinline__ uint2 fp8_pairs_codec(uint32_t w, int kind, uint32_t u) {
  const float s = ue8m0_decode((uint8_t)u);
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = elem_decode(kind, (uint8_t)(w >> (8 * i))) * s;
  return make_uint2((uint32_t)f_to_bf16(v[0]) | ((uint32_t)f_to_bf16(v[2]) << 16),
                    (uint32_t)f_to_bf16(v[1]) | ((uint32_t)f_to_bf16(v[3]) << 16));
}

// One step of one lane: decode its 16-byte chunks of weight rows g and g + 8
// (l.d, scale bytes l.s), multiply by the matching elements of x and
// accumulate. xload(t, xv) fills x row 8t + g's elements of this chunk (fp4: 4
// units of 8 bf16 = 32 elements, fp8: 2 units = 16), zeros for rows past M.
// Decoded weights: A[r][i] = pair i of row g + 8r, times its scale. kTwo: two
// bf16 multiplies per pair (by 2^fix, then by s), needed only when a UE8M0
// scale times 2^fix would overflow (u > 254 - fix, or NaN); the warp takes
// the one-multiply form when all its lanes can.
template <int F, int NT, int NA, typename XLoad>
__device__ __forceinline__ void step_mma(const Ld& l, const QL& L, float (&acc)[NA][4], XLoad&& xload) {
  const uint32_t u0 = l.s & 0xffu, u1 = (l.s >> 16) & 0xffu;
  bool two = false;
  if constexpr (F != QNV4) two = !__all_sync(0xffffffffu, (u0 > u1 ? u0 : u1) <= (uint32_t)(254 - L.fix));
  if constexpr (F == QMX8) {
    // 16 elements per row: words 0..3 -> pairs (2 per word); mma i takes word i
    uint32_t A[2][8];
    auto decode = [&](auto kTwo) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t u = r ? u1 : u0;
        const uint32_t S = decltype(kTwo)::value ? ue8m0_bf2(u) : ue8m0_fix_bf2(u, L.fix);
        const uint32_t w4[4] = {l.d[r].x, l.d[r].y, l.d[r].z, l.d[r].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) fp8_pairs<decltype(kTwo)::value>(w4[i], L, S, A[r][2 * i], A[r][2 * i + 1]);
      }
    };
    // one test per step for NaN / Inf codes (rare: they take the codec)
    auto sp = [&](uint32_t w) { return fp8_special(w, L.f8_nan_mask, L.f8_nan_add); };
    const uint32_t special = sp(l.d[0].x) | sp(l.d[0].y) | sp(l.d[0].z) | sp(l.d[0].w) | sp(l.d[1].x) |
                             sp(l.d[1].y) | sp(l.d[1].z) | sp(l.d[1].w);
    if (special) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t w4[4] = {l.d[r].x, l.d[r].y, l.d[r].z, l.d[r].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint2 pr = fp8_pairs_codec(w4[i], L.f8_kind, r ? u1 : u0);
          A[r][2 * i] = pr.x;
          A[r][2 * i + 1] = pr.y;
        }
      }
    } else if (two) {
      decode(std::true_type{});
    } else {
      decode(std::false_type{});
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      uint4 xv[4];
      xload(t, xv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t b0, b1;
        x_pairs8(xv, i, b0, b1);
        mma16816(acc[NT == 1 ? (i & 1) : t], A[0][2 * i], A[1][2 * i], A[0][2 * i + 1], A[1][2 * i + 1], b0, b1);
      }
    }
  } else {
    // 32 fp4 elements per row: words 0..3, 4 pairs each; mma i takes pairs 2i, 2i+1
    uint32_t S[2][2];  // [row r][group]: nvfp4 words 0-1 have group 2c, words 2-3 group 2c+1
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (F == QNV4) {
        e4m3x2_fix_bf2(l.s >> (16 * r), S[r][0], S[r][1]);
      } else {
        const uint32_t u = r ? u1 : u0;
        S[r][0] = S[r][1] = two ? ue8m0_bf2(u) : ue8m0_fix_bf2(u, 126);
      }
    }
    // Word i of rows g, g + 8 -> A registers a[r][j] = pair j (e_j, e_j+4) times its scale.
    auto decode = [&](int i, uint32_t (&a)[2][4]) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t w = i == 0 ? l.d[r].x : (i == 1 ? l.d[r].y : (i == 2 ? l.d[r].z : l.d[r].w));
        uint32_t p[4];
        fp4_pairs(w, L.f4_mul, p);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (F != QNV4 && two) p[j] = bmul(p[j], 0x7e807e80u);  // 2^126
          a[r][j] = bmul(p[j], S[r][i >> 1]);
        }
      }
    };
    // word i of w <-> x[8i .. 8i+8); pair j = (x_j, x_j+4)
    auto mma_word = [&](int t, const uint32_t (&a)[2][4], uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
      mma16816(acc[NT == 1 ? 0 : t], a[0][0], a[1][0], a[0][1], a[1][1], b0, b1);
      mma16816(acc[NT == 1 ? 1 : t], a[0][2], a[1][2], a[0][3], a[1][3], b2, b3);
    };
    uint32_t A[4][2][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) decode(i, A[i]);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      uint4 xv[4];
      xload(t, xv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t b0, b1, b2, b3;
        x_pairs4(xv[i], b0, b1, b2, b3);
        mma_word(t, A[i], b0, b1, b2, b3);
      }
    }
  }
}

// Affine weights (w = s * c + b per group, c the 4- or 8-bit code): the codes go
// into the mma exactly - a code's bits at the bottom of a bf16 are the
// subnormal c * 2^-133, and one bf16 multiply by 2^126 makes it c * 2^-7 -
// and the group's scale and bias are applied to fp32 partial sums:
//   sum_k x_k (s c_k + b) = s * sum_k x_k c_k + b * sum_k x_k,
// the sums of x coming from one more mma with ones for A. An mma's 16 k take 4
// from each lane of a row (q = 0..3), so every mma must see one group on all
// 4 lanes: where a step holds 2 groups (G2), a lane loads 8 bytes of each
// group (bytes 8q.. of its 32) instead of one 16-byte chunk, words 0-1 of l.d
// being group 0's and words 2-3 group 1's, and x is read to match. Only the
// order of the fp32 sums and the factoring differ from the CPU backend.
// Returns false, having changed nothing, when a scale or bias of the step or
// an element of x is Inf / NaN: s * sum(x c) + b * sum(x) is not sum(x * (s c +
// b)) there (0 * Inf, Inf - Inf); the warp then redoes its whole row tile with
// aff_exact_warp after the main loop.
__device__ __forceinline__ float bf_lo(uint32_t v) { return bf16_to_f((uint16_t)v); }
__device__ __forceinline__ float bf_hi(uint32_t v) { return bf16_to_f((uint16_t)(v >> 16)); }

template <int F, int NT, typename XLoad>
__device__ __forceinline__ bool step_aff(const Ld& l, float (&acc)[NT][4], XLoad&& xload) {
  constexpr int G = aff_groups(F);
  uint32_t special = 0;  // a bf16 exponent of all ones (Inf / NaN) in either half
#pragma unroll
  for (int h = 0; h < G; ++h)
    special |= (((l.sb[h] & 0x7f807f80u) + 0x00800080u) | ((l.sb[2 + h] & 0x7f807f80u) + 0x00800080u)) & 0x80008000u;
  if (__any_sync(0xffffffffu, special)) return false;
  constexpr uint32_t kOnes = 0x3f803f80u, k126 = 0x7e807e80u;
  float tmp[G][NT][4], xs[G][NT][4];
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) tmp[h][t][i] = xs[h][t][i] = 0.0f;
  // word i of l.d belongs to group (G == 2 ? i / 2 : 0). Its codes as bf16 pairs
  // times 2^126: 4-bit pairs j = (c_j, c_j+4) (the fp4 order), 8-bit (c0, c2),
  // (c1, c3) (the fp8 order).
  constexpr int NP = bytes8(F) ? 2 : 4;
  uint32_t P[4][2][NP];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t w = i == 0 ? l.d[r].x : (i == 1 ? l.d[r].y : (i == 2 ? l.d[r].z : l.d[r].w));
#pragma unroll
      for (int j = 0; j < NP; ++j)
        P[i][r][j] = bmul((w >> (NP == 4 ? 4 * j : 8 * j)) & (NP == 4 ? 0x000f000fu : 0x00ff00ffu), k126);
    }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    uint4 xv[4];
    xload(t, xv);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = G == 2 ? i >> 1 : 0;
      if constexpr (bytes8(F)) {
        uint32_t b0, b1;
        x_pairs8(xv, i, b0, b1);
        mma16816(tmp[h][t], P[i][0][0], P[i][1][0], P[i][0][1], P[i][1][1], b0, b1);
        mma16816(xs[h][t], kOnes, kOnes, kOnes, kOnes, b0, b1);
      } else {
        uint32_t b[4];
        x_pairs4(xv[i], b[0], b[1], b[2], b[3]);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          mma16816(tmp[h][t], P[i][0][2 * u], P[i][1][2 * u], P[i][0][2 * u + 1], P[i][1][2 * u + 1], b[2 * u],
                   b[2 * u + 1]);
          mma16816(xs[h][t], kOnes, kOnes, kOnes, kOnes, b[2 * u], b[2 * u + 1]);
        }
      }
    }
  }
  // An Inf / NaN in x (or sums of x past fp32's range) breaks the factoring as an
  // Inf scale does (Inf * 0 where the weight is b, Inf - Inf): x's sums tell, and the
  // warp then redoes the tile weight by weight, acc untouched so far.
  bool xbad = false;
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 2; ++i) xbad |= !isfinite(xs[h][t][i]);
  if (__any_sync(0xffffffffu, xbad)) return false;
  // acc[t][0..1]: row g, x rows 8t + 2q + {0, 1}; [2..3]: row g + 8. tmp holds
  // sums of x * c * 2^-7: the scale gets the 2^7 (exact).
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float s0 = bf_lo(l.sb[h]) * 128.0f, s1 = bf_hi(l.sb[h]) * 128.0f;
      const float c0 = bf_lo(l.sb[2 + h]), c1 = bf_hi(l.sb[2 + h]);
      const float x0 = xs[h][t][0], x1 = xs[h][t][1];
      acc[t][0] = fmaf(c0, x0, fmaf(s0, tmp[h][t][0], acc[t][0]));
      acc[t][1] = fmaf(c0, x1, fmaf(s0, tmp[h][t][1], acc[t][1]));
      acc[t][2] = fmaf(c1, x0, fmaf(s1, tmp[h][t][2], acc[t][2]));
      acc[t][3] = fmaf(c1, x1, fmaf(s1, tmp[h][t][3], acc[t][3]));
    }
  return true;
}

// A warp's whole row tile weight by weight, for tiles where step_aff met a
// non-finite scale, bias or x (rare; after the main loop, whose registers are
// dead by then, and with its loops kept rolled): w = fma(c, s, b) (codec.h's
// affine_decode, as dequantize) times x in fp32, the 4 lanes of a row summed
// by shuffles, returned in acc's layout.
template <int NT>
struct AffPart {
  float v[NT][4];
};
struct AffRows {
  const uint8_t* w[2];       // weight rows g, g + 8
  const uint16_t* sb[2][2];  // [row][scales, biases]
  const __nv_bfloat16* x[16];  // the tile's rows of x (affine: M <= 16)
  int rows;                    // how many
  uint32_t cfirst, cstep, climit;
  int nsteps, q;
};
template <int F, int NT>
__device__ __forceinline__ AffPart<NT> aff_exact_warp(const AffRows R, const QL L) {
  constexpr int G = aff_groups(F), kCodes = bytes8(F) ? 16 : 32;
  const int q = R.q, hl = G == 2 ? (q >> 1) : 0;
  float part[2][8 * NT];  // this lane's chunks' share of (row g + 8r, x row m)
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int m = 0; m < 8 * NT; ++m) part[r][m] = 0.0f;
#pragma unroll 1
  for (int step = 0; step < R.nsteps; ++step) {
    const uint32_t c = R.cfirst + (uint32_t)step * R.cstep;
    const uint32_t gi = (((c - q) * (uint32_t)kCodes) >> L.lgs) + hl;  // this lane's group
    if (c >= R.climit || gi >= L.ngroups) continue;
    float s[2], b[2];
    uint32_t w[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      s[r] = bf16_to_f(__ldg(R.sb[r][0] + gi));
      b[r] = bf16_to_f(__ldg(R.sb[r][1] + gi));
      const uint4 d = __ldg(reinterpret_cast<const uint4*>(R.w[r] + (size_t)c * 16));
      w[r][0] = d.x, w[r][1] = d.y, w[r][2] = d.z, w[r][3] = d.w;
    }
#pragma unroll 1
    for (int m = 0; m < R.rows; ++m) {
      const __nv_bfloat16* xr = R.x[m] + (size_t)c * kCodes;
#pragma unroll 1
      for (int e = 0; e < kCodes; ++e) {
        const float xe = __bfloat162float(xr[e]);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t code = bytes8(F) ? (w[r][e >> 2] >> (8 * (e & 3))) & 0xffu
                                          : (w[r][e >> 3] >> (4 * (e & 7))) & 0xfu;
          part[r][m] = fmaf(xe, affine_decode(code, s[r], b[r]), part[r][m]);
        }
      }
    }
  }
  // the row's 4 lanes (q = 0..3) summed; lane q keeps x rows 8t + 2q + {0, 1}
  AffPart<NT> out;
#pragma unroll
  for (int m = 0; m < 8 * NT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float v = part[r][m];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (((m & 7) >> 1) == q) out.v[m >> 3][2 * r + (m & 1)] = v;
    }
  return out;
}

// gather_qmm with its batch entries grouped by expert (kSorted): a work item is then a
// tile of MT rows of one expert (GPlan, ops.cuh) instead of one batch entry.

// kQX (qqmm, ops.cuh QX): x is X.x in any float dtype, quantized by this CTA into its
// dynamic shared memory before the main loop; the x loads of the steps read it there.
template <int F, int MT, bool kSorted, bool kQX = false>
__global__ void __launch_bounds__(kThreads, 2) qmma_kernel(const MatmulArgs a, const QL L, const float* alpha,
                                                           const GPlan G, const QX X) {
  static_assert(!kQX || (!kSorted && !is_aff(F)), "x quantized in the launch: fp formats, one work item");
  extern __shared__ __align__(16) unsigned char qx_smem[];
  constexpr int NT = MT / 8;  // n8 tiles of x rows
  constexpr int kDepth = depth<F, MT>();
  // M <= 8: two accumulators taken in turn, so that consecutive mmas do not
  // wait on each other (an mma's result is ~30 cycles away; affine's steps
  // interleave their group and x-sum accumulators instead)
  constexpr int NA = NT == 1 && !is_aff(F) ? 2 : NT;
  __shared__ float red[kWarps][16 * MT];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int ks = warp & (L.KS - 1);
  const int64_t tile = (int64_t)blockIdx.x * (kWarps >> L.logKS) + (warp >> L.logKS);
  const int64_t N = a.N, C = L.C;
  const int64_t groups4 = (C + 3) / 4;  // steps of the whole row
  const int nsteps = (int)(groups4 > ks ? (groups4 - ks + L.KS - 1) / L.KS : 0);
  // qqmm's small-M route leaves alpha to this kernel: x's global scale (gs_x, set only
  // there) and w's, as nvfp4_alpha (1 for a missing one; quantized_matmul: w's alone)
  const float post = alpha ? *alpha : (F == QNV4 ? nvfp4_alpha(a.gs_x, a.gs_w) : 1.0f);

  const int64_t items = kSorted ? (int64_t)*G.ntiles : a.out.batch();
  for (int64_t b = blockIdx.y; b < items; b += gridDim.y) {
    // The work item's rows of x and out: batch entry b's M rows, or (kSorted) rows
    // row0 .. row0 + mrows of expert tile_seg[b], row r being row r % M of entry
    // perm[seg_start + r / M].
    int64_t we;
    int mrows = L.M, row0 = 0;
    const int32_t* ents = nullptr;
    if constexpr (kSorted) {
      const int e = G.tile_seg[b], s0 = G.seg_start[e];
      ents = G.perm + s0;
      row0 = G.tile_row0[b];
      const int left = (G.seg_start[e + 1] - s0) * L.M - row0;
      mrows = left < MT ? left : MT;
      we = e < G.E ? e : -1;
    } else {
      we = weight_entry(a, b);
    }
    // the row's batch entry and row within it
    auto entry_of = [&](int r, int& m) -> int64_t {
      if constexpr (kSorted) {
        const int gr = row0 + r;
        m = gr % L.M;
        return ents[gr / L.M];
      } else {
        m = r;
        return b;
      }
    };
    auto x_row = [&](int r) {
      int m;
      const int64_t eb = entry_of(r, m);
      return (const __nv_bfloat16*)a.x.ptr + a.x.offset(eb) + (int64_t)m * a.x.ld;
    };
    // the weight entry (gather_qmm: the expert of b's index; out of range: NaN rows)
    const int64_t wb = we < 0 ? 0 : we;
    const float postb = we < 0 ? __int_as_float(0x7fc00000) : post;
    const uint8_t* wrow[2];
    const uint8_t* srow[2];
    const uint16_t* arow[2][2];  // affine: [row][scales, biases]
    int64_t nr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t n0 = tile * 16 + g + 8 * r;
      nr[r] = n0 < N ? n0 : N - 1;  // rows past N load row N-1 and store nothing
      wrow[r] = (const uint8_t*)a.w.ptr + a.w.offset(wb) + nr[r] * a.w.ld;
      const int64_t n = nr[r];
      srow[r] = (const uint8_t*)a.w_scales.ptr + a.w_scales.offset(wb) +
                (a.w_blocked ? (n >> 7) * 128 * a.w_scales.cols + (n & 31) * 16 + ((n & 127) >> 5) * 4
                             : n * a.w_scales.ld);
      if constexpr (is_aff(F)) {  // bf16 scales and biases, linear
        arow[r][0] = (const uint16_t*)a.w_scales.ptr + a.w_scales.offset(wb) + n * a.w_scales.ld;
        arow[r][1] = (const uint16_t*)a.w_biases.ptr + a.w_biases.offset(wb) + n * a.w_biases.ld;
      }
    }
    const __nv_bfloat16* xb = (const __nv_bfloat16*)a.x.ptr + a.x.offset(b);  // (not kSorted)

    // 32-bit chunk indices (C < 2^31, checked at launch): a step's addresses
    // cost a multiply-add each instead of 64-bit index arithmetic.
    const uint32_t cfirst = (uint32_t)(ks * 4 + q), cstep = (uint32_t)L.KS * 4, climit = (uint32_t)C;
    auto chunk_of = [&](int step) { return cfirst + (uint32_t)step * cstep; };
    auto soff = [&](uint32_t idx) -> uint32_t { return a.w_blocked ? (idx >> 2) * 512 + (idx & 3) : idx; };
    auto load = [&](int step, Ld& l) {
      const uint32_t c = chunk_of(step);
      if constexpr (is_aff(F)) {
        // every lane applies the scales and biases of all the step's groups to its
        // rows (groups past the row, in a ragged last step: zeros)
        const uint32_t gi0 = ((c - q) * (bytes8(F) ? 16u : 32u)) >> L.lgs;  // c - q: the step's first chunk
#pragma unroll
        for (int h = 0; h < aff_groups(F); ++h) {
          const uint32_t gi = gi0 + h;
          const bool in = gi < L.ngroups;
#pragma unroll
          for (int v = 0; v < 2; ++v)
            l.sb[2 * v + h] = in ? (uint32_t)__ldg(arow[0][v] + gi) | ((uint32_t)__ldg(arow[1][v] + gi) << 16) : 0u;
        }
        if constexpr (aff_groups(F) == 2) {  // 8 bytes of each group: bytes 8q.. of its 32
          uint2 v[2][2];
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              v[r][h] = gi0 + h < L.ngroups ? ld_stream8(wrow[r] + (size_t)(c - q) * 16 + 32 * h + 8 * q)
                                            : make_uint2(0, 0);
#pragma unroll
          for (int r = 0; r < 2; ++r) l.d[r] = make_uint4(v[r][0].x, v[r][0].y, v[r][1].x, v[r][1].y);
          return;
        }
      }
      if (c >= climit) {  // past the row (ragged last step): zeros with a finite scale
        l.d[0] = l.d[1] = make_uint4(0, 0, 0, 0);
        l.s = F == QNV4 ? 0x38383838u : 0x7f7f7f7fu;  // 1.0 in E4M3 / UE8M0
        return;
      }
      l.d[0] = ld_stream(wrow[0] + (size_t)c * 16);
      l.d[1] = ld_stream(wrow[1] + (size_t)c * 16);
      if constexpr (F == QNV4) {
        // groups 2c and 2c + 1: adjacent bytes at an even offset in both layouts (rows hold K / 16 bytes, K a
        // multiple of 32 here; blocked rows are 4-byte groups), so one 16-bit load per row
        const uint32_t i0 = soff(2 * c);
        l.s = (uint32_t)__ldg(reinterpret_cast<const uint16_t*>(srow[0] + i0)) |
              ((uint32_t)__ldg(reinterpret_cast<const uint16_t*>(srow[1] + i0)) << 16);
      } else if constexpr (!is_aff(F)) {
        const uint32_t i = soff(F == QMX4 ? c : c >> 1);
        l.s = (uint32_t)__ldg(srow[0] + i) | ((uint32_t)__ldg(srow[1] + i) << 16);
      }
    };
    const __nv_bfloat16* xg = xb + g * a.x.ld;  // x row g; tile t adds 8t rows
    const size_t xld8 = (size_t)a.x.ld * 8;
    // kSorted: the tile's rows of x, gathered, as a table in shared memory read once a
    // step (MT / 8 pointers in each lane's registers would spill the 32-row tiles). Written
    // after the previous item's last __syncthreads, read after this one.
    __shared__ const __nv_bfloat16* xtab[kSorted ? MT : 1];
    if constexpr (kSorted) {
      if (tid < MT) xtab[tid] = tid < mrows ? x_row(tid) : nullptr;  // (rows past mrows: never read)
      __syncthreads();
    }
    auto xrow_t = [&](int t) {
      if constexpr (kQX) return (const __nv_bfloat16*)qx_smem + (8 * t + g) * X.pitch;
      else if constexpr (kSorted) return xtab[8 * t + g];
      else return xg + t * xld8;
    };
    // x's 16-byte pieces: global memory through the read-only path, or q(x) in shared memory
    auto ldx = [](const uint4* p) {
      if constexpr (kQX) return *p;
      else return __ldg(p);
    };

    float acc[NA][4];
    bool aff_special = false;  // affine: a step met an Inf / NaN scale, bias or x
#pragma unroll
    for (int t = 0; t < NA; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;

    auto compute = [&](int step, const Ld& l) {
      const uint32_t c = chunk_of(step);
      const bool valid = c < climit;
      auto xload = [&](int t, uint4 (&xv)[4]) {
        const int m = 8 * t + g;
#pragma unroll
        for (int i = 0; i < 4; ++i) xv[i] = make_uint4(0, 0, 0, 0);
        if constexpr (aff_groups(F) == 2) {  // the x of load()'s two 8-byte pieces
          const uint32_t c0 = c - q, gi0 = (c0 * (bytes8(F) ? 16u : 32u)) >> L.lgs;
          if (m < mrows) {
            const __nv_bfloat16* xr = xrow_t(t);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (gi0 + h >= L.ngroups) continue;
              if constexpr (bytes8(F)) {  // 8 codes: x[c0*16 + 32h + 8q ..]
                xv[h] = __ldg(reinterpret_cast<const uint4*>(xr + (size_t)c0 * 16 + 32 * h + 8 * q));
              } else {                    // 16 codes: x[c0*32 + 64h + 16q ..]
                const uint4* xp = reinterpret_cast<const uint4*>(xr + (size_t)c0 * 32 + 64 * h + 16 * q);
                xv[2 * h] = __ldg(xp);
                xv[2 * h + 1] = __ldg(xp + 1);
              }
            }
          }
          return;
        }
        if (valid && m < mrows) {
          const uint4* xp = reinterpret_cast<const uint4*>(xrow_t(t) + (size_t)c * (bytes8(F) ? 16 : 32));
#pragma unroll
          for (int i = 0; i < (bytes8(F) ? 2 : 4); ++i) xv[i] = ldx(xp + i);
        }
      };
      if constexpr (is_aff(F)) {
        if (!step_aff<F, NT>(l, acc, xload)) aff_special = true;  // warp-uniform
      } else {
        step_mma<F, NT, NA>(l, L, acc, xload);
      }
    };

    // -- the pipeline: kDepth steps of loads in flight --
    Ld ring[kDepth];
#pragma unroll
    for (int p = 0; p < kDepth; ++p)
      if (p < nsteps) load(p, ring[p]);
    if constexpr (kQX) {  // while the first steps' weights are in flight
      qx_rows_to_smem<F == QNV4 ? 16 : 32>(X, (__nv_bfloat16*)qx_smem, a.K);
      __syncthreads();
    }
    for (int s0 = 0; s0 < nsteps; s0 += kDepth) {
#pragma unroll
      for (int p = 0; p < kDepth; ++p) {
        const int s = s0 + p;
        if (s < nsteps) {
          compute(s, ring[p]);
          if (s + kDepth < nsteps) load(s + kDepth, ring[p]);
        }
      }
    }

    if constexpr (NA != NT) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][i] += acc[NA - 1][i];
    }
    if constexpr (is_aff(F)) {
      if (aff_special) {  // the whole row tile again, weight by weight (aff_exact_warp)
        AffRows R;
        R.w[0] = wrow[0], R.w[1] = wrow[1];
        R.sb[0][0] = arow[0][0], R.sb[0][1] = arow[0][1], R.sb[1][0] = arow[1][0], R.sb[1][1] = arow[1][1];
        R.rows = mrows;
#pragma unroll 1
        for (int m = 0; m < mrows; ++m) R.x[m] = x_row(m);
        R.cfirst = cfirst, R.cstep = cstep, R.climit = climit, R.nsteps = nsteps, R.q = q;
        const AffPart<NT> p = aff_exact_warp<F, NT>(R, L);
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[t][i] = p.v[t][i];
      }
    }
    // -- add the KS k-slices of each row tile in a fixed order --
    // acc[t][0..1]: row g, x rows 8t + 2q + {0, 1}; acc[t][2..3]: row g + 8.
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][(g + 8 * (i >> 1)) * MT + 8 * t + 2 * q + (i & 1)] = acc[t][i];
    __syncthreads();
    const int tiles = kWarps >> L.logKS;
    for (int e = tid; e < tiles * 16 * mrows; e += kThreads) {
      const int tl = e / (16 * mrows), rm = e % (16 * mrows), rl = rm / mrows, m = rm % mrows;
      const int64_t n = ((int64_t)blockIdx.x * tiles + tl) * 16 + rl;
      if (n >= N) continue;
      float v = red[tl * L.KS][rl * MT + m];
      for (int k = 1; k < L.KS; ++k) v += red[tl * L.KS + k][rl * MT + m];
      if (F == QNV4) v *= 512.0f;  // the 2^-9 of e4m3_fix_bf2 (exact)
      int mo;
      const int64_t eo = entry_of(m, mo);
      store_out(a, eo, mo, n, v * postb);
    }
    __syncthreads();  // red is reused by the next batch entry
  }
}

// gather_qmm's work items (GPlan), built on the device by one CTA from the indices:
// a count per expert, a prefix sum, the entries scattered into perm (their order within
// an expert is free: a row's sums do not depend on the rows beside it in a tile), then
// the tiles of MT rows of every expert. Shared memory: 3 * (E + 1) ints.
constexpr int kPlanThreads = 1024;
using PlanScan = cub::BlockScan<int, kPlanThreads, cub::BLOCK_SCAN_WARP_SCANS>;
// Shared memory: the tables, 3 * (E + 1) ints (dynamic), and the scan's temporary storage
// (static), within the 48 KB a launch gets without opting in. (The bound was 4095 before,
// where from E = 4074 the total passed 48 KB: by that rule the plan could not launch.)
constexpr size_t plan_smem(int64_t E) { return (size_t)(E + 1) * 3 * sizeof(int32_t); }
static_assert(plan_smem(kPlanMaxE) + sizeof(PlanScan::TempStorage) <= 48 * 1024, "gather plan: shared memory");

__global__ void __launch_bounds__(kPlanThreads) gather_plan_kernel(const Mat gidx, int64_t B, int M, int E, int MT,
                                                                   int32_t* perm, int32_t* seg_start,
                                                                   int32_t* tile_seg, int32_t* tile_row0,
                                                                   int32_t* ntiles) {
  extern __shared__ int32_t sm[];
  const int NE = E + 1;  // expert E collects the indices out of range
  int32_t* cnt = sm;
  int32_t* fill = sm + NE;
  int32_t* tstart = sm + 2 * NE;
  __shared__ typename PlanScan::TempStorage scan_tmp;
  const int tid = threadIdx.x;
  for (int i = tid; i < NE; i += kPlanThreads) cnt[i] = fill[i] = 0;
  __syncthreads();
  auto expert = [&](int64_t b) {
    const int32_t e = *((const int32_t*)gidx.ptr + gidx.offset(b));
    return e >= 0 && e < E ? (int)e : E;
  };
  for (int64_t b = tid; b < B; b += kPlanThreads) atomicAdd(&cnt[expert(b)], 1);
  __syncthreads();
  // exclusive prefix sums of the entry counts and of the tile counts, over a chunk of
  // experts per thread
  auto tiles_of = [&](int e) { return (cnt[e] * M + MT - 1) / MT; };
  const int chunk = (NE + kPlanThreads - 1) / kPlanThreads, lo = tid * chunk, hi = min(lo + chunk, NE);
  int se = 0, st = 0;
  for (int i = lo; i < hi; ++i) se += cnt[i], st += tiles_of(i);
  int pe, pt, total_e, total_t;
  PlanScan(scan_tmp).ExclusiveSum(se, pe, total_e);
  __syncthreads();  // (scan_tmp is reused)
  PlanScan(scan_tmp).ExclusiveSum(st, pt, total_t);
  for (int i = lo; i < hi; ++i) {
    seg_start[i] = pe;
    tstart[i] = pt;
    pe += cnt[i];
    pt += tiles_of(i);
  }
  if (tid == 0) {
    seg_start[NE] = total_e;  // = B
    *ntiles = total_t;
  }
  __syncthreads();
  for (int64_t b = tid; b < B; b += kPlanThreads) {
    const int e = expert(b);
    perm[seg_start[e] + atomicAdd(&fill[e], 1)] = (int32_t)b;
  }
  for (int e = tid; e < NE; e += kPlanThreads)
    for (int j = 0, n = tiles_of(e); j < n; ++j) {
      tile_seg[tstart[e] + j] = e;
      tile_row0[tstart[e] + j] = j * MT;
    }
}

// k-slices per row tile: the fewest (1..8) that give the grid a full wave of warps (16 per
// SM: ~2 CTAs fit by registers), while every warp keeps at least kDepth steps. SMs of the
// device the call runs on (a.out.device, current here). batch: the work items.
int ks_for(const MatmulArgs& a, const QL& L, int kDepth, int64_t batch) {
  const int64_t wave = (int64_t)sm_count(a.out.device) * 16;
  const int64_t tiles = (a.N + 15) / 16, groups4 = (L.C + 3) / 4;
  int KS = 1;
  while (KS < kWarps && tiles * batch * KS < wave && groups4 / (2 * KS) >= kDepth) KS <<= 1;
  return KS;
}

template <int F, bool kSorted>
void launch_k(const MatmulArgs& a, QL L, const float* alpha, const GPlan& G, int64_t items, int MT, cudaStream_t st,
              const QX& X = QX{}) {
  const int kDepth = MT <= 8 ? depth<F, 8>() : (MT <= 16 ? depth<F, 16>() : depth<F, 64>());
  const int64_t tiles = (a.N + 15) / 16;
  const int KS = ks_for(a, L, kDepth, kSorted ? items : a.out.batch());
  L.KS = KS;
  L.logKS = KS == 1 ? 0 : (KS == 2 ? 1 : (KS == 4 ? 2 : 3));
  const int64_t per_cta = kWarps / KS;
  // kSorted: the expected number of work items; the kernel strides over the actual one
  const int64_t gy = kSorted ? items : a.out.batch();
  const dim3 grid((unsigned)((tiles + per_cta - 1) / per_cta), (unsigned)(gy < 65535 ? gy : 65535));
  if constexpr (kSorted) {  // MT 8, 16 or 32 (not affine)
    if (MT <= 8) qmma_kernel<F, 8, true><<<grid, kThreads, 0, st>>>(a, L, alpha, G, X);
    else if (MT <= 16 || is_aff(F)) qmma_kernel<F, 16, true><<<grid, kThreads, 0, st>>>(a, L, alpha, G, X);
    else if constexpr (!is_aff(F)) qmma_kernel<F, 32, true><<<grid, kThreads, 0, st>>>(a, L, alpha, G, X);
  } else if (X.on) {  // (plan: MT 8, fp formats)
    if constexpr (!is_aff(F))
      qmma_kernel<F, 8, false, true><<<grid, kThreads, qx_smem_bytes(X.rows, a.K), st>>>(a, L, alpha, G, X);
  } else {
    if (MT <= 8) qmma_kernel<F, 8, false><<<grid, kThreads, 0, st>>>(a, L, alpha, G, X);
    else if (MT <= 16 || is_aff(F)) qmma_kernel<F, 16, false><<<grid, kThreads, 0, st>>>(a, L, alpha, G, X);
    else if constexpr (!is_aff(F)) {
      if (MT <= 32) qmma_kernel<F, 32, false><<<grid, kThreads, 0, st>>>(a, L, alpha, G, X);
      else qmma_kernel<F, 64, false><<<grid, kThreads, 0, st>>>(a, L, alpha, G, X);
    }
  }
}

}  // namespace

qqStatus_t gather_plan(const Mat& gidx, int64_t B, int64_t M, int E, int MT, Scratch& scratch, cudaStream_t st,
                       const char* op, GPlan* G) {
  const int64_t max_items = gather_plan_max_items(B, M, E, MT);
  int32_t* buf = nullptr;
  QQ_TRY(scratch.get(op, (size_t)(B + (E + 2) + 2 * max_items + 1) * 4, &buf));
  G->perm = buf;
  G->seg_start = buf + B;
  G->tile_seg = buf + B + (E + 2);
  G->tile_row0 = G->tile_seg + max_items;
  G->ntiles = G->tile_row0 + max_items;
  G->E = E;
  gather_plan_kernel<<<1, kPlanThreads, plan_smem(E), st>>>(gidx, B, (int)M, E, MT, buf, buf + B,
                                                           buf + B + (E + 2), buf + B + (E + 2) + max_items,
                                                           buf + B + (E + 2) + 2 * max_items);
  return check_launch(op);
}

namespace {

// Whether gather_qmm's entries are grouped by expert before the kernel (launch), so that
// an expert's weights are read once however many entries name it: where entries likely
// share experts - more than 8 entries, or 4 or more with at least as many entries as
// experts. The plan costs a launch, ~5 us on the H200: a DeepSeek-like decode step of one
// token (8 distinct experts of 256) ran 11 % slower with it, a Mixtral-like one of 4 tokens
// (8 entries over 8 experts) 1.6x faster (bench/results/gather_qmm-h200.md).
bool gather_grouped(const MatmulArgs& a) {
  if (!a.gidx.ptr) return false;
  const int64_t B = a.out.batch(), E = a.w.bshape[0];
  // (the plan and the kernel count an expert's rows, entries * M, in 32 bits)
  return (B > 8 || (B >= 4 && B >= E)) && a.M <= 16 && E <= kPlanMaxE && B * a.M < ((int64_t)1 << 31);
}

template <int F>
qqStatus_t launch(const MatmulArgs& a, QL L, const float* alpha, cudaStream_t st, qqContext* c, const QX* qx) {
  const int64_t B = a.out.batch(), E = a.gidx.ptr ? a.w.bshape[0] : 0;
  // gather_qmm whose entries likely share experts (gather_grouped): work items of one
  // expert each (GPlan), built by gather_plan_kernel. Tiles sized to the rows an expert
  // is expected to get (B * M rows over at most min(E, B) experts): 8, 16, or 32 past 12
  // (fp formats), so that an expert's rows mostly fit one tile - each tile reads the
  // expert's weights again.
  if (c && gather_grouped(a)) {
    const int64_t spread = B < E ? B : E, per_expert = (B * a.M + spread - 1) / spread;
    const int MT = per_expert > 12 && !is_aff(F) ? 32 : (per_expert > 6 ? 16 : 8);
    const int64_t max_items = gather_plan_max_items(B, a.M, E, MT);
    Scratch scratch(c, st);
    GPlan G;
    QQ_TRY(gather_plan(a.gidx, B, a.M, (int)E, MT, scratch, st, "gather_qmm", &G));
    // expected work items, for the k-split: the rows over the experts they can touch
    const int64_t est = B * a.M / MT > spread ? B * a.M / MT : spread;
    launch_k<F, true>(a, L, alpha, G, est < max_items ? est : max_items, MT, st);
    // (the plan's scratch is freed on the stream after the kernel)
    return check_launch("gather_qmm");
  }
  if (qx) {
    launch_k<F, false>(a, L, alpha, GPlan{}, 0, 8, st, *qx);
    return check_launch("qqmm");
  }
  launch_k<F, false>(a, L, alpha, GPlan{}, 0, a.M <= 8 ? 8 : (a.M <= 16 ? 16 : (a.M <= 32 ? 32 : 64)), st);
  return check_launch(a.gidx.ptr ? "gather_qmm" : "quantized_matmul");
}

}  // namespace

namespace {
// The kernel's format and layout for call `a` (*F, *L), or false when qmma
// does not take it.
bool plan(const MatmulArgs& a, int* F, QL* L, const QX* qx) {
  // mxfp8 at M = 1: qmv.cu's kernel is faster (177 vs 234 us at 16384^2 on
  // the H100, bench/results/qmm-h100.md); from M = 2 this one is. gather_qmm whose
  // entries it groups by expert (launch) comes here too: qmv cannot group them.
  if (a.M == 1 && a.q.mode == QQ_MODE_MXFP8 && !(a.gidx.ptr && gather_grouped(a))) return false;
  if (a.M < 1 || a.M > kQmmaMaxM || a.x_packed || !a.w_packed || !a.transpose) return false;
  if (a.x.dt != DType::BF16) return false;
  const QSpec& q = a.q;
  *L = QL{};
  L->M = (int)a.M;
  if (q.mode == QQ_MODE_AFFINE) {
    // 4 / 8 bits with bf16 scales and biases, M <= 16, one or two groups per step
    // (4-bit group 32 would be 4: left to qmv / the GEMM)
    if (a.M > 16 || a.w_scales.dt != DType::BF16 || a.w_biases.dt != DType::BF16 || a.w_blocked) return false;
    if (q.bits == 4 && q.group == 128) *F = QA4G1;
    else if (q.bits == 4 && q.group == 64) *F = QA4G2;
    else if (q.bits == 8 && (q.group == 64 || q.group == 128)) *F = QA8G1;
    else if (q.bits == 8 && q.group == 32) *F = QA8G2;
    else return false;
    L->lgs = q.group == 32 ? 5 : (q.group == 64 ? 6 : 7);
    L->ngroups = (uint32_t)(a.K / q.group);
  } else if (q.mode == QQ_MODE_NVFP4 && q.group == 16) *F = QNV4;
  else if (q.mode == QQ_MODE_MXFP4 && q.group == 32) *F = QMX4;
  else if (q.mode == QQ_MODE_MXFP8 && q.group == 32) *F = QMX8;
  else return false;
  if (*F == QMX8) {
    L->f8_kind = q.elem;
    if (q.elem != ELEM_E4M3 && q.elem != ELEM_E5M2) return false;
    const Fp8Bf16 f8 = fp8_bf16(q.elem == ELEM_E4M3);
    L->f8_shl = f8.shl, L->f8_shr = f8.shr, L->f8_mag = f8.mag, L->fix2 = f8.fix2, L->fix = f8.fix;
    L->f8_nan_mask = f8.nan_mask, L->f8_nan_add = f8.nan_add;
  }
  if (*F != QMX8) {
    L->fix = 126;
    L->f4_mul[0] = 65u << 6;
    L->f4_mul[1] = 65u << 2;
  }
  const int64_t row_bytes = a.K * q.bits / 8;
  // nvfp4 scales are read two bytes at a time (one load per row and chunk)
  if (row_bytes % 16 || row_bytes / 16 >= (int64_t)1 << 31 || !aligned(a.w, 16) || !aligned(a.x, 16) ||
      (*F == QNV4 && !aligned(a.w_scales, 2)))
    return false;
  L->C = row_bytes / 16;
  // x quantized in the launch: fp formats, at most 8 rows (one n8 tile), q(x) within the
  // shared memory and the re-quantization within the work of ops.cuh's rules (every CTA
  // quantizes all of x: CTAs * rows * K elements)
  if (qx) {
    // (one work item: the kernel fills q(x) once, for the rows of qx)
    if (is_aff(*F) || a.M > 8 || a.gidx.ptr || a.out.batch() != 1 || a.M != qx->rows || !qx_fits(a.M, a.K))
      return false;
    const int64_t per_cta = kWarps / ks_for(a, *L, *F == QMX8 ? depth<QMX8, 8>() : depth<QNV4, 8>(), 1);
    if (!qx_work_ok(((a.N + 15) / 16 + per_cta - 1) / per_cta, a.M, a.K)) return false;
  }
  return true;
}
}  // namespace

bool qmma_takes(const MatmulArgs& a, const QX* qx) {
  int F;
  QL L;
  return plan(a, &F, &L, qx);
}

qqStatus_t qmma(const MatmulArgs& a, const float* alpha, cudaStream_t stream, qqContext* c, const QX* qx) {
  int F;
  QL L;
  if (!plan(a, &F, &L, qx)) return QQ_STATUS_NOT_SUPPORTED;
  switch (F) {
    case QNV4: return launch<QNV4>(a, L, alpha, stream, c, qx);
    case QMX4: return launch<QMX4>(a, L, alpha, stream, c, qx);
    case QMX8: return launch<QMX8>(a, L, alpha, stream, c, qx);
    case QA4G1: return launch<QA4G1>(a, L, alpha, stream, c, nullptr);
    case QA4G2: return launch<QA4G2>(a, L, alpha, stream, c, nullptr);
    case QA8G1: return launch<QA8G1>(a, L, alpha, stream, c, nullptr);
    default: return launch<QA8G2>(a, L, alpha, stream, c, nullptr);
  }
}

}  // namespace cuda
}  // namespace qq
