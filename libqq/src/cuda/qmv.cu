// cuda/qmv.cu - weight-only matmul for small M (M <= kQmvMaxM, ops.cuh):
//   out[b, m, n] = sum_k x[b, m, k] * W[b][n, k] (+ bias[n]),  W = dequantize(w)
// with fp32 accumulation and one rounding to the output dtype. Memory bound:
// the packed weights are read exactly once, 16 bytes per load.
//
// Versions (all in this file, picked by `qmv` at the bottom):
//   T-wide   transpose=True, 16-byte aligned rows. A CTA of 256 threads is split
//            into G = 256/T row groups of T threads (T = 32..256, chosen so that
//            every thread gets at least U chunks of the row). A row group owns R
//            consecutive rows n; its T threads stride over the 16-byte chunks of
//            those rows (chunk c, c + T, ...): each thread issues R*U 16-byte
//            loads (L1::no_allocate: weights are streamed, x stays in L1) before
//            decoding any, decodes 8 elements at a time in registers and FMAs
//            them with 8 x values per row of the M tile (x is read from global
//            through L1: it is tiny and every CTA on the SM shares it). Each x
//            load serves R weight rows, each decoded weight all MT x rows.
//            Partial sums: warp butterfly shuffles, then the T/32 warps of a
//            group add their results from shared memory in a fixed order (no
//            atomics; the result is the same on every run).
//   T-narrow transpose=True, any alignment and affine 2/3/5/6-bit: the same
//            shape with chunks of 8 elements (bits bytes) read byte by byte;
//            affine of every width decodes through AFFG, x's dtype is a run-time
//            value (Launch::xk), one M tile of 4.
//   N        transpose=False (w is [K, N*bits/8], groups along N): a thread
//            owns a strip of 8 consecutive n (one 4-byte word of fp4, 8 bytes of
//            fp8) and a slice k = ks, ks + KS, ... of K; the S strip lanes of a
//            CTA are adjacent in N (coalesced), its KS = 256/S k-splits are
//            added in shared memory in a fixed order. M is covered in tiles of
//            4 rows (a tile re-reads its strip of w, mostly from L2). x's dtype
//            is a run-time value (Launch::xk).
// Only the wide T kernels are compiled per x dtype (the main path); 40 kernels
// in all (every one reachable: M tiles of 1 and 4 for M <= kQmvMaxM).
//
// Numerics: every weight is exactly dequantize()'s value: the element decoded
// (bit tricks below, equal to codec.h's decoders for every code, NaN included)
// times the decoded scale, then times the nvfp4 global factor
// nvfp4_dec(global_scale) when there is one; affine is
// fma(q, scale, bias) = affine_decode(q, scale, bias). Only the order of the
// fp32 sums differs from the CPU backend.
//
// Napkin math (H100, 16384 x 16384 nvfp4, M = 1): 134 MB of codes + 8.4 MB of
// scales at ~3 TB/s is ~48 us; 2.7e8 weights in that time is ~20 weights per
// SM per clock, so the decode must stay within ~6 instructions per weight
// (issue: 128 per SM per clock). That is why the fp4/fp8 decoders below build
// the fp32 bit patterns directly instead of calling e2m1_decode (~10
// instructions with branches). At M = 16 the 16 fp32 FMAs per weight
// (2*M*N*K = 8.6 GFLOP at 67 TFLOP/s = 128 us) would dominate instead, which
// is why qmv stops at kQmvMaxM = 4.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

constexpr int kThreads = 256;

// Weight formats of the kernels. FP4NV: nvfp4 (group 16, E4M3 scales, global
// factor); FP4MX: mxfp4; FP8: mxfp8 with E4M3 or E5M2 elements (run-time
// constants in Fmt8); AFF4 / AFF8: affine 4 / 8 bits; AFFG: affine any bits
// (2..8), only with 8-element chunks.
enum Fmt { FP4NV = 0, FP4MX = 1, FP8 = 2, AFF4 = 3, AFF8 = 4, AFFG = 5 };

// Bits per element of a format (AFFG: run time).
template <int F> __host__ __device__ constexpr int fmt_bits() { return (F == FP8 || F == AFF8) ? 8 : 4; }

// Run-time constants of one launch.
struct Launch {
  int64_t C;       // chunks per weight row (T kernels) or K (N kernel)
  int T, logT;     // T kernels: threads per row group (power of two)
  int G;           // T kernels: row groups per CTA
  int S, logS;     // N kernel: strip lanes per CTA
  int M;           // rows of x
  int bits;        // element bits
  int esz;         // bytes per affine scale / bias (2 or 4)
  int xvec;        // x rows allow 16-byte loads
  int xk;          // x dtype for the kernels that take it at run time (XRT): 0 f32, 1 bf16, 2 f16
  int wvec;        // N kernel: w rows allow 4/8-byte loads
  // FP8 decode constants (E4M3 / E5M2), see fp8x4.
  int f8_kind;      // ELEM_E4M3 or ELEM_E5M2
  uint32_t f8_shl, f8_shr, f8_mag, f8_nan_mask, f8_nan_add;
  float f8_fix;
  uint32_t f8_ulim;  // largest UE8M0 scale byte u with 2^fix * 2^(u - 127) finite (254 - fix)
};

// ---- element decoders ------------------------------------------------------
// They produce exact fp32 values through bf16 bit patterns: a 32-bit word
// holds two bf16 (elements j and j+4 of an fp4 word, j and j+2 of an fp8
// word: those are 16 bits apart, so one shift places both), and a bf16 turns
// into an fp32 with one shift or mask. The element's magnitude bits go into
// the low bits of the bf16 exponent and the top of its mantissa, so that the
// bf16 is the element's value times 2^-126 (fp4: exponent field e, mantissa
// m; e = 0 is a bf16 subnormal exactly as it is an E2M1 subnormal) or 2^-120
// (E4M3) / 2^-112 (E5M2); one exact multiply by the inverse power of two
// restores the value. The GPU tests compare the kernels with the reference
// (tests/test_matmul.py's qmv tests; test_qmma_code_space sends mxfp8 at M = 1,
// every code and the extreme / NaN scales, here).
// (QQ_HD so that a host program could check them against codec.h directly; a
// host check that extracted this section from the file's text was removed.)
QQ_HD float bf16lo(uint32_t p) { return u2f(p << 16); }
QQ_HD float bf16hi(uint32_t p) { return u2f(p & 0xffff0000u); }
// fused a * b + c, one rounding, on both sides (device: fma.rn.f32). One
// line for both, so that the host checks run the code the device runs (this
// once called itself on the device: infinite recursion, which nvcc compiled to
// nothing, leaving every affine kernel without its stores).
QQ_HD float fma_f(float a, float b, float c) { return fmaf(a, b, c); }

// 8 E2M1 codes of w (element i in bits 4i..4i+3) -> v[i] = e2m1_decode(code) * f.
QQ_HD void fp4x8(uint32_t w, float f, float* v) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // magnitude (bits 4j..4j+2 and 4j+16..) -> bf16 bits 6..8; sign (4j+3) -> 15
    const uint32_t mag = (j < 2 ? (w << (6 - 4 * j)) : (w >> (4 * j - 6))) & 0x01c001c0u;
    const uint32_t p = mag | ((w << (12 - 4 * j)) & 0x80008000u);
    v[j] = (bf16lo(p) * 0x1p126f) * f;
    v[j + 4] = (bf16hi(p) * 0x1p126f) * f;
  }
}

// The rare word with an Inf / NaN code, through the codec: out of line, so that its
// copies (one per word of the unrolled loop) do not fill the instruction cache: inlined,
// they made qmv's mxfp8 main loop 3876 instructions and its first stall instruction fetch
// (4096^2, M = 1 with x quantized in the launch: 17.1 -> 14.7 us on an H200 out of line).
// (The values come back in registers: a pointer into the caller's array would put that
// array in local memory on every path.)
__host__ __device__ __noinline__ float4 fp8x4_special(uint32_t w, float f, int kind) {
  return make_float4(elem_decode(kind, (uint8_t)w) * f, elem_decode(kind, (uint8_t)(w >> 8)) * f,
                     elem_decode(kind, (uint8_t)(w >> 16)) * f, elem_decode(kind, (uint8_t)(w >> 24)) * f);
}
// 4 fp8 codes of w -> v[i] = elem_decode(kind, code) * f, through vec.cuh's
// fp8_place (bytes 0 and 2 in one bf16 pair, 1 and 3 in the other) and the
// factor 2^fix; a word holding an all-ones exponent takes the codec path
// (fp8x4_special).
// check = false: the caller has found no such word among those it decodes, and no scale
// byte above L.f8_ulim (qmv_t_kernel tests a whole pipeline step at once, one branch a step
// instead of one a word; both of its calls inline with the flag constant), and f is then
// already the scale times 2^fix: one multiply an element instead of two. The same value:
// the placed bf16 is code * 2^-fix exactly, so bf16 * (2^fix * s) is one rounding of the
// exact code * s, as (bf16 * 2^fix) * s is (its first product is exact), while 2^fix * s
// is finite, which f8_ulim guarantees.
QQ_HD void fp8x4(uint32_t w, float f, const Launch& L, float* v, bool check = true) {
  if (check && fp8_special(w, L.f8_nan_mask, L.f8_nan_add)) {
    const float4 s = fp8x4_special(w, f, L.f8_kind);
    v[0] = s.x, v[1] = s.y, v[2] = s.z, v[3] = s.w;
    return;
  }
  uint32_t p0, p1;
  fp8_place(w, L.f8_shl, L.f8_shr, L.f8_mag, p0, p1);
  if (!check) {
    v[0] = bf16lo(p0) * f;
    v[2] = bf16hi(p0) * f;
    v[1] = bf16lo(p1) * f;
    v[3] = bf16hi(p1) * f;
    return;
  }
  v[0] = (bf16lo(p0) * L.f8_fix) * f;
  v[2] = (bf16hi(p0) * L.f8_fix) * f;
  v[1] = (bf16lo(p1) * L.f8_fix) * f;
  v[3] = (bf16hi(p1) * L.f8_fix) * f;
}

// Affine: q as an exact float without an int->float conversion: the bf16
// 0x4300 | q is 128 + q (q < 16), the fp32 0x4B000000 | q is 2^23 + q; the
// subtraction is exact. Then fma(q, scale, bias) = affine_decode(q, scale, bias).
QQ_HD void aff4x8(uint32_t w, float s, float b, float* v) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t p = ((w >> (4 * j)) & 0x000f000fu) | 0x43004300u;
    v[j] = fma_f(bf16lo(p) - 128.0f, s, b);
    v[j + 4] = fma_f(bf16hi(p) - 128.0f, s, b);
  }
}
QQ_HD void aff8x4(uint32_t w, float s, float b, float* v) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v[i] = fma_f(u2f(0x4b000000u | ((w >> (8 * i)) & 0xffu)) - 8388608.0f, s, b);
}
QQ_HD void affgx8(uint64_t w, int bits, float s, float b, float* v) {
  const uint32_t mask = (1u << bits) - 1;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    v[i] = fma_f(u2f(0x4b000000u | ((uint32_t)(w >> (i * bits)) & mask)) - 8388608.0f, s, b);
}

// Per-group factors of one 8-element block: fp modes s = decoded scale and
// g = nvfp4 global factor (1 otherwise); affine s = scale, g = bias.
struct Sc {
  float s, g;
};

// 8 consecutive elements (their packed bytes in `raw`, little endian) -> v.
template <int F>
QQ_HD void decode8(uint64_t raw, Sc sc, const Launch& L, float* v, bool check = true) {
  const uint32_t lo = (uint32_t)raw, hi = (uint32_t)(raw >> 32);
  if constexpr (F == FP4NV) {
    fp4x8(lo, sc.s, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = v[i] * sc.g;  // (elem * scale) * global, as dequantize
  } else if constexpr (F == FP4MX) {
    fp4x8(lo, sc.s, v);
  } else if constexpr (F == FP8) {
    fp8x4(lo, sc.s, L, v, check);
    fp8x4(hi, sc.s, L, v + 4, check);
  } else if constexpr (F == AFF4) {
    aff4x8(lo, sc.s, sc.g, v);
  } else if constexpr (F == AFF8) {
    aff8x4(lo, sc.s, sc.g, v);
    aff8x4(hi, sc.s, sc.g, v + 4);
  } else {
    affgx8(raw, L.bits, sc.s, sc.g, v);
  }
}

// ---- scales ----------------------------------------------------------------
template <int F> QQ_HD float fp_scale(uint32_t b) {
  return F == FP4NV ? e4m3_decode_bits(b) : ue8m0_decode((uint8_t)b);
}
// Affine scale / bias of dtype size esz (4: fp32; 2: bf16 or fp16 by `bf`).
__device__ __forceinline__ uint32_t load_sb(const uint8_t* p, int64_t i, int esz) {
  return esz == 4 ? __ldg(reinterpret_cast<const uint32_t*>(p) + i)
                  : (uint32_t)__ldg(reinterpret_cast<const unsigned short*>(p) + i);
}
__device__ __forceinline__ float sb_to_f(uint32_t r, DType dt) {
  return dt == DType::F32 ? u2f(r) : (dt == DType::BF16 ? bf16_to_f((uint16_t)r) : fp16_to_f((uint16_t)r));
}

// ---- x and out ---------------------------------------------------------------
struct XF32 {};
struct XBF16 {};
struct XF16 {};
// 8 consecutive x values as fp32 (vec: 16-byte aligned).
template <typename XT> __device__ __forceinline__ void load_x8(const void* p, bool vec, float* v);
template <> __device__ __forceinline__ void load_x8<XF32>(const void* p, bool vec, float* v) {
  const float* f = (const float*)p;
  if (vec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(f)), b = __ldg(reinterpret_cast<const float4*>(f) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __ldg(f + i);
  }
}
template <> __device__ __forceinline__ void load_x8<XBF16>(const void* p, bool vec, float* v) {
  const unsigned short* h = (const unsigned short*)p;
  if (vec) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(h));
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = bf16lo(w[i]);
      v[2 * i + 1] = bf16hi(w[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = bf16_to_f(__ldg(h + i));
  }
}
template <> __device__ __forceinline__ void load_x8<XF16>(const void* p, bool vec, float* v) {
  const unsigned short* h = (const unsigned short*)p;
  if (vec) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(h));
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));  // exact
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __half2float(__ushort_as_half(__ldg(h + i)));  // exact, one cvt
  }
}
// q(x) in bf16 in the CTA's shared memory (qqmm, ops.cuh QX): plain 16-byte loads.
struct XQS {};
template <> __device__ __forceinline__ void load_x8<XQS>(const void* p, bool, float* v) {
  const uint4 a = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = bf16lo(w[i]);
    v[2 * i + 1] = bf16hi(w[i]);
  }
}
// x dtype chosen at run time (Launch::xk): the narrow T kernel and the N kernel,
// off the main path, take it so as not to be compiled once per x dtype.
struct XRT {};
// a 16-bit x value (low 16 bits of h) of dtype xk (1 bf16, 2 f16), exact
__device__ __forceinline__ float x16_to_f(uint32_t h, int xk) {
  return xk == 1 ? u2f(h << 16) : __half2float(__ushort_as_half((unsigned short)h));
}
// one x value, x dtype xk (0 f32, 1 bf16, 2 f16); warp-uniform branches
__device__ __forceinline__ float load_x1_rt(const char* p, int xk) {
  if (xk == 0) return __ldg((const float*)p);
  return x16_to_f(__ldg((const unsigned short*)p), xk);
}
template <typename XT>
__device__ __forceinline__ void load_x8_any(const char* p, bool vec, int xk, float* v) {
  if constexpr (std::is_same<XT, XRT>::value) {
    if (xk == 0) {
      load_x8<XF32>(p, vec, v);
      return;
    }
    // bf16 and f16 share the loads; only the conversion differs
    const unsigned short* h = (const unsigned short*)p;
    uint32_t w[4];
    if (vec) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(h));
      w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = (uint32_t)__ldg(h + 2 * i) | ((uint32_t)__ldg(h + 2 * i + 1) << 16);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = x16_to_f(w[i] & 0xffffu, xk);
      v[2 * i + 1] = x16_to_f(w[i] >> 16, xk);
    }
  } else {
    load_x8<XT>(p, vec, v);
  }
}
// bytes per x element
template <typename XT> __host__ __device__ int x_size(int xk) {
  return std::is_same<XT, XRT>::value ? (xk == 0 ? 4 : 2) : (std::is_same<XT, XF32>::value ? 4 : 2);
}

// ---------------------------------------------------------------------------
// T kernels (transpose=True): W row n = packed row n of w, groups along K.
// ---------------------------------------------------------------------------
// Tile shape per M tile (MT = 1 or 4; a tile skips its rows past M, so M = 2..4
// share the 4 tile): R rows per row group, U chunks in flight per row. M = 1:
// 4 loads in flight; M <= 4: 4 rows share each x load. (A 16 tile, 2 rows, was
// compiled until 2026-11-26 but never launched since kQmvMaxM became 4: above
// M = 4 dequantize + GEMM or qmma win, bench/results/qmm-h100.md.)
static_assert(kQmvMaxM <= 4, "qmv's largest M tile is 4 rows");
template <int MT> __host__ __device__ constexpr int t_rows() { return MT == 1 ? 2 : 4; }
template <int MT> __host__ __device__ constexpr int t_unroll() { return MT == 1 ? 2 : 1; }

// kNarrow: chunk = 8 elements read byte by byte (any alignment, any bits).
template <int F, bool kNarrow> struct Chunk {
  static constexpr int kElems = kNarrow ? 8 : 128 / fmt_bits<F>();  // elements per chunk
  static constexpr int kSub = kElems / 8;                          // 8-element blocks per chunk
  // distinct scale groups per chunk: 2 for wide nvfp4 (32 elements, groups of 16)
  static constexpr int kScales = (!kNarrow && F == FP4NV) ? 2 : 1;
};

// Raw data of one chunk of one row: packed bytes and scale bits.
struct Raw {
  uint4 d;
  uint32_t s[2];
};

// XT = XQS: x is X.x, quantized by this CTA into its dynamic shared memory first (qqmm);
// x's nvfp4 global factor multiplies each sum at the store.
template <typename XT, int F, int MT, bool kNarrow>
__global__ void __launch_bounds__(kThreads) qmv_t_kernel(const MatmulArgs a, const Launch L, const QX X) {
  constexpr bool kQX = std::is_same<XT, XQS>::value;
  extern __shared__ __align__(16) unsigned char qx_smem[];
  constexpr int R = kNarrow ? 1 : t_rows<MT>();
  constexpr int U = kNarrow ? 4 : t_unroll<MT>();
  using Ch = Chunk<F, kNarrow>;
  __shared__ float red[kThreads / 32][MT * R];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t = tid & (L.T - 1), grp = tid >> L.logT;
  const int64_t N = a.N, C = L.C;
  const int64_t row0 = ((int64_t)blockIdx.x * L.G + grp) * R;
  const int cbytes = kNarrow ? L.bits : 16;  // bytes per chunk
  const int group = a.q.group;
  constexpr bool fp = F == FP4NV || F == FP4MX || F == FP8;
  constexpr int kFpGroup = F == FP4NV ? 16 : 32;  // qmv() refuses other group sizes for fp formats
  // nvfp4 global factor, read on the device (1 without a global scale)
  const float gdec = (F == FP4NV && a.gs_w) ? nvfp4_dec(*a.gs_w) : 1.0f;
  const DType sdt = a.w_scales.dt;

  for (int64_t b = blockIdx.y; b < a.out.batch(); b += gridDim.y) {
    // the weight entry (gather_qmm: the expert of b's index; out of range: NaN rows)
    const int64_t we = weight_entry(a, b), wb = we < 0 ? 0 : we;
    const float wmul = we < 0 ? __int_as_float(0x7fc00000) : 1.0f;  // * 1 keeps -0
    const uint8_t* wrow[R];
    const uint8_t* srow[R];  // linear: the row's scales; blocked: the batch entry's matrix
    const uint8_t* brow[R];  // affine biases
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t n = row0 + r < N ? row0 + r : N - 1;  // rows past N load row N-1, store nothing
      wrow[r] = (const uint8_t*)a.w.ptr + a.w.offset(wb) + n * a.w.ld;
      const int es = fp ? 1 : L.esz;
      srow[r] = (const uint8_t*)a.w_scales.ptr + (a.w_scales.offset(wb) + (a.w_blocked ? 0 : n * a.w_scales.ld)) * es;
      brow[r] = fp ? nullptr : (const uint8_t*)a.w_biases.ptr + (a.w_biases.offset(wb) + n * a.w_biases.ld) * es;
    }
    const int xsz = x_size<XT>(L.xk);
    const char* xb = kQX ? (const char*)qx_smem : (const char*)a.x.ptr + a.x.offset(b) * xsz;
    const int64_t xld = (kQX ? X.pitch : a.x.ld) * xsz;
    const float xpost = kQX && X.gs ? nvfp4_dec(*X.gs) : 1.0f;

    float acc[MT][R];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;

    // Software pipeline: the loads of step i+1 are in flight while step i is
    // decoded, so that every thread keeps R*U 16-byte loads outstanding for
    // the whole loop instead of alternating "load everything, then compute".
    // (Without it the kernel sat at ~0.3 of copy bandwidth at M=1.)
    const int64_t step = (int64_t)L.T * U;
    auto load_step = [&](int64_t c0, Raw (&raw)[U][R]) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + (int64_t)u * L.T;
        if (c >= C) continue;
        // first group of the chunk (fp formats: a group size fixed by the format, so a shift,
        // not a 64-bit division routine per chunk)
        const int64_t g0 = fp ? c * Ch::kElems / kFpGroup : c * Ch::kElems / group;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint8_t* p = wrow[r] + c * cbytes;
          if (kNarrow) {
            uint32_t lo = 0, hi = 0;
            for (int i = 0; i < cbytes; ++i) {
              const uint32_t byte = __ldg(p + i);
              if (i < 4) lo |= byte << (8 * i);
              else hi |= byte << (8 * (i - 4));
            }
            raw[u][r].d = make_uint4(lo, hi, 0, 0);
          } else {
            raw[u][r].d = ld_stream(p);
          }
          if constexpr (fp) {
            const int64_t n = row0 + r < N ? row0 + r : N - 1;
#pragma unroll
            for (int s = 0; s < Ch::kScales; ++s)
              raw[u][r].s[s] = __ldg(srow[r] + (a.w_blocked ? blocked_offset(n, g0 + s, a.w_scales.cols) : g0 + s));
          } else {
            raw[u][r].s[0] = load_sb(srow[r], g0, L.esz);
            raw[u][r].s[1] = load_sb(brow[r], g0, L.esz);
          }
        }
      }
    };
    // check: decode fp8 words through fp8x4's Inf / NaN test (false: the step has none)
    auto compute_step = [&](bool check, int64_t c0, const Raw (&raw)[U][R]) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + (int64_t)u * L.T;
        if (c >= C) continue;
        Sc sc[R][2];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int s = 0; s < Ch::kScales; ++s) {
            if constexpr (F == FP8)  // unchecked: 2^fix folded into the scale (fp8x4)
              sc[r][s] = Sc{check ? fp_scale<F>(raw[u][r].s[s]) : fp_scale<F>(raw[u][r].s[s]) * L.f8_fix, gdec};
            else if constexpr (fp) sc[r][s] = Sc{fp_scale<F>(raw[u][r].s[s]), gdec};
            else sc[r][s] = Sc{sb_to_f(raw[u][r].s[0], sdt), sb_to_f(raw[u][r].s[1], sdt)};
          }
#pragma unroll
        for (int i = 0; i < Ch::kSub; ++i) {
          float v[R][8];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint4 d = raw[u][r].d;
            // 8-element block i: 4 bytes of fp4 (word i), 8 of fp8 (words 2i, 2i+1)
            uint64_t blk;
            if (kNarrow) blk = (uint64_t)d.x | ((uint64_t)d.y << 32);
            else if (fmt_bits<F>() == 4) blk = i == 0 ? d.x : i == 1 ? d.y : i == 2 ? d.z : d.w;
            else blk = i == 0 ? ((uint64_t)d.x | ((uint64_t)d.y << 32)) : ((uint64_t)d.z | ((uint64_t)d.w << 32));
            decode8<F>(blk, sc[r][Ch::kScales == 2 ? i / 2 : 0], L, v[r], check);
          }
          const int64_t k0 = c * Ch::kElems + 8 * i;
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            if (m >= L.M) break;  // uniform: rows of the tile past M
            float xv[8];
            load_x8_any<XT>(xb + m * xld + k0 * xsz, L.xvec, L.xk, xv);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < 8; ++j) acc[m][r] = fmaf(xv[j], v[r][j], acc[m][r]);
          }
        }
      }
    };
    Raw cur[U][R];
    if (t < C) load_step(t, cur);
    if constexpr (kQX) {  // while the first step's weights are in flight
      qx_rows_to_smem<F == FP4NV ? 16 : 32>(X, (__nv_bfloat16*)qx_smem, a.K);
      __syncthreads();
    }
    for (int64_t c0 = t; c0 < C; c0 += step) {
      Raw nxt[U][R];
      if (c0 + step < C) load_step(c0 + step, nxt);
      if constexpr (F == FP8) {
        // Inf / NaN codes, or a scale byte above f8_ulim, anywhere in this step's chunks (rare):
        // only then the tested decode with its two multiplies an element
        uint32_t sp = 0;
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (c0 + (int64_t)u * L.T >= C) continue;  // not loaded
            const uint4 d = cur[u][r].d;
            sp |= fp8_special(d.x, L.f8_nan_mask, L.f8_nan_add) | fp8_special(d.y, L.f8_nan_mask, L.f8_nan_add) |
                  (uint32_t)((cur[u][r].s[0] & 0xffu) > L.f8_ulim);
            if (!kNarrow)
              sp |= fp8_special(d.z, L.f8_nan_mask, L.f8_nan_add) | fp8_special(d.w, L.f8_nan_mask, L.f8_nan_add);
          }
        if (sp) compute_step(true, c0, cur);
        else compute_step(false, c0, cur);
      } else {
        compute_step(true, c0, cur);
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) cur[u][r] = nxt[u][r];
    }

    // -- reduce over the T threads of the row group, in a fixed order --
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int o = 16; o; o >>= 1) acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], o);
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) red[warp][m * R + r] = acc[m][r];
    }
    __syncthreads();
    const int wpg = L.T >> 5;  // warps per row group
    for (int e = tid; e < L.G * MT * R; e += kThreads) {
      const int g = e / (MT * R), mr = e % (MT * R), m = mr / R, r = mr % R;
      const int64_t n = ((int64_t)blockIdx.x * L.G + g) * R + r;
      if (m >= L.M || n >= N) continue;
      float s = red[g * wpg][mr];
      for (int w = 1; w < wpg; ++w) s += red[g * wpg + w][mr];
      store_out(a, b, m, n, kQX ? s * wmul * xpost : s * wmul);
    }
    __syncthreads();  // red is reused by the next batch entry
  }
}

// ---------------------------------------------------------------------------
// N kernel (transpose=False): W[k, n] = element n of packed row k of w, groups
// along N. Thread = (strip of 8 n, k-split).
// ---------------------------------------------------------------------------
constexpr int kNTile = 4;  // rows of x per pass
constexpr int kNUnroll = 4;

template <int F>
__global__ void __launch_bounds__(kThreads) qmv_n_kernel(const MatmulArgs a, const Launch L) {
  __shared__ float red[kThreads][kNTile * 8 + 1];  // +1: no bank conflicts
  const int tid = threadIdx.x;
  const int sl = tid & (L.S - 1), ks = tid >> L.logS, KS = kThreads >> L.logS;
  const int64_t nstrips = a.N / 8, K = a.K;
  const int64_t strip0 = (int64_t)blockIdx.x * L.S;
  const int64_t strip = strip0 + sl < nstrips ? strip0 + sl : nstrips - 1;
  const int64_t g = strip * 8 / a.q.group;  // scale column of this strip
  const int sbytes = L.bits;                // packed bytes of 8 elements
  constexpr bool fp = F == FP4NV || F == FP4MX || F == FP8;
  const float gdec = (F == FP4NV && a.gs_w) ? nvfp4_dec(*a.gs_w) : 1.0f;
  const DType sdt = a.w_scales.dt;

  for (int64_t b = blockIdx.y; b < a.out.batch(); b += gridDim.y) {
    // the weight entry (gather_qmm: the expert of b's index; out of range: NaN rows)
    const int64_t we = weight_entry(a, b), wb = we < 0 ? 0 : we;
    const float wmul = we < 0 ? __int_as_float(0x7fc00000) : 1.0f;  // * 1 keeps -0
    const uint8_t* wcol = (const uint8_t*)a.w.ptr + a.w.offset(wb) + strip * sbytes;
    const int es = fp ? 1 : L.esz;
    const uint8_t* scol = (const uint8_t*)a.w_scales.ptr + (a.w_scales.offset(wb) + g) * es;
    const uint8_t* bcol = fp ? nullptr : (const uint8_t*)a.w_biases.ptr + (a.w_biases.offset(wb) + g) * es;
    const int xsz = x_size<XRT>(L.xk);
    const char* xb = (const char*)a.x.ptr + a.x.offset(b) * xsz;

    for (int m0 = 0; m0 < L.M; m0 += kNTile) {
      float acc[kNTile][8];
#pragma unroll
      for (int m = 0; m < kNTile; ++m)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[m][j] = 0.0f;

      for (int64_t k0 = ks; k0 < K; k0 += (int64_t)KS * kNUnroll) {
        uint64_t raw[kNUnroll];
        uint32_t rs[kNUnroll], rb[kNUnroll];
#pragma unroll
        for (int u = 0; u < kNUnroll; ++u) {
          const int64_t k = k0 + (int64_t)u * KS;
          if (k >= K) continue;
          const uint8_t* p = wcol + k * a.w.ld;
          if (L.wvec && sbytes == 4) {
            raw[u] = __ldg(reinterpret_cast<const uint32_t*>(p));
          } else if (L.wvec && sbytes == 8) {
            const uint2 d = __ldg(reinterpret_cast<const uint2*>(p));
            raw[u] = (uint64_t)d.x | ((uint64_t)d.y << 32);
          } else {
            uint64_t r = 0;
            for (int i = 0; i < sbytes; ++i) r |= (uint64_t)__ldg(p + i) << (8 * i);
            raw[u] = r;
          }
          if constexpr (fp) {
            rs[u] = __ldg(scol + k * a.w_scales.ld);
          } else {
            rs[u] = load_sb(scol, k * a.w_scales.ld, L.esz);
            rb[u] = load_sb(bcol, k * a.w_biases.ld, L.esz);
          }
        }
#pragma unroll
        for (int u = 0; u < kNUnroll; ++u) {
          const int64_t k = k0 + (int64_t)u * KS;
          if (k >= K) continue;
          Sc sc;
          if constexpr (fp) sc = Sc{fp_scale<F>(rs[u]), gdec};
          else sc = Sc{sb_to_f(rs[u], sdt), sb_to_f(rb[u], sdt)};
          float v[8];
          decode8<F>(raw[u], sc, L, v);
#pragma unroll
          for (int m = 0; m < kNTile; ++m) {
            if (m0 + m >= L.M) break;
            const float xk = load_x1_rt(xb + ((m0 + m) * a.x.ld + k) * xsz, L.xk);  // same for the warp
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[m][j] = fmaf(xk, v[j], acc[m][j]);
          }
        }
      }
      // -- add the KS k-splits in a fixed order --
#pragma unroll
      for (int m = 0; m < kNTile; ++m)
#pragma unroll
        for (int j = 0; j < 8; ++j) red[tid][m * 8 + j] = acc[m][j];
      __syncthreads();
      for (int e = tid; e < L.S * kNTile * 8; e += kThreads) {
        const int s = e / (kNTile * 8), mj = e % (kNTile * 8), m = mj / 8, j = mj % 8;
        const int64_t n = (strip0 + s) * 8 + j;
        if (m0 + m >= L.M || strip0 + s >= nstrips) continue;
        float sum = red[s][mj];
        for (int q = 1; q < KS; ++q) sum += red[q * L.S + s][mj];
        store_out(a, b, m0 + m, n, sum * wmul);
      }
      __syncthreads();
    }
  }
}

// ---------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------
int ilog2(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

// Pipelined steps per thread below which launch_t halves the threads per row.
// 4 is what the H100 tuning runs settled on (sm_90a, M = 1, 16384^2): with
// the software pipeline it moved nvfp4 from 163 to 131 us and mxfp8 from 209
// to 178 us (bench/results/qmm-small-m-h100-notes.md; table of record
// bench/results/qmm-h100.md). It was the QQ_QMV_STEPS environment variable
// while tuning: a constant now, because it picks the grid and with it the
// order of the sums, which no inherited environment should change. To tune it
// again, edit it here and run bench/tune/qmv_tune.sh.
constexpr int kQmvSteps = 4;

// Returns false, launching nothing, where x quantized in the launch (XQS) would cost more
// than ops.cuh's qx_work_ok allows on this grid.
template <typename XT, int F, int MT, bool kNarrow>
bool launch_t(const MatmulArgs& a, Launch L, cudaStream_t st, const QX& X = QX{}) {
  constexpr int R = kNarrow ? 1 : t_rows<MT>();
  constexpr int U = kNarrow ? 4 : t_unroll<MT>();
  // Threads per row: fewer threads per row means more pipelined steps per
  // thread (loads in flight for longer, less time in the reduction); more
  // means more threads in all. Halve T (from 256, down to a warp) while every
  // thread would get fewer than kQmvSteps steps and the grid is more than one
  // wave: the CTAs of this kernel resident at once on the device the call runs
  // on (2 per SM at its 112-128 registers, not the 8 that 2048 threads would be).
  static const int resident = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, qmv_t_kernel<XT, F, MT, kNarrow>, kThreads, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      b = 0;
    }
    return b > 0 ? b : 1;
  }();
  const int64_t slots = (int64_t)sm_count(a.out.device) * resident, wave = slots * kThreads;
  const int64_t groups = (a.N + R - 1) / R * a.out.batch();
  // The share of its waves' CTA slots a grid of t threads per row fills (1: whole waves);
  // T is not halved into a grid below 0.8 (6144 x 4096 mxfp8 at M = 1: 384 CTAs on 264
  // slots, 1.45 waves, measured slower than 768 at T = 64).
  auto filled = [&](int t) {
    const int64_t ctas = (groups + kThreads / t - 1) / (kThreads / t), waves = (ctas + slots - 1) / slots;
    return (double)ctas / (double)(waves * slots);
  };
  int T = kThreads;
  while (T > 32 && (L.C < (int64_t)T * U ||
                    (L.C < (int64_t)T * U * kQmvSteps && groups * T > wave && filled(T / 2) >= 0.8)))
    T >>= 1;
  L.T = T;
  L.logT = ilog2(T);
  L.G = kThreads / T;
  const int64_t rows_per_cta = (int64_t)L.G * R;
  const dim3 grid((unsigned)((a.N + rows_per_cta - 1) / rows_per_cta),
                  (unsigned)(a.out.batch() < 65535 ? a.out.batch() : 65535));
  const size_t smem = std::is_same<XT, XQS>::value ? qx_smem_bytes(X.rows, a.K) : 0;
  if (std::is_same<XT, XQS>::value && !qx_work_ok((int64_t)grid.x * grid.y, X.rows, a.K)) return false;
  qmv_t_kernel<XT, F, MT, kNarrow><<<grid, kThreads, smem, st>>>(a, L, X);
  return true;
}

// wide T kernels: x dtype and M tile at compile time
template <typename XT, int F>
void launch_t_wide(const MatmulArgs& a, const Launch& L, cudaStream_t st) {
  if (a.M <= 1) launch_t<XT, F, 1, false>(a, L, st);
  else launch_t<XT, F, 4, false>(a, L, st);  // M <= kQmvMaxM (qmv() checks)
}

template <int F>
void launch_n(const MatmulArgs& a, Launch L, cudaStream_t st) {
  // strip lanes: at least 8 (a 32-byte sector of fp4), up to a warp; fewer
  // strip lanes means more k-splits per CTA and more CTAs for small N
  const int64_t nstrips = a.N / 8;
  int S = 8;
  while (S < 32 && nstrips / S > 4 * 132) S <<= 1;
  L.S = S;
  L.logS = ilog2(S);
  const dim3 grid((unsigned)((nstrips + S - 1) / S), (unsigned)(a.out.batch() < 65535 ? a.out.batch() : 65535));
  qmv_n_kernel<F><<<grid, kThreads, 0, st>>>(a, L);
}

// Kernels compiled: wide T (x dtype x 5 formats x 3 M tiles = 45), narrow T
// (x dtype at run time, one M tile; affine of every width through AFFG: 4), N
// (x dtype at run time: 6).
template <typename XT>
void dispatch_wide(const MatmulArgs& a, const Launch& L, int F, cudaStream_t st) {
  switch (F) {
    case FP4NV: launch_t_wide<XT, FP4NV>(a, L, st); break;
    case FP4MX: launch_t_wide<XT, FP4MX>(a, L, st); break;
    case FP8: launch_t_wide<XT, FP8>(a, L, st); break;
    case AFF4: launch_t_wide<XT, AFF4>(a, L, st); break;
    default: launch_t_wide<XT, AFF8>(a, L, st); break;
  }
}

qqStatus_t dispatch(const MatmulArgs& a, const Launch& L, int F, bool narrow, cudaStream_t st) {
  if (a.transpose && !narrow) {
    switch (a.x.dt) {
      case DType::F32: dispatch_wide<XF32>(a, L, F, st); break;
      case DType::F16: dispatch_wide<XF16>(a, L, F, st); break;
      default: dispatch_wide<XBF16>(a, L, F, st); break;
    }
  } else if (a.transpose) {  // the narrow path is the slow path: one M tile of 4
    switch (F) {
      case FP4NV: launch_t<XRT, FP4NV, 4, true>(a, L, st); break;
      case FP4MX: launch_t<XRT, FP4MX, 4, true>(a, L, st); break;
      case FP8: launch_t<XRT, FP8, 4, true>(a, L, st); break;
      default: launch_t<XRT, AFFG, 4, true>(a, L, st); break;  // any bits, 8-element chunks
    }
  } else {
    switch (F) {
      case FP4NV: launch_n<FP4NV>(a, L, st); break;
      case FP4MX: launch_n<FP4MX>(a, L, st); break;
      case FP8: launch_n<FP8>(a, L, st); break;
      case AFF4: launch_n<AFF4>(a, L, st); break;
      case AFF8: launch_n<AFF8>(a, L, st); break;
      default: launch_n<AFFG>(a, L, st); break;
    }
  }
  return check_launch("quantized_matmul");
}

}  // namespace

qqStatus_t qmv(const MatmulArgs& a, cudaStream_t stream, const QX* qx) {
  if (a.M < 1 || a.M > kQmvMaxM || a.x_packed || !a.w_packed) return QQ_STATUS_NOT_SUPPORTED;
  if (a.w_blocked && !a.transpose) return QQ_STATUS_NOT_SUPPORTED;  // the API refuses it already
  const QSpec& q = a.q;
  Launch L{};
  L.M = (int)a.M;
  L.bits = q.bits;
  int F;
  if (q.mode == QQ_MODE_NVFP4) F = FP4NV;
  else if (q.mode == QQ_MODE_MXFP4) F = FP4MX;
  else if (q.mode == QQ_MODE_MXFP8) F = FP8;
  else F = q.bits == 4 ? AFF4 : (q.bits == 8 ? AFF8 : AFFG);
  if (F == FP8) {
    L.f8_kind = q.elem;
    if (q.elem != ELEM_E4M3 && q.elem != ELEM_E5M2) return QQ_STATUS_NOT_SUPPORTED;
    const Fp8Bf16 f8 = fp8_bf16(q.elem == ELEM_E4M3);
    L.f8_shl = f8.shl, L.f8_shr = f8.shr, L.f8_mag = f8.mag, L.f8_fix = f8.fixf;
    L.f8_ulim = (uint32_t)(254 - f8.fix);
    L.f8_nan_mask = f8.nan_mask, L.f8_nan_add = f8.nan_add;
  }
  if (q.fp() ? (q.group != (F == FP4NV ? 16 : 32)) : (q.group != 32 && q.group != 64 && q.group != 128))
    return QQ_STATUS_NOT_SUPPORTED;
  if (!q.fp()) {
    if (q.bits < 2 || q.bits > 8 || q.bits == 7) return QQ_STATUS_NOT_SUPPORTED;
    if (a.w_scales.dt != a.w_biases.dt || a.w_scales.dt == DType::U8 || a.w_scales.dt == DType::I32)
      return QQ_STATUS_NOT_SUPPORTED;
    L.esz = dtype_size(a.w_scales.dt);
  }
  if (a.x.dt != DType::F32 && a.x.dt != DType::F16 && a.x.dt != DType::BF16) return QQ_STATUS_NOT_SUPPORTED;
  L.xvec = aligned(a.x, 16) ? 1 : 0;  // 8 x values = 16 or 32 bytes from an aligned row start
  L.xk = a.x.dt == DType::F32 ? 0 : (a.x.dt == DType::BF16 ? 1 : 2);

  const int64_t row_bytes = a.transpose ? a.K * q.bits / 8 : a.N * q.bits / 8;
  bool narrow = false;
  if (a.transpose) {
    // wide chunks: 16-byte aligned rows of whole chunks
    narrow = !(aligned(a.w, 16) && row_bytes % 16 == 0) || F == AFFG;
    L.C = narrow ? a.K / 8 : row_bytes / 16;
  } else {
    L.C = a.K;
    L.wvec = (F != AFFG && aligned(a.w, q.bits)) ? 1 : 0;  // 8 elements = 4 or 8 bytes
  }
  if (qx) {
    // x quantized in the launch: the wide fp kernels at M = 1 (qqmm's mxfp8 decode: qmma
    // takes the other small-M calls), q(x) within ops.cuh's bound
    // (one work item: the kernel fills q(x) once, for the rows of qx)
    if (a.M != 1 || qx->rows != 1 || a.out.batch() != 1 || !a.transpose || narrow || !q.fp() || !qx_fits(a.M, a.K))
      return QQ_STATUS_NOT_SUPPORTED;
    bool launched;
    switch (F) {
      case FP4NV: launched = launch_t<XQS, FP4NV, 1, false>(a, L, stream, *qx); break;
      case FP4MX: launched = launch_t<XQS, FP4MX, 1, false>(a, L, stream, *qx); break;
      default: launched = launch_t<XQS, FP8, 1, false>(a, L, stream, *qx); break;
    }
    return launched ? check_launch("qqmm") : QQ_STATUS_NOT_SUPPORTED;
  }
  return dispatch(a, L, F, narrow, stream);
}

}  // namespace cuda
}  // namespace qq
