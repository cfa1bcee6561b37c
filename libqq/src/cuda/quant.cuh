// cuda/quant.cuh - what the quantization-family kernels share (quantize.cu,
// dequantize.cu, colwise.cu, layout.cu, amax.cu): block sizes, element
// loads/stores with the CPU's rounding, the row-wise launch shape, and the
// alignment rule of their vector accesses.
//
// Indexing is 64-bit where it can exceed 2^31 (row and batch offsets); group
// and column indices inside a row are 32-bit (the grid caps a row at 2^23
// chunks). The global scale is read on the device; nothing here synchronizes
// with the host.
//
// Bit-exactness: every value goes through the same codec.h functions as the
// CPU backend (GPU-only fast forms there are proven equal by
// scripts/check_e2m1.cpp); no fast-math, and the codecs contain no a*b+c a
// compiler could contract into an FMA.
#ifndef QQ_CUDA_QUANT_CUH_
#define QQ_CUDA_QUANT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "../codec.h"
#include "../internal.h"
#include "common.cuh"  // aligned()

namespace qq {
namespace cuda {

// The packed codes of a group's scaled elements; a NaN group's codes are codec.h's
// elem_nan_code in every byte (docs/formats.md, Scales). quantize.cu, colwise.cu's fp4
// paths and qqmm.cu's seg_qdq_kernel take them from here.
// fp8x2_code: two fp8 codes of the mode's element format, lo in the low byte.
// e2m1x8_code: eight E2M1 codes, y[0] in the low nibble.
// Three places write the same rule in their own form:
// - colwise.cu's encode_group for its fp8 pairs (a select on elem_nan_code);
// - qdq.cuh's qdq_scaled (the same);
// - the mxfp4-from-bf16 encoders (e2m1x8_encode_mx), which AND their codes with a mask of
//   the NaN test: that form relies on E2M1's NaN code being 0.
// These helpers' forms changed those kernels' SASS (checked with sm_90a cuobjdump, session
// bd), so those places keep the forms they were measured with.
__device__ __forceinline__ uint32_t fp8x2_code(int elem, float lo, float hi, bool nan_group) {
  const uint32_t pr = elem == ELEM_E4M3 ? e4m3x2_encode(lo, hi) : e5m2x2_encode(lo, hi);
  return nan_group ? elem_nan_code(ELEM_E4M3) * 0x0101u : pr;
}
__device__ __forceinline__ uint32_t e2m1x8_code(const float (&y)[8], bool nan_group) {
  return nan_group ? elem_nan_code(ELEM_E2M1) * 0x11111111u : e2m1x8_encode(y);
}

// Eight affine codes (codec.h's affine_encode, bit for bit) packed little-endian at `bits`
// bits each (kBits: the width at compile time, 0 = the run-time `bits`). Where affine_fma_ok
// (every group short of ~1e20) the quotients are exact (affine_quotient_fma). Elsewhere the
// reciprocal quotients come first, clamped, and tested on the clamped value
// (affine_band_clamped: 4 instructions where affine_needs_div on the raw quotient takes 7);
// outside the band the code is read from the test's own sum (affine_rn_code), and the exact
// division with round-half-away rounding is taken for the eight behind one branch.
// affine_encode's per-element test-and-divide made every element a divergent branch
// (BSSY / BRA / BSYNC), and a run-time width made every shift a 64-bit variable shift.
// The eight tests are one, on the largest distance (a max a quotient): short-circuiting
// (`||`) made the tests predicated and the sums they share with the codes computed twice,
// and `|=` kept a predicate a quotient for the rare branch.
template <int kBits>
__device__ __forceinline__ uint64_t affine_encode8(const float* v, float scale, float inv, float bias, int bits) {
  const int nb = kBits ? kBits : bits;
  const float n = (float)((1 << nb) - 1);
  uint32_t u[8];  // kAffineCodeBias + code: the bits of 2^23 + code
  if (affine_fma_ok(scale)) {
    // The exact quotient (affine_quotient_fma) rounded half away from zero: 8 instructions an
    // element and no branch. The band test below took as many on its fast path, and about
    // 40 % of warps entered its branch (a quotient within 1e-3 of a .5 boundary among a warp's
    // 256, ~0.2 % each), ~90 instructions a time.
#pragma unroll
    for (int i = 0; i < 8; ++i)
      u[i] = affine_code_exact(v[i] - bias, scale, inv, n) + kAffineCodeBias;
  } else {
    float dmax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float c = affine_clamp((v[i] - bias) * inv, n);
      u[i] = affine_rn_code(c) + kAffineCodeBias;
      dmax = fmaxf(dmax, affine_round_dist(c));
    }
    if (affine_dist_in_band(dmax)) {  // (the quotients again: fewer registers held across)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (affine_band_clamped(affine_clamp((v[i] - bias) * inv, n)))
          u[i] = affine_round_clamped(affine_clamp((v[i] - bias) / scale, n)) + kAffineCodeBias;
    }
  }
  // Packing: Horner's multiply-adds sum u_i * 2^(nb i) in 32 bits, where the biases
  // B * 2^(nb i) wrap to 0 once nb i >= 8 (B's low 24 bits are 0), so one subtraction of
  // what is left removes them: one IMAD a code where bias, shift and or took about 2.5.
  constexpr uint32_t B = kAffineCodeBias;
  if constexpr (kBits == 4) {
    uint32_t w = u[7];
#pragma unroll
    for (int i = 6; i >= 0; --i) w = w * 16u + u[i];
    return w - (B + (B << 4));
  } else if constexpr (kBits == 8) {
    uint32_t lo = u[3], hi = u[7];
#pragma unroll
    for (int i = 2; i >= 0; --i) lo = lo * 256u + u[i], hi = hi * 256u + u[i + 4];
    return (uint64_t)(lo - B) | ((uint64_t)(hi - B) << 32);
  } else {
    uint64_t acc = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc |= (uint64_t)(u[i] - B) << (i * nb);
    return acc;
  }
}

// Reductions over the kLanes lanes of one group, kStride lanes apart (kLanes a power of
// two; quantize's affine kernel: consecutive lanes, a row's 32-element chunks a multiple of
// kLanes so groups never straddle a warp; colaff_kernel: lanes 8 apart). min/max with the CPU backend's
// exact comparisons (fminf/fmaxf may pick either zero of +-0; the CPU's `<` keeps the
// first).
template <int kLanes, int kStride = 1> __device__ __forceinline__ float group_min(float v) {
  static_assert(kLanes * kStride <= 32, "a group's lanes lie in one warp");
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o * kStride);
    v = u < v ? u : v;
  }
  return v;
}
template <int kLanes, int kStride = 1> __device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o * kStride);
    v = u > v ? u : v;
  }
  return v;
}
template <int kLanes, int kStride = 1> __device__ __forceinline__ int group_and(int v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) v &= __shfl_xor_sync(0xffffffffu, v, o * kStride);
  return v;
}

// An affine group from the min and max of each of its chunks (minmax_nan: NaN-propagating),
// the chunks on kLanes lanes kStride apart: returns whether the group is finite (a NaN
// anywhere makes min and max NaN, an Inf shows as one of them) and leaves the group's min
// and max(0, max) in *wmin, *wmax (quantize's affine kernel and colaff_kernel; the rule of
// docs/formats.md, Affine).
template <int kLanes, int kStride = 1>
__device__ __forceinline__ int affine_group_range(float* wmin, float* wmax) {
  int finite = is_finite_f(*wmin) && is_finite_f(*wmax) ? 1 : 0;
  *wmax = *wmax > 0.0f ? *wmax : 0.0f;  // max(0, max(w)): +0 when no element is positive
  if (kLanes > 1) {
    *wmin = group_min<kLanes, kStride>(*wmin);
    *wmax = group_max<kLanes, kStride>(*wmax);
    finite = group_and<kLanes, kStride>(finite);
  }
  return finite;
}
// Its scale, bias and 1 / scale (affine_params); NaN scale and bias for a group that is not
// finite (its codes are 0).
struct AffineParams {
  float scale, bias, inv;
};
__device__ __forceinline__ AffineParams affine_group_params(float wmin, float wmax, int finite, int bits) {
  AffineParams g;
  g.inv = 0.0f;
  if (finite) {
    affine_params(wmin, wmax, bits, &g.scale, &g.bias);
    g.inv = 1.0f / g.scale;
  } else {
    g.scale = g.bias = u2f(0x7fc00000u);
  }
  return g;
}

// The codes of 32 elements (affine_encode8's four words acc[0..3], 4- or 8-bit) stored at
// a 16-byte aligned d: one 16-byte store (4-bit) or two (8-bit). The row-wise and the
// column-wise affine kernels both write a thread's 32 codes this way.
template <int kBits>
__device__ __forceinline__ void store_affine32(uint8_t* d, const uint64_t (&acc)[4]) {
  static_assert(kBits == 4 || kBits == 8, "16-byte stores of 4- or 8-bit codes");
  uint4* o = reinterpret_cast<uint4*>(d);
  if constexpr (kBits == 4) {
    o[0] = make_uint4((uint32_t)acc[0], (uint32_t)acc[1], (uint32_t)acc[2], (uint32_t)acc[3]);
  } else {
    o[0] = make_uint4((uint32_t)acc[0], (uint32_t)(acc[0] >> 32), (uint32_t)acc[1], (uint32_t)(acc[1] >> 32));
    o[1] = make_uint4((uint32_t)acc[2], (uint32_t)(acc[2] >> 32), (uint32_t)acc[3], (uint32_t)(acc[3] >> 32));
  }
}

// Shape counts a row in chunks of kVec elements (one 16-byte load of 16-bit
// data): a dequantize thread writes one chunk, a quantize thread takes
// 32 / kVec of them (quantize.cu).
// Groups of 32 (mx) with E2M1 codes from bf16 x take e2m1x8_encode_mx (codec.h: two elements an
// instruction) where the GPU has no E2M1 conversion: quantize.cu's row-wise and colwise.cu's
// column-wise kernels. H200, mxfp4 16384^2: 0.88 -> 0.94 of copy row-wise, 0.72 -> 0.80
// column-wise (bench/results/quantize-h200-profile.md, session ag).
template <typename T, int G>
constexpr bool kMxfp4Bf16x2 = G == 32 && std::is_same<T, __nv_bfloat16>::value && !kHwE2M1;

constexpr int kVec = 8;
constexpr int kThreads = 256;  // threads per block of the 1D launches and of the tile kernel

template <typename T> __device__ __forceinline__ T store_cast(float v);
template <> __device__ __forceinline__ float store_cast<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 store_cast<__nv_bfloat16>(float v) {
  return __ushort_as_bfloat16(f_to_bf16(v));
}
template <> __device__ __forceinline__ __half store_cast<__half>(float v) { return __ushort_as_half(f_to_fp16(v)); }

template <typename T> __device__ __forceinline__ float load_cast(const T* p);
template <> __device__ __forceinline__ float load_cast<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float load_cast<__nv_bfloat16>(const __nv_bfloat16* p) {
  return bf16_to_f(__bfloat16_as_ushort(*p));
}
template <> __device__ __forceinline__ float load_cast<__half>(const __half* p) {
  return fp16_to_f(__half_as_ushort(*p));
}

// load_cast through the read-only path (ld.global.nc): a load that names the global space
// itself, for pointers the compiler cannot trace to a kernel argument (opaque_ptr), which it
// would otherwise read with generic loads.
template <typename T> __device__ __forceinline__ float ldg_cast(const T* p);
template <> __device__ __forceinline__ float ldg_cast<float>(const float* p) { return __ldg(p); }
template <> __device__ __forceinline__ float ldg_cast<__nv_bfloat16>(const __nv_bfloat16* p) {
  return bf16_to_f(__ldg(reinterpret_cast<const unsigned short*>(p)));
}
template <> __device__ __forceinline__ float ldg_cast<__half>(const __half* p) {
  return fp16_to_f(__ldg(reinterpret_cast<const unsigned short*>(p)));
}

// Shape of one launch: rows of every batch entry (padded to 128 when the
// scales are blocked), chunks of 8 elements per row.
struct Shape {
  int64_t chunks;    // K / 8
  int64_t rows;      // real rows per batch entry (M)
  int64_t prows;     // rows per batch entry the grid covers (M or roundup(M, 128))
  int64_t total;     // batch * prows * chunks threads
  int tlog = 7;      // row_pos: 2^tlog threads of a block per row (row_grid sets it)
  uint32_t nrows = 0;  // rows of all batch entries, total / chunks (row_grid sets it; row_pos
                       // needs it: launch row_pos's kernels only on a grid from row_grid)
};

// Row-wise kernels run on a 2D grid: blockIdx.y * T + threadIdx.x % T = chunk of a row,
// blockIdx.x * R + threadIdx.x / T = row (over all batch entries, padding rows included),
// T = 2^s.tlog threads a row, R = kRowThreads / T rows a block. Index math stays in 32
// bits (64-bit divisions cost more than the encoding itself); only the final byte
// offsets are 64-bit.
constexpr int kRowThreads = 128;
struct RowPos {
  int64_t b, r, chunk;
  bool live;
};
// The batch entry and row of global row `row` (< s.nrows) and unit c: row_pos and
// quantize.cu's staged_row_pos. live: c is a unit of the row. Lanes past the end still join
// the shuffles (full-warp masks) on a clamped copy and write nothing; groups never straddle
// the end (chunks % lanes == 0).
__device__ __forceinline__ RowPos place_row(const Shape& s, uint32_t row, uint32_t c) {
  RowPos p;
  const uint32_t prows = (uint32_t)s.prows;
  const uint32_t b = prows == s.nrows ? 0u : row / prows;  // no division for one batch entry
  p.b = b;
  p.r = row - b * prows;
  p.live = c < (uint32_t)s.chunks;
  p.chunk = p.live ? c : (uint32_t)s.chunks - 1;
  return p;
}
__device__ __forceinline__ RowPos row_pos(const Shape& s) {
  const uint32_t tl = (uint32_t)s.tlog;
  const uint32_t row0 = (blockIdx.x << (7 - tl)) + (threadIdx.x >> tl);
  const bool live_row = row0 < s.nrows;  // the last block may hold up to R - 1 rows past the end
  RowPos p = place_row(s, live_row ? row0 : s.nrows - 1, (blockIdx.y << tl) + (threadIdx.x & ((1u << tl) - 1)));
  p.live = p.live && live_row;
  return p;
}

// The grid of a row-wise launch, setting s.tlog and s.nrows for row_pos. Threads a row:
// 128, or with `pack` the largest power of two T <= kRowThreads that divides the row's
// units, so that no block is partly idle. K = 5120 (160 units of 32 elements) runs on
// two blocks of 128 threads a row, the second with 32 live: 37.5 % of the grid idle,
// holding registers. Same-run A/B at 8192 x 5120 (H100, bench/results/quantize-h100-profile.md):
// packed, affine (54 registers) went 0.77 -> 0.83 of copy; the fp kernels (40 registers)
// 1-4 % slower, so they keep T = 128. Where chunks / T would exceed the grid's 65535, T
// stays 128 (check_row_grid's limits hold either way).
inline dim3 row_grid(Shape& s, bool pack) {
  int t = 7;
  while (pack && t > 0 && (s.chunks & (((int64_t)1 << t) - 1)) != 0) --t;
  if ((s.chunks >> t) > 65535) t = 7;
  s.tlog = t;
  s.nrows = (uint32_t)(s.total / s.chunks);
  const int64_t R = kRowThreads >> t, T = (int64_t)1 << t;
  return dim3((unsigned int)((s.nrows + R - 1) / R), (unsigned int)((s.chunks + T - 1) / T));
}
// The 2D grid's limits: rows (all batch entries) < 2^31, chunks per row < 65535 * 128.
inline bool row_grid_fits(const Shape& s) {
  return s.total / s.chunks < (int64_t)1 << 31 && (s.chunks + kRowThreads - 1) / kRowThreads <= 65535;
}
inline qqStatus_t check_row_grid(const char* op, const Shape& s) {
  if (!row_grid_fits(s))
    return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: %lld rows of %lld elements exceed the GPU grid (2^31 rows, "
                     "8.3M elements per row); split the tensor", op, (long long)(s.total / s.chunks),
                     (long long)(s.chunks * kVec));
  return QQ_STATUS_SUCCESS;
}

// For the kernels with no element-wise fallback, a misaligned argument is the caller's error.
inline qqStatus_t check_aligned(const char* op, const char* name, const Mat& m, int align) {
  if (!aligned(m, align))
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: on the GPU, argument '%s' must start on a %d-byte boundary and have row and batch "
                     "strides that are multiples of %d bytes; pass a contiguous (freshly allocated) tensor", op,
                     name, align, align);
  return QQ_STATUS_SUCCESS;
}

}  // namespace cuda
}  // namespace qq

#endif  // QQ_CUDA_QUANT_CUH_
