// cuda/quantize.cu - quantize, dequantize, swizzle/unswizzle and amax on the GPU.
//
// Versions: v2 (this file). Row-wise fp modes: one thread per 32 elements of
// a row (one mx group, or two nvfp4 groups when a row has an even number of
// them), so the scale math runs once per group with no shuffles and the
// per-thread set-up once per 32 elements; all 16-byte loads are issued
// first; amax of 16-bit inputs is taken two elements per instruction on the
// packed halves. Affine: one thread per 32 elements, the group/32 threads of
// a group combine min/max with warp shuffles. Every thread encodes its own
// elements with the codecs of codec.h (the CPU backend's code; E2M1 in
// software on Hopper is the branch-free magic-number encoder, 8 values packed
// per word with byte permutes) and stores whole words; the group's first
// thread writes the scale, to the linear or the blocked layout directly (no
// second pass). Threads of the blocked layout's padding rows write zero
// scales; the last unit of a row zero-fills the padding columns, so no memset
// is needed either. Column-wise and MoE layouts: the tile kernel further down.
// (v1: one thread per 8 elements with shuffles, threshold-compare E2M1.)
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "../codec.h"
#include "../internal.h"
#include "common.cuh"
#include "vec.cuh"

namespace qq {
namespace cuda {
namespace {

constexpr int kVec = 8;        // elements per thread
constexpr int kThreads = 256;  // threads per block

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

// Reductions over the `lanes` consecutive lanes of one group (lanes is a power
// of two <= 16, and groups never straddle a warp: K/8 is a multiple of lanes).
// min/max with the CPU backend's exact comparisons (fminf/fmaxf may pick
// either zero of +-0; the CPU's `<` keeps the first).
template <int kLanes> __device__ __forceinline__ float group_min(float v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u < v ? u : v;
  }
  return v;
}
template <int kLanes> __device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  return v;
}
template <int kLanes> __device__ __forceinline__ int group_and(int v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) v &= __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Shape of one launch: rows of every batch entry (padded to 128 when the
// scales are blocked), chunks of 8 elements per row.
struct Shape {
  int64_t chunks;    // K / 8
  int64_t rows;      // real rows per batch entry (M)
  int64_t prows;     // rows per batch entry the grid covers (M or roundup(M, 128))
  int64_t total;     // batch * prows * chunks threads
};

// Row-wise kernels run on a 2D grid: blockIdx.x = row (over all batch entries,
// padding rows included), blockIdx.y * kRowThreads + threadIdx.x = chunk of 8
// elements. Index math stays in 32 bits (64-bit divisions cost more than the
// encoding itself); only the final byte offsets are 64-bit.
constexpr int kRowThreads = 128;
struct RowPos {
  int64_t b, r, chunk;
  bool live;
};
__device__ __forceinline__ RowPos row_pos(const Shape& s) {
  RowPos p;
  const uint32_t row = blockIdx.x;
  const uint32_t prows = (uint32_t)s.prows;
  const uint32_t b = prows == gridDim.x ? 0u : row / prows;  // no division for one batch entry
  p.b = b;
  p.r = row - b * prows;
  const uint32_t c = blockIdx.y * kRowThreads + threadIdx.x;
  p.live = c < (uint32_t)s.chunks;
  // Lanes past the end still join the shuffles (full-warp masks) on a clamped
  // copy and write nothing; groups never straddle the end (chunks % lanes == 0).
  p.chunk = p.live ? c : (uint32_t)s.chunks - 1;
  return p;
}

// ---------------------------------------------------------------------------
// quantize kernels
// ---------------------------------------------------------------------------
// fp modes: one thread per kN = 32 elements: one group (mx, G = 32) or two
// (nvfp4, G = 16, when a row has an even number of groups; else one), so the
// scale math runs once per group, no shuffles are needed, and the per-thread
// set-up (grid position, row pointers, the global scale) is paid once per 32
// elements. Here s.chunks counts units of kGroups groups per row. The unit's
// kN * sizeof(T) bytes come in 16-byte loads, all issued before any use.
//
// Raw 16-byte words of kN consecutive elements, and their fp32 values.
template <typename T, int kN> struct RawRow {
  static constexpr int kWords = kN * (int)sizeof(T) / 4;
  uint32_t w[kWords];
  __device__ __forceinline__ void load(const T* p) {
#pragma unroll
    for (int i = 0; i < kWords; i += 4) {
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(p) + i / 4);
      w[i] = q.x; w[i + 1] = q.y; w[i + 2] = q.z; w[i + 3] = q.w;
    }
  }
  __device__ __forceinline__ float get(int i) const {
    if (sizeof(T) == 4) return u2f(w[i]);
    const uint32_t h = (i & 1) ? (w[i / 2] >> 16) : (w[i / 2] & 0xffff);
    if (std::is_same<T, __half>::value) return __half2float(__ushort_as_half((unsigned short)h));
    return u2f((i & 1) ? (w[i / 2] & 0xffff0000u) : (w[i / 2] << 16));  // bf16
  }
  // max |x| over elements [i0, i0 + n) as a float, NaN-propagating (NaN if any
  // element is NaN: non-negative floats order like their bit patterns and NaN
  // lies above +Inf). 16-bit types: two elements per instruction (__vmaxu2 on
  // the packed halves; bf16/f16 -> f32 is monotone and exact, so the max of the
  // converted values is the conversion of the max).
  __device__ __forceinline__ float absmax(int i0, int n) const {
    if (sizeof(T) == 4) {
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < n; ++i) m = max(m, w[i0 + i] & 0x7fffffffu);
      return u2f(m);
    }
    uint32_t m2 = 0;
#pragma unroll
    for (int i = 0; i < n / 2; ++i) m2 = __vmaxu2(m2, w[i0 / 2 + i] & 0x7fff7fffu);
    const uint32_t m = max(m2 & 0xffffu, m2 >> 16);
    if (std::is_same<T, __half>::value) return __half2float(__ushort_as_half((unsigned short)m));
    return u2f(m << 16);
  }
};

template <typename T, int G, int kGroups>
__global__ void __launch_bounds__(kRowThreads) quantize_fp_kernel(QuantizeArgs a, Shape s) {
  constexpr int kN = G * kGroups;
  const RowPos p = row_pos(s);
  if (!p.live) return;
  const int64_t b = p.b, r = p.r;
  // Group indices fit in 32 bits (fewer than 2^24 groups per row: the grid limit).
  const uint32_t g0 = (uint32_t)p.chunk * kGroups, ng = (uint32_t)s.chunks * kGroups;
  const bool pad_row = r >= s.rows;  // blocked-layout padding row: zero scales only

  // Scale bytes of groups g0 .. g0 + kGroups - 1 are consecutive in both
  // layouts (in the blocked one because g0 is a multiple of kGroups <= 2).
  uint8_t* sp = (uint8_t*)a.scales.ptr;
  if (a.q.blocked) {
    // blocked_offset(r, c, C4) split into a row part (64-bit, per block) and a
    // column part (c / 4) * 512 + c % 4, 32-bit.
    const int64_t c4 = a.scales.cols;
    uint8_t* base = sp + b * a.scales.rows * c4 + blocked_offset(r, 0, c4);
    if (g0 + kGroups == ng)  // zero-fill the padding columns of this row
      for (uint32_t c = ng; c < (uint32_t)c4; ++c) base[((c >> 2) << 9) | (c & 3)] = 0;
    sp = base + (((g0 >> 2) << 9) | (g0 & 3));
    if (pad_row) {
#pragma unroll
      for (int k = 0; k < kGroups; ++k) sp[k] = 0;
      return;
    }
  } else {
    sp += (b * s.rows + r) * ng + g0;
  }

  RawRow<T, kN> x;
  x.load(a.x.at<T>(b, r) + (int64_t)g0 * G);
  const float enc = (G == 16 && a.gs) ? nvfp4_enc(*a.gs) : 1.0f;

  uint8_t* dst = (uint8_t*)a.data.ptr + (b * s.rows + r) * a.data.cols + (int64_t)g0 * G * a.q.bits / 8;
  const bool fp4 = G == 16 || a.q.bits == 4;
  uint32_t out[kN / 4];  // fp4: the first kN / 8 words; fp8: all
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const float amax = x.absmax(k * G, G);
    uint8_t sc;
    float f;
    bool nan_group;
    if (G == 16) {  // nvfp4 (the only group of 16)
      sc = nvfp4_scale(amax, enc);
      f = nvfp4_elem_factor(sc, enc);
      nan_group = (sc & 0x7f) == 0x7f;
    } else {
      sc = mx_scale(amax, a.q.elem, a.q.floor_rounding);
      nan_group = sc == 0xff;
      f = nan_group ? 0.0f : ue8m0_inverse(sc);
    }
    sp[k] = sc;
    if (fp4) {
      // a NaN group's codes are 0 (docs/formats.md, Scales)
#pragma unroll
      for (int i = 0; i < G / 8; ++i) {
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = x.get(k * G + 8 * i + j) * f;
        out[k * G / 8 + i] = nan_group ? 0u : e2m1x8_encode(y);
      }
    } else {
#pragma unroll
      for (int i = 0; i < G; i += 2) {
        const float lo = x.get(k * G + i) * f, hi = x.get(k * G + i + 1) * f;
        uint32_t pr = a.q.elem == ELEM_E4M3 ? e4m3x2_encode(lo, hi) : e5m2x2_encode(lo, hi);
        pr = nan_group ? 0x7f7fu : pr;  // a NaN group's codes (fp8: 0x7F)
        const int wi = (k * G + i) / 4;
        out[wi] = (i % 4 == 0) ? pr : (out[wi] | (pr << 16));
      }
    }
  }
  // fp4: kN / 8 words (8 or 16 bytes); fp8: kN / 4 words (32 bytes). data rows
  // are 8-byte aligned (nvfp4) or 16-byte aligned (mx): see quantize().
  if (fp4) {
    if (kN == 16) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(out[0], out[1]);
    } else if (((uintptr_t)dst & 15) == 0) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(out[0], out[1], out[kN / 8 - 2], out[kN / 8 - 1]);
    } else {
      reinterpret_cast<uint2*>(dst)[0] = make_uint2(out[0], out[1]);
      reinterpret_cast<uint2*>(dst)[1] = make_uint2(out[kN / 8 - 2], out[kN / 8 - 1]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN / 4; i += 4)
      reinterpret_cast<uint4*>(dst)[i / 4] = make_uint4(out[i], out[i + 1], out[i + 2], out[i + 3]);
  }
}

// affine: one thread per 32 elements (four 16-byte loads of bf16), the kLanes =
// group/32 threads of a group (1, 2 or 4) combine min/max with shuffles; the
// scale math runs once per thread, the per-element quotient uses the exact
// reciprocal scheme of affine_encode. Here s.chunks counts 32-element chunks.
constexpr int kAff = 32;
template <typename T, int kLanes>
__global__ void __launch_bounds__(kRowThreads) quantize_affine_kernel(QuantizeArgs a, Shape s) {
  const RowPos p = row_pos(s);  // affine scales are never blocked: prows == rows
  const bool live = p.live;
  const int64_t chunk = p.chunk, b = p.b, r = p.r;
  const int64_t row = (int64_t)blockIdx.x;
  const int64_t g = chunk / kLanes, ng = s.chunks / kLanes;
  const int bits = a.q.bits;

  float v[kAff];
  const T* src = a.x.at<T>(b, r) + chunk * kAff;
#pragma unroll
  for (int i = 0; i < kAff; i += kVec) load8<T>(src + i, v + i);
  float wmin = v[0], wmax = 0.0f;
  int finite = 1;
#pragma unroll
  for (int i = 0; i < kAff; ++i) {
    finite &= is_finite_f(v[i]) ? 1 : 0;
    wmin = v[i] < wmin ? v[i] : wmin;
    wmax = v[i] > wmax ? v[i] : wmax;
  }
  if (kLanes > 1) {
    wmin = group_min<kLanes>(wmin);
    wmax = group_max<kLanes>(wmax);
    finite = group_and<kLanes>(finite);
  }
  if (!live) return;

  float scale, bias, inv = 0.0f;
  if (finite) {
    affine_params(wmin, wmax, bits, &scale, &bias);
    inv = 1.0f / scale;
  } else {
    scale = bias = u2f(0x7fc00000u);
  }
  // 8 elements * bits bits = `bits` whole bytes: encode and store 8 at a time
  uint8_t* d = (uint8_t*)a.data.ptr + row * a.data.cols + chunk * kAff * bits / 8;
#pragma unroll
  for (int j = 0; j < kAff / 8; ++j) {
    uint64_t acc = 0;
    if (finite) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc |= (uint64_t)affine_encode(v[8 * j + i], scale, inv, bias, bits) << (i * bits);
    }
    uint8_t* dj = d + j * bits;
    if (bits == 4) *reinterpret_cast<uint32_t*>(dj) = (uint32_t)acc;
    else if (bits == 8) *reinterpret_cast<uint2*>(dj) = make_uint2((uint32_t)acc, (uint32_t)(acc >> 32));
    else
      for (int i = 0; i < bits; ++i) dj[i] = (uint8_t)(acc >> (8 * i));
  }
  if ((chunk % kLanes) == 0) {
    // stored scale and bias are rounded to x's dtype (docs/formats.md, Affine)
    reinterpret_cast<T*>(a.scales.ptr)[row * ng + g] = store_cast<T>(scale);
    reinterpret_cast<T*>(a.biases.ptr)[row * ng + g] = store_cast<T>(bias);
  }
}

// ---------------------------------------------------------------------------
// dequantize kernel: one thread per 8 output elements
// ---------------------------------------------------------------------------
template <typename TO, typename TS>
__global__ void __launch_bounds__(kRowThreads) dequantize_kernel(DequantizeArgs a, Shape s) {
  const RowPos p = row_pos(s);
  if (!p.live) return;
  const int64_t chunk = p.chunk, b = p.b, r = p.r;
  const int64_t row = (int64_t)blockIdx.x;
  const int64_t e0 = chunk * kVec;  // first element
  const int64_t g = e0 / a.q.group;
  const uint8_t* d = a.data.at<uint8_t>(b, r);
  float v[kVec];
  if (a.q.fp()) {
    uint8_t sb;
    if (a.q.blocked) sb = a.scales.at<uint8_t>(b)[blocked_offset(r, g, a.scales.cols)];
    else sb = a.scales.at<uint8_t>(b, r)[g];
    const float f = a.q.mode == QQ_MODE_NVFP4 ? e4m3_decode(sb) : ue8m0_decode(sb);
    if (a.q.bits == 4) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(d + e0 / 2);
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = e2m1_decode((uint8_t)((w >> (4 * i)) & 0xf)) * f;
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(d + e0);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = elem_decode(a.q.elem, (uint8_t)(w.x >> (8 * i))) * f;
        v[i + 4] = elem_decode(a.q.elem, (uint8_t)(w.y >> (8 * i))) * f;
      }
    }
    if (a.q.mode == QQ_MODE_NVFP4 && a.gs) {
      const float gd = nvfp4_dec(*a.gs);
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = v[i] * gd;
    }
  } else {
    const int bits = a.q.bits;
    const float sc = load_cast<TS>(a.scales.at<TS>(b, r) + g);
    const float bi = load_cast<TS>(a.biases.at<TS>(b, r) + g);
    uint64_t acc = 0;
    const uint8_t* p = d + chunk * bits;
    for (int i = 0; i < bits; ++i) acc |= (uint64_t)p[i] << (8 * i);
    const uint32_t mask = (1u << bits) - 1;
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = affine_decode((uint32_t)(acc >> (i * bits)) & mask, sc, bi);
  }
  store8<TO>(reinterpret_cast<TO*>(a.out.ptr) + row * a.out.cols + e0, v);
}

// ---------------------------------------------------------------------------
// swizzle / unswizzle: one thread per blocked byte (padding included)
// ---------------------------------------------------------------------------
__global__ void swizzle_kernel(Mat lin, Mat blk, bool to_blocked, int64_t total) {
  const int64_t t = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (t >= total) return;
  // t enumerates (batch, r, c) over the padded shape; the blocked offset is
  // computed from it, so the linear side is read/written row-major.
  const int64_t per = blk.rows * blk.cols;
  const int64_t b = t / per, rc = t % per;
  const int64_t r = rc / blk.cols, c = rc % blk.cols;
  uint8_t* bp = (uint8_t*)blk.ptr + b * per + blocked_offset(r, c, blk.cols);
  const bool inside = r < lin.rows && c < lin.cols;
  if (to_blocked) {
    *bp = inside ? lin.at<uint8_t>(b, r)[c] : 0;
  } else if (inside) {
    lin.at<uint8_t>(b, r)[c] = *bp;
  }
}

// ---------------------------------------------------------------------------
// amax: grid-stride max |x| per block, then one atomicMax on the bit pattern
// (non-negative floats order like their bits; NaN's bits are above +Inf's, so
// NaN wins, which is what amax promises).
// ---------------------------------------------------------------------------
template <typename T>
__global__ void amax_kernel(Mat x, int64_t total, unsigned int* out) {
  float m = 0.0f;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t col = t % x.cols, row = t / x.cols;
    const int64_t b = row / x.rows, r = row % x.rows;
    m = nanmax_f(m, abs_f(load_cast<T>(x.at<T>(b, r) + col)));
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) m = nanmax_f(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float warp_max[32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < (blockDim.x >> 5) ? warp_max[threadIdx.x] : 0.0f;
#pragma unroll
    for (int o = 16; o; o >>= 1) m = nanmax_f(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) atomicMax(out, f2u(m) & 0x7fffffffu);  // |NaN| keeps NaN bits
  }
}

// ---------------------------------------------------------------------------
// quantize along rows (x^T), optionally along K too, and the MoE 3D weights.
// One block per tile of kTM = 128 rows x kTK = 64 columns: the tile is read
// once (16-byte loads along the contiguous axis) into shared memory as fp32,
// then (a) thread t encodes the column groups of column t % 64 (groups of G
// rows; their packed bytes are contiguous in x^T's row) and (b) when asked,
// the row groups (G columns of one row) for the row-wise outputs. The pitch of
// 65 floats keeps both the column reads (a warp reads 32 consecutive columns
// of one row) and the row reads (32 rows, stride 65) free of bank conflicts.
// ---------------------------------------------------------------------------
constexpr int kTM = 128, kTK = 64, kPitch = kTK + 1;

// Encode G values (get(i)) of one group with the group amax `amax` (the
// group's own, or its 32x32 tile's) into G*bits/8 bytes at dst (4-byte
// aligned). Returns the scale byte (fp modes) or writes *scale / *bias
// (affine, fp32; the caller rounds them to the stored dtype).
template <int G, typename Get>
__device__ __forceinline__ uint8_t encode_group(const QSpec& q, float enc, float amax, float wmin, float wmax,
                                                bool finite, Get get, uint8_t* dst, float* scale, float* bias) {
  constexpr int kMaxWords = G * 8 / 32;  // words for the widest element (8 bits)
  uint32_t w[kMaxWords];
#pragma unroll
  for (int i = 0; i < kMaxWords; ++i) w[i] = 0;
  uint8_t sc = 0;
  const int bits = q.bits;
  // Only the modes a group size can belong to are compiled for it (nvfp4:
  // 16; mx: 32; affine: 32, 64, 128): this keeps the build time in check.
  constexpr bool kFp = G <= 32, kAffine = G >= 32;
  if (kFp && q.fp()) {
    float f;
    bool nan_group;
    if (q.mode == QQ_MODE_NVFP4) {
      sc = nvfp4_scale(amax, enc);
      f = nvfp4_elem_factor(sc, enc);
      nan_group = (sc & 0x7f) == 0x7f;
    } else {
      sc = mx_scale(amax, q.elem, q.floor_rounding);
      nan_group = sc == 0xff;
      f = nan_group ? 0.0f : ue8m0_inverse(sc);
    }
    if (G == 16 || bits == 4) {
#pragma unroll
      for (int i = 0; i < G / 8; ++i) {
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = get(8 * i + j) * f;
        w[i] = nan_group ? 0u : e2m1x8_encode(y);  // a NaN group's codes are 0
      }
    } else {
#pragma unroll
      for (int i = 0; i < G; i += 2) {
        const uint32_t pr = nan_group ? 0x7f7fu
                            : (q.elem == ELEM_E4M3 ? e4m3x2_encode(get(i) * f, get(i + 1) * f)
                                                   : e5m2x2_encode(get(i) * f, get(i + 1) * f));
        w[i / 4] |= pr << (8 * (i % 4));
      }
    }
  } else if (kAffine) {
    // 8 elements * bits bits = `bits` whole bytes: encode and store 8 at a time.
    // (No word array indexed by a run-time bit position: that would live in
    // local memory and slow every mode compiled into this function.)
    float s = u2f(0x7fc00000u), b = s, inv = 0.0f;
    if (finite) {
      affine_params(wmin, wmax, bits, &s, &b);
      inv = 1.0f / s;
    }
    *scale = s;
    *bias = b;
#pragma unroll
    for (int j = 0; j < G / 8; ++j) {
      uint64_t acc = 0;
      if (finite) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc |= (uint64_t)affine_encode(get(8 * j + i), s, inv, b, bits) << (i * bits);
      }
      uint8_t* dj = dst + j * bits;
      if (bits == 4) *reinterpret_cast<uint32_t*>(dj) = (uint32_t)acc;
      else if (bits == 8) *reinterpret_cast<uint2*>(dj) = make_uint2((uint32_t)acc, (uint32_t)(acc >> 32));
      else
        for (int i = 0; i < bits; ++i) dj[i] = (uint8_t)(acc >> (8 * i));
    }
    return 0;
  }
  const int words = G * bits / 32;
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  if (words % 4 == 0 && ((uintptr_t)dst & 15) == 0) {  // 16-byte stores where aligned
#pragma unroll
    for (int i = 0; i + 3 < kMaxWords; i += 4)
      if (i < words) reinterpret_cast<uint4*>(dst)[i / 4] = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
  } else if (words % 2 == 0 && ((uintptr_t)dst & 7) == 0) {
#pragma unroll
    for (int i = 0; i + 1 < kMaxWords; i += 2)
      if (i < words) reinterpret_cast<uint2*>(dst)[i / 2] = make_uint2(w[i], w[i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < kMaxWords; ++i)
      if (i < words) d[i] = w[i];
  }
  return sc;
}

template <typename T, int G, bool kColMajor>
__global__ void __launch_bounds__(kThreads, 6) quantize_tile_kernel(ColwiseArgs a, bool vec) {
  __shared__ float xs[kTM * kPitch];  // xs[m * kPitch + k], logical (m, k) of the tile
  const int64_t M = a.M, K = a.K;
  const int64_t m0 = (int64_t)blockIdx.x * kTM, k0 = (int64_t)blockIdx.y * kTK;
  const int64_t b = blockIdx.z;
  const T* xb = reinterpret_cast<const T*>(a.x.ptr) + a.x.offset(b);
  const float enc = a.gs ? nvfp4_enc(*a.gs) : 1.0f;

  // ---- load: 8 consecutive elements along the contiguous axis per step
  constexpr int kSteps = kTM * kTK / 8 / kThreads;  // 16-byte loads per thread (4)
  if (!kColMajor) {
    // physical rows m, contiguous along k: 8 loaders per row of 64; all loads
    // of a thread are issued before the first shared-memory store
#pragma unroll
    for (int it = 0; it < kSteps; ++it) {
      const int i = it * kThreads + threadIdx.x;
      const int r = i / (kTK / 8), c = (i % (kTK / 8)) * 8;
      const int64_t m = m0 + r, k = k0 + c;
      float v[8];
      if (vec && m < M && k + 8 <= K) {
        load8<T>(xb + m * a.x.ld + k, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = (m < M && k + j < K) ? load_cast<T>(xb + m * a.x.ld + k + j) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) xs[r * kPitch + c + j] = v[j];
    }
  } else {
    // physical rows k (the D2 columns), contiguous along m: 16 loaders per row of 128
#pragma unroll
    for (int it = 0; it < kSteps; ++it) {
      const int i = it * kThreads + threadIdx.x;
      const int c = i / (kTM / 8), r = (i % (kTM / 8)) * 8;
      const int64_t k = k0 + c, m = m0 + r;
      float v[8];
      if (vec && k < K && m + 8 <= M) {
        load8<T>(xb + k * a.x.ld + m, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = (k < K && m + j < M) ? load_cast<T>(xb + k * a.x.ld + m + j) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) xs[(r + j) * kPitch + c] = v[j];
    }
  }
  __syncthreads();

  // ---- column groups: thread -> column c = t % 64, groups gi = t / 64, +4, ...
  {
    const int c = threadIdx.x % kTK;
    const int64_t k = k0 + c;
    constexpr int kGroups = kTM / G;
    for (int gi = threadIdx.x / kTK; gi < kGroups; gi += kThreads / kTK) {
      const int64_t m = m0 + (int64_t)gi * G;
      const bool valid = k < K && m < M;  // M % G == 0: a group is all in or all out
      const float* col = xs + gi * G * kPitch + c;
      auto get = [&](int i) { return col[i * kPitch]; };
      float amax = 0.0f, wmin = col[0], wmax = 0.0f;
      bool finite = true;
#pragma unroll 8
      for (int i = 0; i < G; ++i) {
        const float v = get(i);
        amax = u2f(max(f2u(amax), f2u(v) & 0x7fffffffu));  // NaN-propagating, as above
        finite = finite && is_finite_f(v);
        wmin = v < wmin ? v : wmin;
        wmax = v > wmax ? v : wmax;
      }
      if (a.tile32) {
        // one amax per 32x32 tile: reduce over the 32 columns of this warp
        // (lanes are columns; all lanes run this with the same gi)
        const float t = valid ? amax : 0.0f;
        float r = t;
#pragma unroll
        for (int o = 16; o; o >>= 1) r = nanmax_f(r, __shfl_xor_sync(0xffffffffu, r, o));
        amax = r;
      }
      if (!valid) continue;
      uint8_t* dst = (uint8_t*)a.data_t.ptr + (b * K + k) * a.data_t.cols + m * a.q.bits / 8;
      float s = 0.0f, bi = 0.0f;
      const uint8_t sc = encode_group<G>(a.q, enc, amax, wmin, wmax, finite, get, dst, &s, &bi);
      const int64_t ng = M / G, g = m / G;
      if (!a.q.fp()) {
        reinterpret_cast<T*>(a.scales_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(s);
        reinterpret_cast<T*>(a.biases_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(bi);
      } else {
        uint8_t* sp = (uint8_t*)a.scales_t.ptr;
        if (a.scale_kind == COL_SCALE_T_LINEAR) sp[(b * K + k) * ng + g] = sc;
        else if (a.scale_kind == COL_SCALE_BLOCKED)
          sp[b * a.scales_t.rows * a.scales_t.cols + blocked_offset(k, g, a.scales_t.cols)] = sc;
        else if (!a.tile32) sp[(b * ng + g) * K + k] = sc;
        else if (k % 32 == 0) sp[(b * ng + g) * (K / 32) + k / 32] = sc;
      }
    }
  }

  // ---- row groups (both orientations from this one read)
  if (a.rowwise && G <= kTK) {
    constexpr int kRowGroups = kTK / G;
    const QuantizeArgs& r = a.row;
    for (int i = threadIdx.x; i < kTM * kRowGroups; i += kThreads) {
      const int rr = i % kTM, gj = i / kTM;  // consecutive threads: consecutive rows
      const int64_t m = m0 + rr, k = k0 + (int64_t)gj * G;
      if (m >= M || k >= K) continue;  // K % G == 0 here
      const float* row = xs + rr * kPitch + gj * G;
      auto get = [&](int j) { return row[j]; };
      float amax = 0.0f, wmin = row[0], wmax = 0.0f;
      bool finite = true;
#pragma unroll 8
      for (int j = 0; j < G; ++j) {
        const float v = row[j];
        amax = u2f(max(f2u(amax), f2u(v) & 0x7fffffffu));  // NaN-propagating, as above
        finite = finite && is_finite_f(v);
        wmin = v < wmin ? v : wmin;
        wmax = v > wmax ? v : wmax;
      }
      uint8_t* dst = (uint8_t*)r.data.ptr + (b * M + m) * r.data.cols + k * a.q.bits / 8;
      float s = 0.0f, bi = 0.0f;
      const uint8_t sc = encode_group<G>(a.q, enc, amax, wmin, wmax, finite, get, dst, &s, &bi);
      const int64_t ng = K / G, g = k / G;
      if (!a.q.fp()) {
        reinterpret_cast<T*>(r.scales.ptr)[(b * M + m) * ng + g] = store_cast<T>(s);
        reinterpret_cast<T*>(r.biases.ptr)[(b * M + m) * ng + g] = store_cast<T>(bi);
      } else if (a.q.blocked) {
        ((uint8_t*)r.scales.ptr)[b * r.scales.rows * r.scales.cols + blocked_offset(m, g, r.scales.cols)] = sc;
      } else {
        ((uint8_t*)r.scales.ptr)[(b * M + m) * ng + g] = sc;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------
unsigned int blocks_for(int64_t total) { return (unsigned int)((total + kThreads - 1) / kThreads); }
dim3 row_grid(const Shape& s) {
  return dim3((unsigned int)(s.total / s.chunks), (unsigned int)((s.chunks + kRowThreads - 1) / kRowThreads));
}
// The 2D grid's limits: rows (all batch entries) < 2^31, chunks per row < 65535 * 128.
qqStatus_t check_row_grid(const char* op, const Shape& s) {
  if (s.total / s.chunks >= (int64_t)1 << 31 || (s.chunks + kRowThreads - 1) / kRowThreads > 65535)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: %lld rows of %lld elements exceed the GPU grid (2^31 rows, "
                     "8.3M elements per row); split the tensor", op, (long long)(s.total / s.chunks),
                     (long long)(s.chunks * kVec));
  return QQ_STATUS_SUCCESS;
}

template <typename T>
qqStatus_t launch_quantize_t(const QuantizeArgs& a, Shape s, cudaStream_t st) {
  const int lanes = a.q.group / kVec;
  const dim3 grid = row_grid(s);
  if (a.q.fp()) {
    // one thread per 32 elements: one group (mx), two (nvfp4) when a row has
    // an even number of groups, else one group of 16
    const int per = (a.q.group == 16 && (s.chunks / lanes) % 2 != 0) ? lanes : lanes * (32 / a.q.group);
    Shape sg = s;
    sg.chunks = s.chunks / per;
    sg.total = s.total / per;
    const dim3 ggrid = row_grid(sg);
    if (a.q.group == 32) quantize_fp_kernel<T, 32, 1><<<ggrid, kRowThreads, 0, st>>>(a, sg);
    else if (per == lanes) quantize_fp_kernel<T, 16, 1><<<ggrid, kRowThreads, 0, st>>>(a, sg);
    else quantize_fp_kernel<T, 16, 2><<<ggrid, kRowThreads, 0, st>>>(a, sg);
  } else {
    Shape sa = s;  // one thread per 32 elements
    sa.chunks = s.chunks / (kAff / kVec);
    sa.total = s.total / (kAff / kVec);
    const dim3 agrid = row_grid(sa);
    if (a.q.group == 32) quantize_affine_kernel<T, 1><<<agrid, kRowThreads, 0, st>>>(a, sa);
    else if (a.q.group == 64) quantize_affine_kernel<T, 2><<<agrid, kRowThreads, 0, st>>>(a, sa);
    else quantize_affine_kernel<T, 4><<<agrid, kRowThreads, 0, st>>>(a, sa);
  }
  return check_launch("quantize");
}

template <typename TO>
qqStatus_t launch_dequantize_t(const DequantizeArgs& a, Shape s, cudaStream_t st) {
  const dim3 grid = row_grid(s);
  switch (a.q.fp() ? DType::U8 : a.scales.dt) {
    case DType::F16: dequantize_kernel<TO, __half><<<grid, kRowThreads, 0, st>>>(a, s); break;
    case DType::BF16: dequantize_kernel<TO, __nv_bfloat16><<<grid, kRowThreads, 0, st>>>(a, s); break;
    default: dequantize_kernel<TO, float><<<grid, kRowThreads, 0, st>>>(a, s); break;
  }
  return check_launch("dequantize");
}

// Vector loads and stores need aligned rows: start, row stride and batch
// strides multiples of `align` bytes.
qqStatus_t check_aligned(const char* op, const char* name, const Mat& m, int align) {
  const int es = dtype_size(m.dt);
  bool ok = ((uintptr_t)m.ptr % align) == 0 && (m.ld * es) % align == 0;
  for (int i = 0; i < m.nb; ++i) ok = ok && (m.bstride[i] * es) % align == 0;
  if (!ok)
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: on the GPU, argument '%s' must start on a %d-byte boundary and have row and batch "
                     "strides that are multiples of %d bytes; pass a contiguous (freshly allocated) tensor", op,
                     name, align, align);
  return QQ_STATUS_SUCCESS;
}

}  // namespace

qqStatus_t quantize(qqHandle_t h, const QuantizeArgs& a, void* stream) {
  QQ_TRY(check_aligned("quantize", "x", a.x, 16));
  // data is written a group at a time: 8 bytes (nvfp4), 16 (mxfp4, mxfp8);
  // affine 4 (4-bit), 8 (8-bit) or 1 byte (2/3/5/6-bit) at a time
  const int dalign = a.q.fp() ? (a.q.mode == QQ_MODE_NVFP4 ? 8 : 16) : (a.q.bits == 4 ? 4 : (a.q.bits == 8 ? 8 : 1));
  QQ_TRY(check_aligned("quantize", "data", a.data, dalign));
  Shape s;
  s.chunks = a.x.cols / kVec;
  s.rows = a.x.rows;
  s.prows = a.q.blocked ? a.scales.rows : a.x.rows;
  s.total = a.x.batch() * s.prows * s.chunks;
  QQ_TRY(check_row_grid("quantize", s));
  return on_device(a.x.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    switch (a.x.dt) {
      case DType::F32: return launch_quantize_t<float>(a, s, st);
      case DType::F16: return launch_quantize_t<__half>(a, s, st);
      default: return launch_quantize_t<__nv_bfloat16>(a, s, st);
    }
  });
}

namespace {
template <typename T, bool kColMajor>
qqStatus_t launch_tile_t(const ColwiseArgs& a, bool vec, cudaStream_t st) {
  const dim3 grid((unsigned)((a.M + kTM - 1) / kTM), (unsigned)((a.K + kTK - 1) / kTK), (unsigned)a.x.batch());
  if (kColMajor) {  // only the MoE weights (mxfp8, group 32) come column-major
    quantize_tile_kernel<T, 32, true><<<grid, kThreads, 0, st>>>(a, vec);
  } else {
    switch (a.q.group) {
      case 16: quantize_tile_kernel<T, 16, false><<<grid, kThreads, 0, st>>>(a, vec); break;
      case 32: quantize_tile_kernel<T, 32, false><<<grid, kThreads, 0, st>>>(a, vec); break;
      case 64: quantize_tile_kernel<T, 64, false><<<grid, kThreads, 0, st>>>(a, vec); break;
      default: quantize_tile_kernel<T, 128, false><<<grid, kThreads, 0, st>>>(a, vec); break;
    }
  }
  return check_launch("quantize_colwise");
}
}  // namespace

qqStatus_t quantize_colwise(qqHandle_t h, const ColwiseArgs& a, void* stream) {
  if (a.x.batch() > 65535)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "quantize_colwise: more than 65535 batch entries on the GPU; "
                     "split the batch");
  // 16-byte loads need 16-byte aligned rows; otherwise the kernel loads
  // element by element (correct, slower), as its edge tiles always do.
  const bool vec = check_aligned("quantize_colwise", "x", a.x, 16) == QQ_STATUS_SUCCESS;
  set_error(QQ_STATUS_SUCCESS, "%s", "");
  return on_device(a.x.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    // Blocked padding (rows K..roundup(K,128), columns beyond the groups) is
    // zero: clear the (small) scale buffers first when there is any.
    if (a.scale_kind == COL_SCALE_BLOCKED &&
        (a.scales_t.rows != a.K || a.scales_t.cols * a.q.group != a.M))
      QQ_CUDA_TRY(cudaMemsetAsync(a.scales_t.ptr, 0, (size_t)(a.x.batch() * a.scales_t.rows * a.scales_t.cols), st),
                  "quantize_colwise");
    ColwiseArgs b = a;
    if (a.rowwise && a.q.group > kTK) {
      // affine group 128 is wider than a tile: the row-wise half runs as its own kernel
      QQ_TRY(quantize(h, a.row, stream));
      b.rowwise = false;
    } else if (a.rowwise && a.q.blocked &&
               (a.row.scales.rows != a.M || a.row.scales.cols * a.q.group != a.K)) {
      QQ_CUDA_TRY(cudaMemsetAsync(a.row.scales.ptr, 0,
                                  (size_t)(a.x.batch() * a.row.scales.rows * a.row.scales.cols), st),
                  "quantize_colwise");
    }
    switch (a.x.dt) {
      case DType::F32:
        return a.x_colmajor ? launch_tile_t<float, true>(b, vec, st) : launch_tile_t<float, false>(b, vec, st);
      case DType::F16:
        return a.x_colmajor ? launch_tile_t<__half, true>(b, vec, st) : launch_tile_t<__half, false>(b, vec, st);
      default:
        return a.x_colmajor ? launch_tile_t<__nv_bfloat16, true>(b, vec, st)
                            : launch_tile_t<__nv_bfloat16, false>(b, vec, st);
    }
  });
}

qqStatus_t dequantize(qqHandle_t h, const DequantizeArgs& a, void* stream) {
  Shape s;
  s.chunks = a.out.cols / kVec;
  s.rows = a.data.rows;
  s.prows = s.rows;
  s.total = a.data.batch() * s.rows * s.chunks;
  QQ_TRY(check_row_grid("dequantize", s));
  // fp4 rows are read 4 bytes at a time, fp8 rows 8 (affine bytewise)
  QQ_TRY(check_aligned("dequantize", "w", a.data, a.q.fp() ? a.q.bits : 1));
  QQ_TRY(check_aligned("dequantize", "out", a.out, 16));
  return on_device(a.data.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    switch (a.out.dt) {
      case DType::F32: return launch_dequantize_t<float>(a, s, st);
      case DType::F16: return launch_dequantize_t<__half>(a, s, st);
      default: return launch_dequantize_t<__nv_bfloat16>(a, s, st);
    }
  });
}

qqStatus_t swizzle(qqHandle_t h, const Mat& lin, const Mat& blk, bool to_blocked, void* stream) {
  const int64_t total = lin.batch() * blk.rows * blk.cols;
  return on_device(lin.device, [&]() -> qqStatus_t {
    swizzle_kernel<<<blocks_for(total), kThreads, 0, (cudaStream_t)stream>>>(lin, blk, to_blocked, total);
    return check_launch(to_blocked ? "swizzle_scales" : "unswizzle_scales");
  });
}

qqStatus_t amax(qqHandle_t h, const Mat& x, float* out, void* stream) {
  const int64_t total = x.batch() * x.rows * x.cols;
  return on_device(x.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    QQ_CUDA_TRY(cudaMemsetAsync(out, 0, sizeof(float), st), "amax");
    if (total == 0) return QQ_STATUS_SUCCESS;
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.device);
    const int64_t want = (total + kThreads * 8 - 1) / (kThreads * 8);
    const unsigned int grid = (unsigned int)(want < (int64_t)sms * 8 ? want : (int64_t)sms * 8);
    switch (x.dt) {
      case DType::F32: amax_kernel<float><<<grid, kThreads, 0, st>>>(x, total, (unsigned int*)out); break;
      case DType::F16: amax_kernel<__half><<<grid, kThreads, 0, st>>>(x, total, (unsigned int*)out); break;
      default: amax_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(x, total, (unsigned int*)out); break;
    }
    return check_launch("amax");
  });
}

}  // namespace cuda
}  // namespace qq
