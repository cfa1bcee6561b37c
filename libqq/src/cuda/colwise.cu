// cuda/colwise.cu - quantization along the rows (qqQuantizeColwise: the
// row-wise quantization of x^T without materializing it, optionally of x
// too from the same read) and of the MoE weights [E, D1, D2] with their
// 32x1 / 32x32 scalings (qqQuantizeMoe), on the GPU.
//
// Indexing and bit-exactness: quant.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "../codec.h"
#include "../internal.h"
#include "common.cuh"
#include "quant.cuh"
#include "vec.cuh"

namespace qq {
namespace cuda {
namespace {

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
    const FpGroupScale gsc = fp_group_scale(amax, q.mode == QQ_MODE_NVFP4, enc, q.elem, q.floor_rounding);
    const float f = gsc.factor;
    const bool nan_group = gsc.nan_group;
    sc = gsc.code;
    if (G == 16 || bits == 4) {
#pragma unroll
      for (int i = 0; i < G / 8; ++i) {
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = get(8 * i + j) * f;
        w[i] = e2m1x8_code(y, nan_group);
      }
    } else {
#pragma unroll
      for (int i = 0; i < G; i += 2) {
        // (fp8x2_code's rule in the form this kernel was measured with: the NaN group's
        // test first)
        const uint32_t pr = nan_group ? elem_nan_code(ELEM_E4M3) * 0x0101u
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
    // (Per element: affine_encode8's eight quotients spilled at the 40-register budget of
    // the G = 32 kernel, which also holds the fp modes. The 64- and 128-row groups at 4 and
    // 8 bits with 16-byte aligned x^T codes take quantize_tile_kernel's staged path.)
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

// A group's statistics: fp modes need its amax alone (NaN-propagating: the integer max
// of the magnitudes' bits, NaN above Inf), affine its min, max and whether all are
// finite. Each mode computes only its own (the loops are most of the kernel's work
// besides the encoding).
template <int G, typename Get>
__device__ __forceinline__ void group_stats(bool fp, Get get, float* amax, float* wmin, float* wmax, bool* finite) {
  if (fp) {
    uint32_t m = 0;
#pragma unroll 8
    for (int i = 0; i < G; ++i) m = max(m, f2u(get(i)) & 0x7fffffffu);
    *amax = u2f(m);
    *wmin = *wmax = 0.0f;
    *finite = true;
    return;
  }
  // min and max that pass NaN through: the group is finite exactly when both are (two
  // instructions an element where compare-and-select plus a finiteness test took seven;
  // the sign of a zero min does not matter to affine_params: vec.cuh, minmax_nan)
  float lo = get(0), hi = lo;
#pragma unroll 8
  for (int i = 0; i < G; ++i) {
    const float v = get(i);
    lo = fmin_nan(lo, v);
    hi = fmax_nan(hi, v);
  }
  *amax = 0.0f;
  *finite = is_finite_f(lo) && is_finite_f(hi);
  *wmin = lo, *wmax = hi > 0.0f ? hi : 0.0f;
}

// Where the scale byte of column k's group g (batch entry b; ng = M / G groups, from
// the caller's compile-time G) goes, by the call's scale kind: x^T's linear or blocked
// scales, or the MoE layouts along D1 (32x1: one per column; 32x32: one per tile, from
// its first column). The one home of the rule for the three kernels below.
// col_scale_at: where scale (k, g) goes, with the steps to (k + j, g + h) for the small j,
// h of one colq lane (k % kC == 0, j < kC: k..k + j stay inside one 32-row block; g even
// when h = 1: g, g + 1 share a 4-column group, so blocked_offset steps by 16 and 1 there).
// base null: 32x32 tiles, whose one scale per tile store_tile32_scale places.
struct ColScaleAt {
  uint8_t* base;
  int64_t dk, dg;
};
__device__ __forceinline__ ColScaleAt col_scale_at(const ColwiseArgs& a, int64_t b, int64_t k, int64_t g, int64_t ng) {
  uint8_t* sp = (uint8_t*)a.scales_t.ptr;
  if (a.scale_kind == COL_SCALE_T_LINEAR) return {sp + (b * a.K + k) * ng + g, ng, 1};
  if (a.scale_kind == COL_SCALE_BLOCKED)
    return {sp + b * a.scales_t.rows * a.scales_t.cols + blocked_offset(k, g, a.scales_t.cols), 16, 1};
  if (!a.tile32) return {sp + (b * ng + g) * a.K + k, 1, a.K};
  return {nullptr, 0, 0};
}
// 32x32 tiles (col_scale_at's null base): one scale per tile, stored from its first column.
__device__ __forceinline__ void store_tile32_scale(const ColwiseArgs& a, int64_t b, int64_t k, int64_t g, int64_t ng,
                                                   uint8_t code) {
  if (k % 32 == 0) ((uint8_t*)a.scales_t.ptr)[(b * ng + g) * (a.K / 32) + k / 32] = code;
}
__device__ __forceinline__ void store_col_scale(const ColwiseArgs& a, int64_t b, int64_t k, int64_t g, int64_t ng,
                                                uint8_t code) {
  const ColScaleAt at = col_scale_at(a, b, k, g, ng);
  if (at.base) *at.base = code;
  else store_tile32_scale(a, b, k, g, ng, code);
}

template <typename T, int G, bool kColMajor>
__global__ void __launch_bounds__(kThreads, G > 32 ? 5 : 6) quantize_tile_kernel(ColwiseArgs a, bool vec) {
  __shared__ __align__(16) float xs[kTM * kPitch];  // xs[m * kPitch + k], logical (m, k) of the tile
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

  // ---- affine column groups of 64 / 128 rows: a thread per 32 rows of a column (all 256
  // busy; one thread per group left 2 / 3 of 4 idle, each with a long serial group), the
  // group's min / max / finiteness combined through shared memory; each thread then
  // encodes its 32 rows with the whole group's parameters (affine_params of the same min
  // and max, on every thread of the group: the same bytes as one thread encoding it).
  if constexpr (G > 32) {
    constexpr int kSubs = kTM / 32;  // 4 = kThreads / kTK
    __shared__ float part_lo[kSubs][kTK], part_hi[kSubs][kTK];
    __shared__ int part_fin[kSubs][kTK];
    const int c = threadIdx.x % kTK, sub = threadIdx.x / kTK;
    const int64_t k = k0 + c, m = m0 + (int64_t)sub * 32;
    const float* col = xs + sub * 32 * kPitch + c;
    auto get = [&](int i) { return col[i * kPitch]; };
    float amax, wmin, wmax;
    bool finite;
    group_stats<32>(false, get, &amax, &wmin, &wmax, &finite);
    part_lo[sub][c] = wmin, part_hi[sub][c] = wmax, part_fin[sub][c] = finite;
    __syncthreads();
    const int first = sub / (G / 32) * (G / 32);  // the group's first sub
    // the group's min and max from its subs' (which zero a tie of -0 and +0 keeps does
    // not matter to affine_params)
    wmin = part_lo[first][c], wmax = part_hi[first][c], finite = part_fin[first][c];
#pragma unroll
    for (int j = 1; j < G / 32; ++j) {
      const float lo = part_lo[first + j][c], hi = part_hi[first + j][c];
      wmin = lo < wmin ? lo : wmin;
      wmax = hi > wmax ? hi : wmax;
      finite = finite && part_fin[first + j][c];
    }
    const bool valid = k < K && m < M;  // M % G == 0: a group is all in or all out
    const int bits = a.q.bits;
    float s = 0.0f, bi = 0.0f;
    // 4 and 8 bits with x^T's codes 16-byte aligned (block-uniform): the codes are staged
    // in shared memory and leave as whole pieces of x^T's rows (64 / 128 bytes a column,
    // 16 bytes a lane, consecutive lanes along a row). Each lane writing its own 16-32
    // bytes to a different row of x^T (the path below) used 3.6 of each 32-byte sector
    // and kept the L2 at 89 % busy, DRAM at 28 % (ncu, 16384^2 affine4).
    if ((bits == 4 || bits == 8) && ((uintptr_t)a.data_t.ptr & 15) == 0) {
      float inv = 0.0f;
      s = bi = u2f(0x7fc00000u);
      if (finite) {
        affine_params(wmin, wmax, bits, &s, &bi);
        inv = 1.0f / s;
      }
      uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // the 32 rows' codes: w[0..3] at 4 bits, all at 8
      if (finite) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float v[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) v[i] = get(8 * j + i);
          if (bits == 4) {
            w[j] = (uint32_t)affine_encode8<4>(v, s, inv, bi, 4);
          } else {
            const uint64_t acc = affine_encode8<8>(v, s, inv, bi, 8);
            w[2 * j] = (uint32_t)acc, w[2 * j + 1] = (uint32_t)(acc >> 32);
          }
        }
      }
      // A column's codes are S = bits 16-byte slots (128 rows); slot p of column c sits
      // at c * S + (p ^ swz(c)): the XOR spreads both the writes (lanes along c) and the
      // reads (lanes along p) over all 32 banks.
      const int S = bits;
      auto slot = [S](int cc, int p) { return cc * S + (p ^ ((cc * S / 8) & (S - 1))); };
      uint4* st = reinterpret_cast<uint4*>(xs);  // the tile is read: its space is free
      __syncthreads();
      st[slot(c, sub * (S / 4))] = make_uint4(w[0], w[1], w[2], w[3]);
      if (bits == 8) st[slot(c, sub * 2 + 1)] = make_uint4(w[4], w[5], w[6], w[7]);
      __syncthreads();
      for (int i = threadIdx.x; i < kTK * S; i += kThreads) {
        const int cc = i / S, p = i % S;
        const int64_t kk = k0 + cc, mm = m0 + (int64_t)p * (kTM / S);  // a slot: 128 / S rows
        if (kk < K && mm < M)
          *reinterpret_cast<uint4*>((uint8_t*)a.data_t.ptr + (b * K + kk) * a.data_t.cols + mm * bits / 8) =
              st[slot(cc, p)];
      }
    } else if (valid) {
      uint8_t* dst = (uint8_t*)a.data_t.ptr + (b * K + k) * a.data_t.cols + m * bits / 8;
      encode_group<32>(a.q, enc, amax, wmin, wmax, finite, get, dst, &s, &bi);
    }
    if (valid && sub == first) {
      const int64_t ng = M / G, g = m / G;
      reinterpret_cast<T*>(a.scales_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(s);
      reinterpret_cast<T*>(a.biases_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(bi);
    }
  } else {
  // ---- column groups: thread -> column c = t % 64, groups gi = t / 64, +4, ...
    const int c = threadIdx.x % kTK;
    const int64_t k = k0 + c;
    constexpr int kGroups = kTM / G;
    for (int gi = threadIdx.x / kTK; gi < kGroups; gi += kThreads / kTK) {
      const int64_t m = m0 + (int64_t)gi * G;
      const bool valid = k < K && m < M;  // M % G == 0: a group is all in or all out
      const float* col = xs + gi * G * kPitch + c;
      auto get = [&](int i) { return col[i * kPitch]; };
      float amax, wmin, wmax;
      bool finite;
      group_stats<G>(a.q.fp(), get, &amax, &wmin, &wmax, &finite);
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
        store_col_scale(a, b, k, g, ng, sc);
      }
    }
  }


  // ---- row groups (both orientations from this one read): fp modes whose rows are not
  // 8-byte aligned (colq_kernel takes the others); affine's row-wise half runs as
  // quantize's own kernel (quantize_colwise below), so groups of 64 / 128 never get here
  if (G <= 32 && a.rowwise) {
    constexpr int kRowGroups = kTK / G;
    const QuantizeArgs& r = a.row;
    for (int i = threadIdx.x; i < kTM * kRowGroups; i += kThreads) {
      const int rr = i % kTM, gj = i / kTM;  // consecutive threads: consecutive rows
      const int64_t m = m0 + rr, k = k0 + (int64_t)gj * G;
      if (m >= M || k >= K) continue;  // K % G == 0 here
      const float* row = xs + rr * kPitch + gj * G;
      auto get = [&](int j) { return row[j]; };
      float amax, wmin, wmax;
      bool finite;
      group_stats<G>(a.q.fp(), get, &amax, &wmin, &wmax, &finite);
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
// affine, 4 or 8 bits, from row-major 16-bit or fp32 x (colaff_kernel): column-wise
// quantization as the row-wise affine kernel does it (quantize.cu), with x^T's rows read from
// a tile transposed in shared memory instead of from global memory. A block of 256 threads
// takes 128 rows x 64 columns. 16-bit x: each thread loads, twice, two rows' 16 bytes at the
// same 8 columns and stores 8 words, each the two rows' values of one column (x^T's element
// order, so a column's 32 rows are 4 words of 16 bytes). fp32 x: each thread loads, twice,
// four rows' 16 bytes at the same 4 columns and stores, transposed in registers, 4 units of
// 16 bytes, each one column's four rows (a column's 32 rows are 8 units). After one barrier
// a thread reads its 32 rows of one column in 16-byte reads, takes min / max (two 16-bit
// elements an instruction; minmax_nan), meets the other chunks of its group by shuffles and
// writes its 16 / 32 bytes of codes straight to x^T's row (the four chunks of a column: 64 /
// 128 contiguous bytes). The tile kernel kept the tile as fp32 and read it an element at a
// time (16-bit x: 0.46 / 0.54 of copy for affine 4 / 8-bit at 16384^2 on an H100,
// quantize-h100-profile.md; fp32 x, which it took until session am: 0.62 / 0.68 on an H200).
// ---------------------------------------------------------------------------
// Column-wise launches in bands of kB tiles along M (colq_kernel; colaff_kernel from fp32
// x): block (x, y) takes tile column x / kB (along K) and tile row y * kB + x % kB (along M),
// so the kB blocks whose x^T linear scale bytes share 32-byte sectors (4 bytes a block for
// mx, 8 for nvfp4, 2 x 2-4 for affine) run one after another. Blocks past M return whole
// (before any barrier). Bands of 8 against the plain order, H200, 16384^2: colq 16-bit x
// +1-4 % in the A/B (-1 to +4 % between two full tables), colaff fp32 x +3 / +7 % (affine
// 4 / 8); 8192 x 5120 within -2 % of it; colaff from 16-bit x -1 to -3 %, so it keeps the
// plain order (kB = 1) (logs-2026-12-01an/band_ab).
constexpr int kBand = 8;
inline dim3 band_grid(int64_t ntk, int64_t ntm, int64_t batch, int kB) {
  return dim3((unsigned)(ntk * kB), (unsigned)((ntm + kB - 1) / kB), (unsigned)batch);
}
// whether band_grid's x and y fit the launch limits
inline bool band_fits(int64_t ntk, int64_t ntm, int kB) {
  return ntk * kB <= 2147483647 && (ntm + kB - 1) / kB <= 65535;
}
template <int kB> __device__ __forceinline__ uint32_t band_tk() { return blockIdx.x / kB; }
template <int kB> __device__ __forceinline__ uint32_t band_tm() { return blockIdx.y * kB + blockIdx.x % kB; }

constexpr int kAffTM = 128, kAffTK = 64, kAffThreads = 256;

// Word (c, mp) of the 16-bit transposed tile: column c's 64 words (rows 2mp, 2mp + 1) as 16
// 16-byte units, unit u at u ^ swz(c). swz = (c ^ c >> 3) & 7 puts both the writers (8
// lanes along c with c % 8 fixed, c / 8 varying) and the readers (8 lanes with c % 8
// varying) on 8 different units mod 8: no bank conflicts either way.
__device__ __forceinline__ int aff_word(int c, int mp) {
  return c * (kAffTM / 2) + ((((mp >> 2) ^ ((c ^ (c >> 3)) & 7))) << 2) + (mp & 3);
}
// Unit (c, mq) of the fp32 tile: column c's rows 4mq .. 4mq + 3, column c's 32 units at
// mq ^ swz(c). swz = (c ^ c >> 2) & 7: the writers of one 8-lane phase hold columns 4kc + j
// (kc = 8 consecutive values, j fixed), the readers columns 8w + l (l = 0..7): both land
// on 8 different units mod 8.
__device__ __forceinline__ int aff_unit32(int c, int mq) { return c * (kAffTM / 4) + (mq ^ ((c ^ (c >> 2)) & 7)); }

// A thread's load of colaff_kernel's tile: sizeof(T) rows ld apart (2 of 16-bit x, 4 of
// fp32), each one 16-byte unit of 16 / sizeof(T) columns from p; a vector load where the
// unit lies inside K (kleft columns are left from p), element loads with zeros past K
// where it does not; no load where the rows are past M (live false: M % 32 == 0, so the
// rows all exist or none does).
template <typename T>
__device__ __forceinline__ void aff_load_rows(const T* p, int64_t ld, bool live, int64_t kleft,
                                              uint4 (&r)[sizeof(T)]) {
  constexpr int kE = 16 / (int)sizeof(T);
  using U = std::conditional_t<sizeof(T) == 2, unsigned short, unsigned>;
  if (live && kleft >= kE) {
#pragma unroll
    for (int h = 0; h < (int)sizeof(T); ++h) r[h] = __ldg(reinterpret_cast<const uint4*>(p + h * ld));
    return;
  }
#pragma unroll
  for (int h = 0; h < (int)sizeof(T); ++h) {
    uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int j = 0; j < kE; ++j)
      if (live && j < kleft)  // (16-bit: two elements a word, the first in the low half)
        w[j * 4 / kE] |= (uint32_t)__ldg(reinterpret_cast<const U*>(p + h * ld + j)) << (kE == 8 ? 16 * (j & 1) : 0);
    r[h] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// 16-bit x, 5 blocks an SM (48 registers): 0.74 of copy at 16384^2 where 4 (59 registers)
// gave 0.70-0.72 and 6 (40, spilling) 0.60-0.69; two tiles a block with the second's loads
// issued before the first's encode needed 80-110 registers and ran at 0.56-0.59
// (logs-2026-11-27p/colaff_variants). fp32 x holds twice the tile and twice the loaded
// words: 4 blocks an SM.
template <typename T>
constexpr int kAffBlocks = sizeof(T) == 2 ? 5 : 4;
template <typename T>
constexpr int kAffBand = sizeof(T) == 4 ? kBand : 1;
template <typename T, int G, int kBits>
__global__ void __launch_bounds__(kAffThreads, kAffBlocks<T>) colaff_kernel(ColwiseArgs a) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16-bit or fp32 x");
  constexpr int kUnits = kAffTM * (int)sizeof(T) / 16 / 4;  // 16-byte units of a thread's 32 rows
  __shared__ __align__(16) uint32_t xt[kAffTK * kAffTM * sizeof(T) / 4];
  uint4* xt4 = reinterpret_cast<uint4*>(xt);
  const int64_t M = a.M, K = a.K;
  constexpr int kB = kAffBand<T>;
  const int64_t k0 = (int64_t)band_tk<kB>() * kAffTK, m0 = (int64_t)band_tm<kB>() * kAffTM, b = blockIdx.z;
  if constexpr (kB > 1)
    if (m0 >= M) return;  // a band's tiles past M (the whole block)
  const T* xb = reinterpret_cast<const T*>(a.x.ptr) + a.x.offset(b);

  if constexpr (sizeof(T) == 2) {
    // ---- load: item i = (mp = i / 8, kc = i % 8): rows m0 + 2mp, + 1 at columns k0 + 8kc..
    // (a warp reads 4 rows x 128 contiguous bytes, twice); M % 32 == 0, so both rows exist
    // or neither
    uint4 r[2][2];
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int i = threadIdx.x + it * kAffThreads, mp = i / 8, kc = i % 8;
      const int64_t m = m0 + 2 * mp, k = k0 + 8 * kc;
      aff_load_rows<T>(xb + m * a.x.ld + k, a.x.ld, m < M, K - k, r[it]);
    }
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int i = threadIdx.x + it * kAffThreads, mp = i / 8, kc = i % 8;
      const uint32_t w0[4] = {r[it][0].x, r[it][0].y, r[it][0].z, r[it][0].w};
      const uint32_t w1[4] = {r[it][1].x, r[it][1].y, r[it][1].z, r[it][1].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        xt[aff_word(8 * kc + 2 * j, mp)] = prmt(w0[j], w1[j], 0x5410u);      // column 2j: low halves
        xt[aff_word(8 * kc + 2 * j + 1, mp)] = prmt(w0[j], w1[j], 0x7632u);  // column 2j + 1: high halves
      }
    }
  } else {
    // ---- load: item i = (mq = i / 16, kc = i % 16): rows m0 + 4mq .. + 3 at columns k0 +
    // 4kc .. + 3 (a warp reads 2 rows x 256 contiguous bytes, four times); M % 32 == 0, so
    // the four rows exist or none does
    uint4 r[2][4];
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int i = threadIdx.x + it * kAffThreads, mq = i / 16, kc = i % 16;
      const int64_t m = m0 + 4 * mq, k = k0 + 4 * kc;
      aff_load_rows<T>(xb + m * a.x.ld + k, a.x.ld, m < M, K - k, r[it]);
    }
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int i = threadIdx.x + it * kAffThreads, mq = i / 16, kc = i % 16;
      const uint4* q = r[it];
      xt4[aff_unit32(4 * kc + 0, mq)] = make_uint4(q[0].x, q[1].x, q[2].x, q[3].x);
      xt4[aff_unit32(4 * kc + 1, mq)] = make_uint4(q[0].y, q[1].y, q[2].y, q[3].y);
      xt4[aff_unit32(4 * kc + 2, mq)] = make_uint4(q[0].z, q[1].z, q[2].z, q[3].z);
      xt4[aff_unit32(4 * kc + 3, mq)] = make_uint4(q[0].w, q[1].w, q[2].w, q[3].w);
    }
  }
  __syncthreads();

  // ---- a thread: column c = 8 * warp + lane % 8, rows m0 + 32p .. + 31 (p = lane / 8); the
  // G / 32 chunks of a group are lanes 8 apart
  constexpr int kLanes = G / 32;
  const int lane = threadIdx.x % 32, c = (threadIdx.x / 32) * 8 + lane % 8, p = lane / 8;
  uint4 raw[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u)
    raw[u] = sizeof(T) == 2 ? xt4[aff_word(c, 16 * p + 4 * u) / 4] : xt4[aff_unit32(c, kUnits * p + u)];
  float wmin, wmax;
  minmax_nan<T, kUnits>(raw, &wmin, &wmax);
  const int finite = affine_group_range<kLanes, 8>(&wmin, &wmax);
  const int64_t k = k0 + c, m = m0 + 32 * p;
  if (k >= K || m >= M) return;
  const AffineParams ap = affine_group_params(wmin, wmax, finite, kBits);
  const float scale = ap.scale, bias = ap.bias, inv = ap.inv;
  uint64_t acc[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float v[8];
    unpack_units<T, 8>(raw + j * (int)sizeof(T) / 2, v);  // (chunk j: 1 unit of 16-bit x, 2 of fp32)
    acc[j] = finite ? affine_encode8<kBits>(v, scale, inv, bias, kBits) : 0;
  }
  store_affine32<kBits>((uint8_t*)a.data_t.ptr + (b * K + k) * a.data_t.cols + m * kBits / 8, acc);
  if (p % kLanes == 0) {
    // stored scale and bias are rounded to x's dtype (docs/formats.md, Affine)
    const int64_t ng = M / G, g = m / G;
    reinterpret_cast<T*>(a.scales_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(scale);
    reinterpret_cast<T*>(a.biases_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(bias);
  }
}

template <typename T, int G>
void launch_colaff_g(const ColwiseArgs& a, cudaStream_t st) {
  const dim3 grid = band_grid((a.K + kAffTK - 1) / kAffTK, (a.M + kAffTM - 1) / kAffTM, a.x.batch(), kAffBand<T>);
  if (a.q.bits == 4) colaff_kernel<T, G, 4><<<grid, kAffThreads, 0, st>>>(a);
  else colaff_kernel<T, G, 8><<<grid, kAffThreads, 0, st>>>(a);
}
template <typename T>
qqStatus_t launch_colaff_t(const ColwiseArgs& a, cudaStream_t st) {
  switch (a.q.group) {
    case 32: launch_colaff_g<T, 32>(a, st); break;
    case 64: launch_colaff_g<T, 64>(a, st); break;
    default: launch_colaff_g<T, 128>(a, st); break;
  }
  return check_launch("quantize_colwise");
}

// ---------------------------------------------------------------------------
// fp modes from row-major x (colq_kernel), the common case of training (x and
// dy of every GEMM, both orientations). A block is 4 warps stacked along M
// over the same 32 * kC columns (kC = 8 / sizeof(T): 4 for 16-bit x, 2 for
// fp32); a warp owns a strip of 32 rows (one mx group or two nvfp4 groups of
// each column), a lane kC adjacent columns. A lane issues its 32 row loads of
// 8 bytes before the first use (a warp reads 256 contiguous bytes of each
// row) and keeps each column's amax as an integer max of the magnitude bits
// (two 16-bit columns per instruction). The codes of x^T's rows are staged in
// shared memory and leave as 128 (fp8) or 64 (fp4) contiguous bytes per row
// of x^T: written straight from the lane that encodes them (16-32 bytes to a
// different row per lane), the stores kept the L2 at 79 % busy with the DRAM
// at 53 % (ncu, 16384^2 mxfp8). Row-wise groups of G columns span G / kC
// lanes: their row maxima are reduce-scattered over those lanes (each scale
// computed once) and each lane encodes its own kC values. The tile kernel
// above (0.55-0.73 of copy bandwidth for these modes) stays for rows that are not
// 8-byte aligned (column-major MoE weights: moe_t_kernel below, where 16-byte
// aligned), and for affine where colaff_kernel does not take it (widths other than
// 4 and 8, rows of x or x^T's codes not 16-byte aligned, M > 65535 * 128;
// these strips with affine encoding were no faster than the tile kernel:
// instruction-bound at 4 blocks an SM).
// ---------------------------------------------------------------------------
constexpr int kColThreads = 128, kStrip = 32, kColWarps = kColThreads / 32;
constexpr int kColRows = kStrip * kColWarps;  // rows of M a block covers (128)

// Column j (0 <= j < 8 / sizeof(T)) of an 8-byte row slice, as fp32.
template <typename T> __device__ __forceinline__ float slice_get(uint2 w, int j) {
  if (sizeof(T) == 4) return u2f(j == 0 ? w.x : w.y);
  const uint32_t h = j < 2 ? w.x : w.y;
  if (std::is_same<T, __half>::value)
    return __half2float(__ushort_as_half((unsigned short)((j & 1) ? h >> 16 : h & 0xffff)));
  return u2f((j & 1) ? (h & 0xffff0000u) : (h << 16));  // bf16
}
// The magnitude bits of the slice's columns: per 32-bit word, two 16-bit
// magnitudes (16-bit types) or one (fp32). Non-negative floats order like
// their bits and NaN lies above +Inf, so integer maxima of these are the
// NaN-propagating amax of group_stats.
template <typename T> __device__ __forceinline__ uint2 slice_mag(uint2 w) {
  const uint32_t m = sizeof(T) == 4 ? 0x7fffffffu : 0x7fff7fffu;
  return make_uint2(w.x & m, w.y & m);
}
template <typename T> __device__ __forceinline__ uint32_t mag_max(uint32_t a, uint32_t b) {
  return sizeof(T) == 4 ? max(a, b) : __vmaxu2(a, b);
}
// Magnitude bits (as slice_mag keeps them) of column j -> fp32 value.
template <typename T> __device__ __forceinline__ float mag_get(uint2 m, int j) { return slice_get<T>(m, j); }

// Where a colq lane sits: kC columns from k0, the 32-row strip from m0 of its warp, inside the
// block's kColRows x 32 * kC tile at (mb0, kb0) of batch entry b.
template <typename T> struct ColqPos {
  static constexpr int kC = 8 / (int)sizeof(T);  // columns per lane: 4 (16-bit x), 2 (fp32)
  int lane, warp;
  int64_t b, kb0, k0, mb0, m0;
  int rows;   // rows of the warp's strip: 32, 16 in nvfp4's last strip when M % 32 == 16, or none
  int ncols;  // live columns of the lane (0 past K: it still joins the shuffles)
  __device__ __forceinline__ ColqPos(const ColwiseArgs& a) {
    lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    kb0 = (int64_t)band_tk<kBand>() * 32 * kC, k0 = kb0 + lane * kC;
    mb0 = (int64_t)band_tm<kBand>() * kColRows, m0 = mb0 + warp * kStrip;
    b = blockIdx.z;
    rows = (int)max((int64_t)0, min((int64_t)kStrip, a.M - m0));
    ncols = (int)max((int64_t)0, min((int64_t)kC, a.K - k0));
  }
};

// The lane's 32 rows of 8 bytes (zeros past M and K), all loads issued before any use.
template <typename T>
__device__ __forceinline__ void colq_load(const ColwiseArgs& a, const ColqPos<T>& p, uint2 (&w)[kStrip]) {
  constexpr int kC = ColqPos<T>::kC;
  const T* xp = reinterpret_cast<const T*>(a.x.ptr) + a.x.offset(p.b) + p.m0 * a.x.ld + p.k0;
  if (p.ncols == kC && p.rows == kStrip) {
    // a whole strip, row by row from one pointer (the predicated form below takes ~10
    // instructions a row for its address)
    const T* xr = xp;
#pragma unroll
    for (int r = 0; r < kStrip; ++r, xr += a.x.ld) w[r] = ld_stream8(xr);
    return;
  }
  if (p.ncols == kC) {
#pragma unroll
    for (int r = 0; r < kStrip; ++r) w[r] = r < p.rows ? ld_stream8(xp + r * a.x.ld) : make_uint2(0u, 0u);
    return;
  }
  // the ragged last columns: element by element
#pragma unroll
  for (int r = 0; r < kStrip; ++r) {
    uint32_t e[kC];
#pragma unroll
    for (int j = 0; j < kC; ++j) {
      e[j] = 0;
      if (r < p.rows && j < p.ncols) {
        if (sizeof(T) == 4) e[j] = __ldg(reinterpret_cast<const uint32_t*>(xp + r * a.x.ld + j));
        else e[j] = __ldg(reinterpret_cast<const unsigned short*>(xp + r * a.x.ld + j));
      }
    }
    w[r] = sizeof(T) == 4 ? make_uint2(e[0], e[kC - 1]) : make_uint2(e[0] | (e[1 % kC] << 16), e[2 % kC] | (e[3 % kC] << 16));
  }
}

// x^T's rows of the block out of shared memory (row sr = j * 32 + lane of `so` holds column
// kb0 + lane * kC + j, `pitch` bytes apart): 16-, 8- or 4-byte units where aligned,
// consecutive threads along a row. Called by every thread after a __syncthreads.
template <typename T>
__device__ __forceinline__ void colq_store_xt(const ColwiseArgs& a, const ColqPos<T>& p, const uint8_t* so, int pitch) {
  constexpr int kC = ColqPos<T>::kC;
  const int bits = a.q.bits;
  const int vbytes = (int)(min((int64_t)kColRows, a.M - p.mb0) * bits / 8);  // valid bytes a row
  uint8_t* base = (uint8_t*)a.data_t.ptr + p.b * a.K * a.data_t.cols + p.mb0 * bits / 8;
  // x^T's rows are 4-byte aligned at least (M % 16 == 0 for nvfp4, % 32 otherwise), 16
  // only where their length is a multiple of 16 bytes
  const int64_t al = vbytes | a.data_t.cols | (int64_t)(uintptr_t)base;
  const int ub = al % 16 == 0 ? 16 : (al % 8 == 0 ? 8 : 4), units = (kColRows * bits / 8) / ub;
  for (int i = threadIdx.x; i < 32 * kC * units; i += kColThreads) {
    const int sr = i / units, u = i % units;
    const int64_t k = p.kb0 + (sr % 32) * kC + sr / 32;
    if (k >= a.K || u * ub >= vbytes) continue;
    const uint8_t* src = so + sr * pitch + u * ub;
    uint8_t* d = base + k * a.data_t.cols + u * ub;
    if (ub == 16) *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(src);
    else if (ub == 8) *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(src);
    else *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(src);
  }
}

// colq_kernel's staged scale bytes (ssc[j][l][g]: block column l * kC + j, block group g) out
// to x^T's linear scales, a row's GB bytes (8 or 4) in one store. Called by every thread
// after a __syncthreads; the block's 128 rows of M are all in x.
template <typename T, int GB>
__device__ __forceinline__ void colq_store_scales(const ColwiseArgs& a, const ColqPos<T>& p,
                                                  const uint8_t (*ssc)[32][GB]) {
  constexpr int kC = ColqPos<T>::kC;
  constexpr int kG = kColRows / GB;  // the group size
  uint8_t* sp = (uint8_t*)a.scales_t.ptr;
  const int64_t ng = a.M / kG;
  for (int t = threadIdx.x; t < 32 * kC; t += kColThreads) {
    const int l = t % 32, j = t / 32;  // consecutive threads: consecutive lanes' entries
    const int64_t k = p.kb0 + l * kC + j;
    if (k >= a.K) continue;
    uint8_t* d = sp + (p.b * a.K + k) * ng + p.mb0 / kG;
    if constexpr (GB == 8) *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(ssc[j][l]);
    else *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(ssc[j][l]);
  }
}

// The reduce-scatter of colq_kernel's row maxima: at offset O, a lane keeps the half
// of its 2 * O * kOwn words on its side of bit O and takes the max with its partner's
// copy of that half. Recursion on O (compile time): every index is a constant, so p[]
// stays in registers.
template <typename T, int kOwn, int O, int kW>
__device__ __forceinline__ void scatter_max(uint32_t (&p)[kW], int lane) {
  constexpr int h = O * kOwn;  // half of the words held before this exchange
  const bool up = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < h; ++i) {
    const uint32_t send = up ? p[i] : p[i + h], keep = up ? p[i + h] : p[i];
    p[i] = mag_max<T>(keep, __shfl_xor_sync(0xffffffffu, send, O));
  }
  if constexpr (O > 1) scatter_max<T, kOwn, O / 2>(p, lane);
}

template <typename T, int G, bool kRow>
__global__ void __launch_bounds__(kColThreads, 4) colq_kernel(ColwiseArgs a) {
  constexpr int kC = ColqPos<T>::kC;
  constexpr int kGroups = kStrip / G;  // groups per column: 1 (mx), 2 (nvfp4)
  // x^T's codes of the block: row sr = j * 32 + lane holds column kb0 + lane * kC + j
  // (consecutive lanes in consecutive rows: a pitch of an odd number of 16-byte units
  // keeps the lanes' 16-byte stores free of bank conflicts), kColRows * bits / 8 bytes each
  constexpr int kPitchMax = kColRows + 16;
  __shared__ __align__(16) uint8_t so[32 * kC * kPitchMax];
  const ColqPos<T> p(a);
  if (p.mb0 >= a.M) return;  // a band's tiles past M (the whole block)
  const int lane = p.lane, warp = p.warp, rows = p.rows, ncols = p.ncols;
  const int64_t M = a.M, K = a.K, k0 = p.k0, m0 = p.m0, b = p.b;
  const QSpec& q = a.q;
  const int pitch = kColRows * q.bits / 8 + 16;
  uint2 w[kStrip];
  colq_load<T>(a, p, w);
  const float enc = a.gs ? nvfp4_enc(*a.gs) : 1.0f;
  // nvfp4: the element factor enc / e4m3(s) of every scale byte s, one per thread (the block
  // is 128 threads), filled while the strip's loads are in flight. Per group that is a table
  // read where the division took most of the group's ~45 scale instructions (ncu per-SASS-line
  // counts, quantize-h100-profile.md).
  __shared__ float nv_factor[G == 16 ? 128 : 1];
  if constexpr (G == 16) {
    static_assert(kColThreads == 128, "one factor per thread");
    nv_factor[threadIdx.x] = nvfp4_elem_factor((uint8_t)threadIdx.x, enc);
    __syncthreads();
  }
  const auto group_scale = [&](float amax) {
    if constexpr (G == 16) return nvfp4_group_scale(amax, enc, [&](uint8_t c) { return nv_factor[c & 0x7f]; });
    else return fp_group_scale(amax, false, enc, q.elem, q.floor_rounding);
  };

  // ---- column groups
  uint2 cm[kGroups];
#pragma unroll
  for (int h = 0; h < kGroups; ++h) {
    uint2 m = make_uint2(0u, 0u);
#pragma unroll
    for (int r = h * G; r < h * G + G; ++r) {
      const uint2 v = slice_mag<T>(w[r]);
      m = make_uint2(mag_max<T>(m.x, v.x), mag_max<T>(m.y, v.y));
    }
    cm[h] = m;
  }
  float tile_amax = 0.0f;
  if (G == 32 && a.tile32) {
    // one amax per 32x32 tile: this thread's kC columns, then the 32 / kC lanes of the
    // tile's columns (K % 32 == 0)
    const uint32_t m2 = mag_max<T>(cm[0].x, cm[0].y);
    tile_amax = sizeof(T) == 4 ? u2f(m2) : mag_get<T>(make_uint2(max(m2 & 0xffffu, m2 >> 16), 0u), 0);
#pragma unroll
    for (int o = 1; o < 32 / kC; o <<= 1) tile_amax = nanmax_f(tile_amax, __shfl_xor_sync(0xffffffffu, tile_amax, o));
  }
  // this lane's column scales: (k0 + j, m0 / G + h) at sat.base[j * sat.dk + h * sat.dg]
  // (one address computation, where a call of store_col_scale each took ~20 instructions)
  const ColScaleAt sat = col_scale_at(a, b, k0, m0 / G, M / G);
  // Staged linear scales: a block whose 128 rows of M are all in x writes its scale bytes
  // of x^T's linear layout from shared memory after the barrier below, a row's kBlockGroups
  // bytes in one store, where each lane stored its bytes one at a time, the lanes ng * kC
  // bytes apart (4 KB at 16384^2 nvfp4): column-wise nvfp4 with linear scales 0.56 -> 0.68 of
  // copy at 16384^2 on an H200, mxfp8 0.68 -> 0.76, fp32 x nvfp4 0.75 -> 0.89. The same
  // staging for the blocked layout (16-byte tile rows) was 3-6 % slower for the fp4 modes and
  // is not taken (quantize-h200-profile.md, session ak). ssc[j][lane][g]: block column
  // lane * kC + j (lanes kBlockGroups bytes apart: no bank conflicts to speak of), the block's
  // group g = warp * kGroups + h (columns past K: left unwritten, and not stored).
  constexpr int kBlockGroups = kColRows / G;  // 8 (nvfp4), 4 (mx)
  __shared__ __align__(16) uint8_t ssc[kC][32][kBlockGroups];
  const bool stage = !a.tile32 && a.scale_kind == COL_SCALE_T_LINEAR && p.mb0 + kColRows <= M &&
                     (M / G) % kBlockGroups == 0 && ((uintptr_t)a.scales_t.ptr % kBlockGroups) == 0;
#pragma unroll
  for (int j = 0; j < kC; ++j) {
    float amax[kGroups];
#pragma unroll
    for (int h = 0; h < kGroups; ++h) amax[h] = (G == 32 && a.tile32) ? tile_amax : mag_get<T>(cm[h], j);
    if (j >= ncols) continue;
    const int64_t k = k0 + j;
    uint8_t* dst = so + (j * 32 + lane) * pitch + warp * kStrip * q.bits / 8;
#pragma unroll
    for (int h = 0; h < kGroups; ++h) {
      if (h * G >= rows) break;
      const FpGroupScale gsc = group_scale(amax[h]);
      const float f = gsc.factor;
      if (G == 16 || q.bits == 4) {
        uint32_t out[G / 8];
        if constexpr (kMxfp4Bf16x2<T, G>) {
          // mxfp4 from bf16: column j of rows 8i .. 8i + 7 as four bf16 pairs (rows 2p, 2p + 1),
          // encoded two elements an instruction (quant.cuh)
          const uint32_t keep = gsc.nan_group ? 0u : ~0u;
#pragma unroll
          for (int i = 0; i < G / 8; ++i) {
            uint32_t xw[4];
#pragma unroll
            for (int pr = 0; pr < 4; ++pr) {
              const uint2 r0 = w[h * G + 8 * i + 2 * pr], r1 = w[h * G + 8 * i + 2 * pr + 1];
              xw[pr] = prmt(j < 2 ? r0.x : r0.y, j < 2 ? r1.x : r1.y, (j & 1) ? 0x7632u : 0x5410u);
            }
            out[i] = e2m1x8_encode_mx(xw, f) & keep;  // a NaN group's codes are 0
          }
        } else {
#pragma unroll
          for (int i = 0; i < G / 8; ++i) {
            float y[8];
#pragma unroll
            for (int t = 0; t < 8; ++t) y[t] = slice_get<T>(w[h * G + 8 * i + t], j) * f;
            out[i] = e2m1x8_code(y, gsc.nan_group);
          }
        }
        uint8_t* d = dst + h * G / 2;
        if (G == 32) {
          *reinterpret_cast<uint4*>(d) = make_uint4(out[0], out[1], out[G / 8 - 2], out[G / 8 - 1]);
        } else {
#pragma unroll
          for (int i = 0; i < G / 8; i += 2) reinterpret_cast<uint2*>(d)[i / 2] = make_uint2(out[i], out[i + 1]);
        }
      } else {
        uint32_t out[G / 4];
#pragma unroll
        for (int i = 0; i < G; i += 2) {
          const uint32_t pr = fp8x2_code(q.elem, slice_get<T>(w[h * G + i], j) * f,
                                         slice_get<T>(w[h * G + i + 1], j) * f, gsc.nan_group);
          out[i / 4] = (i % 4 == 0) ? pr : (out[i / 4] | (pr << 16));
        }
#pragma unroll
        for (int i = 0; i < G / 4; i += 4)
          reinterpret_cast<uint4*>(dst)[i / 4] = make_uint4(out[i], out[i + 1], out[i + 2], out[i + 3]);
      }
      if (stage) ssc[j][lane][warp * kGroups + h] = gsc.code;
      else if (sat.base) sat.base[j * sat.dk + h * sat.dg] = gsc.code;
      else store_tile32_scale(a, b, k, m0 / G + h, M / G, gsc.code);
    }
  }

  // ---- x^T's rows out of shared memory
  __syncthreads();
  colq_store_xt<T>(a, p, so, pitch);
  if (stage) colq_store_scales<T, kBlockGroups>(a, p, ssc);

  // ---- row groups (both orientations from this one read). A row's group of G columns
  // spans kLanes = G / kC lanes. Their partial maxima of all 32 rows are reduced and
  // scattered at once: after the exchange at offset o a lane keeps the half of its rows
  // on its side of bit o, so each lane ends with whole maxima of 32 / kLanes rows, computes
  // those rows' scales (each scale once, not on every lane of the group) and shares the
  // factors through shared memory. 16-bit x packs two rows (r, r + 16) into a word.
  if (kRow) {
    constexpr bool k16 = sizeof(T) == 2;
    constexpr int kLanes = G / kC;
    constexpr int kW = k16 ? kStrip / 2 : kStrip;  // words of row maxima
    constexpr int kOwn = kW / kLanes;              // words a lane ends with
    constexpr int kWarpGroups = 32 / kLanes;       // row groups across a warp
    __shared__ float fsm[kColWarps][kStrip][kWarpGroups];  // factor of (row, group); -1: NaN group
    const QuantizeArgs& ra = a.row;
    const int64_t rng = K / G, g = k0 / G;  // K % G == 0 here: a group is all in or all out
    const bool live = ncols == kC;
    const int gi = lane / kLanes, li = lane % kLanes;
    uint32_t p[kW];
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      if (k16) {
        const uint2 v0 = slice_mag<T>(w[i]), v1 = slice_mag<T>(w[i + kW]);
        const uint32_t a0 = __vmaxu2(v0.x, v0.y), a1 = __vmaxu2(v1.x, v1.y);
        p[i] = __vmaxu2(prmt(a0, a1, 0x5410u), prmt(a0, a1, 0x7632u));  // row i low, row i + 16 high
      } else {
        const uint2 v = slice_mag<T>(w[i]);
        p[i] = max(v.x, v.y);
      }
    }
    scatter_max<T, kOwn, kLanes / 2>(p, lane);
    uint8_t* sp = (uint8_t*)ra.scales.ptr;
#pragma unroll
    for (int i = 0; i < kOwn; ++i) {
#pragma unroll
      for (int hh = 0; hh < (k16 ? 2 : 1); ++hh) {
        const int r = li * kOwn + i + hh * kW;
        const float amax = mag_get<T>(make_uint2(hh ? p[i] >> 16 : p[i], 0u), 0);
        const FpGroupScale gsc = group_scale(amax);
        fsm[warp][r][gi] = gsc.nan_group ? -1.0f : gsc.factor;
        if (live && r < rows) {
          const int64_t mr = m0 + r;
          if (q.blocked) sp[b * ra.scales.rows * ra.scales.cols + blocked_offset(mr, g, ra.scales.cols)] = gsc.code;
          else sp[(b * M + mr) * rng + g] = gsc.code;
        }
      }
    }
    __syncwarp();
    if ((G == 16 || q.bits == 4) && kC == 4) {
      // fp4 from 16-bit x: the lanes of a pair (l, l ^ 1) swap half of rows r, r + 1 so that
      // each encodes 8 codes of one row (one whole e2m1x8_encode instead of two half-empty ones)
      const int par = lane & 1;
#pragma unroll
      for (int r = 0; r < kStrip; r += 2) {  // rows is even (16 or 32)
        if (r >= rows) break;
        const uint2 mine = par ? w[r + 1] : w[r], send = par ? w[r] : w[r + 1];
        const uint2 recv = make_uint2(__shfl_xor_sync(0xffffffffu, send.x, 1), __shfl_xor_sync(0xffffffffu, send.y, 1));
        if (!live) continue;
        const int rm = r + par;
        const float f = fsm[warp][rm][gi];
        const uint2 lo = par ? recv : mine, hi = par ? mine : recv;  // columns in order
        uint32_t c;
        if constexpr (kMxfp4Bf16x2<T, G>) {
          // mxfp4 from bf16: the 8 columns are already bf16 pairs (quant.cuh)
          const uint32_t xw[4] = {lo.x, lo.y, hi.x, hi.y};
          c = e2m1x8_encode_mx(xw, f) & (f < 0.0f ? 0u : ~0u);
        } else {
          float y[8];
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            y[t] = slice_get<T>(lo, t) * f;
            y[t + 4] = slice_get<T>(hi, t) * f;
          }
          c = e2m1x8_code(y, f < 0.0f);  // (f < 0: a NaN group)
        }
        *reinterpret_cast<uint32_t*>((uint8_t*)ra.data.ptr + (b * M + m0 + rm) * ra.data.cols + (k0 - 4 * par) / 2) = c;
      }
    } else {
#pragma unroll
      for (int r = 0; r < kStrip; ++r) {  // unrolled: w[] stays in registers
        if (r >= rows) break;
        if (!live) continue;
        const float f = fsm[warp][r][gi];
        const bool nan_group = f < 0.0f;
        uint8_t* d = (uint8_t*)ra.data.ptr + (b * M + m0 + r) * ra.data.cols + k0 * q.bits / 8;
        if (G == 16 || q.bits == 4) {
          float y[8];
#pragma unroll
          for (int t = 0; t < 8; ++t) y[t] = t < kC ? slice_get<T>(w[r], t) * f : 0.0f;
          const uint32_t c = e2m1x8_code(y, nan_group);
          if (kC == 4) *reinterpret_cast<uint16_t*>(d) = (uint16_t)c;
          else *d = (uint8_t)c;
        } else {
          uint32_t c = 0;
#pragma unroll
          for (int t = 0; t < kC; t += 2) {
            c |= fp8x2_code(q.elem, slice_get<T>(w[r], t) * f, slice_get<T>(w[r], t + 1) * f, nan_group) << (8 * t);
          }
          if (kC == 4) *reinterpret_cast<uint32_t*>(d) = c;
          else *reinterpret_cast<uint16_t*>(d) = (uint16_t)c;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// MoE weights given as the transposed view of an [E, D2, D1] tensor (moe_t_kernel;
// QQGroupedLinear's forward weights): the groups of 32 along D1 are contiguous in the
// physical rows (one per D2 index), and the codes keep that layout, so this is a
// row-wise quantization of the physical rows with MoE scale layouts. A lane takes half a
// group (16 elements: 32 / 64 bytes of loads), the lane pair's amax meets by one shuffle,
// and a warp's 16-byte stores cover 16 rows x 32 contiguous bytes - whole sectors, where
// the tile kernel (0.60-0.74 of copy for MoE weights) wrote them a lane per row. A warp is
// 16 rows of one group; 32x32 tiles join the warp pair's maxima in shared memory.
// Consecutive blocks (blockIdx.x) take consecutive group pairs of the same 32 rows: with
// blockIdx.x along the rows, H200 0.62-0.74 of copy -> 0.67-0.79 (+5-12 %, 1 x 8192 x 5120
// to 32 x 7168 x 2048); two group pairs a block (128 contiguous bytes a row) was slower
// than one (quantize-h200-profile.md, session am).
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kColThreads) moe_t_kernel(ColwiseArgs a) {
  __shared__ float tile_max[kColWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, half = lane & 1;
  const int64_t ng = a.M / 32;  // physical rows: K = D2; groups along M = D1
  const int64_t k = (int64_t)blockIdx.y * 32 + (warp & 1) * 16 + lane / 2;
  const int64_t g = (int64_t)blockIdx.x * 2 + (warp >> 1), b = blockIdx.z;
  const bool live = g < ng;  // K % 32 == 0: the block's 32 rows all exist
  float v[16];
  uint32_t m = 0;
  if (live) {
    load8<T>(a.x.at<T>(b, k) + g * 32 + half * 16, v);
    load8<T>(a.x.at<T>(b, k) + g * 32 + half * 16 + 8, v + 8);
#pragma unroll
    for (int i = 0; i < 16; ++i) m = max(m, f2u(v[i]) & 0x7fffffffu);
  }
  m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));  // the group's amax, NaN-propagating
  if (a.tile32) {
#pragma unroll
    for (int o = 2; o < 32; o <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) tile_max[warp] = u2f(m);
    __syncthreads();
    m = max(f2u(tile_max[warp]), f2u(tile_max[warp ^ 1]));
  }
  if (!live) return;
  const QSpec& q = a.q;
  const FpGroupScale gsc = fp_group_scale(u2f(m), false, 1.0f, q.elem, q.floor_rounding);
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    const uint32_t pr = fp8x2_code(q.elem, v[i] * gsc.factor, v[i + 1] * gsc.factor, gsc.nan_group);
    out[i / 4] = (i % 4 == 0) ? pr : (out[i / 4] | (pr << 16));
  }
  *reinterpret_cast<uint4*>((uint8_t*)a.data_t.ptr + (b * a.K + k) * a.data_t.cols + g * 32 + half * 16) =
      make_uint4(out[0], out[1], out[2], out[3]);
  if (!half) store_col_scale(a, b, k, g, ng, gsc.code);
}

template <typename T>
qqStatus_t launch_colq_t(const ColwiseArgs& a, cudaStream_t st) {
  constexpr int kC = 8 / (int)sizeof(T);
  const dim3 grid = band_grid((a.K + kC * 32 - 1) / (kC * 32), (a.M + kColRows - 1) / kColRows, a.x.batch(), kBand);
  if (a.q.group == 16) {
    if (a.rowwise) colq_kernel<T, 16, true><<<grid, kColThreads, 0, st>>>(a);
    else colq_kernel<T, 16, false><<<grid, kColThreads, 0, st>>>(a);
  } else {
    if (a.rowwise) colq_kernel<T, 32, true><<<grid, kColThreads, 0, st>>>(a);
    else colq_kernel<T, 32, false><<<grid, kColThreads, 0, st>>>(a);
  }
  return check_launch("quantize_colwise");
}

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
  const bool vec = aligned(a.x, 16);
  return on_device(a.x.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    // Blocked padding (rows K..roundup(K,128), columns beyond the groups) is
    // zero: clear the (small) scale buffers first when there is any.
    if (a.scale_kind == COL_SCALE_BLOCKED &&
        (a.scales_t.rows != a.K || a.scales_t.cols * a.q.group != a.M))
      QQ_CUDA_TRY(cudaMemsetAsync(a.scales_t.ptr, 0, (size_t)(a.x.batch() * a.scales_t.rows * a.scales_t.cols), st),
                  "quantize_colwise");
    ColwiseArgs b = a;
    // the fp modes from row-major x whose 8-byte row loads and 8-byte (x^T) stores are
    // aligned, and whose blocks fit band_grid (M < 2^26; K in tiles of 64 columns, fp32's,
    // the narrowest): colq_kernel
    const bool colq = a.q.fp() && !a.x_colmajor && aligned(a.x, 8) && ((uintptr_t)a.data_t.ptr & 7) == 0 &&
                      band_fits((a.K + 63) / 64, (a.M + kColRows - 1) / kColRows, kBand);
    // The fp4 modes from 16-bit x: the row-wise half as quantize's own kernel too (two
    // passes, x read twice) where its 16-byte alignment holds. nvfp4 blocked 0.47 of copy at
    // 16384^2 where colq_kernel's one read of both ran 0.42 (session ak); since the two
    // kernels' scale stores went whole-sector (sessions ak, al) also nvfp4 linear 0.42 ->
    // 0.47 and mxfp4 0.50 -> 0.53 (8192 x 5120: +2-8 %). mxfp8 (the hardware E4M3
    // conversion) and fp32 x were as fast or faster in one read (mxfp8 0.71 against 0.57;
    // quantize-h200-profile.md, sessions ak and al).
    const bool fp_split = a.rowwise && (a.q.mode == QQ_MODE_NVFP4 || a.q.mode == QQ_MODE_MXFP4) &&
                          dtype_size(a.x.dt) == 2 && quantize_accepts(a.row);
    if (a.rowwise && (!a.q.fp() || fp_split)) {
      // affine: the row-wise half as quantize's own kernel, then x^T's kernel below
      // (colaff_kernel or the tile kernel; group 128 is wider than a tile, and for 32 / 64
      // the two passes took 0.65-0.7x the time of the tile kernel doing both:
      // quantize-h100-profile.md)
      QQ_TRY(quantize(h, a.row, stream));
      b.rowwise = false;
    } else if (a.rowwise && a.q.blocked &&
               (a.row.scales.rows != a.M || a.row.scales.cols * a.q.group != a.K)) {
      QQ_CUDA_TRY(cudaMemsetAsync(a.row.scales.ptr, 0,
                                  (size_t)(a.x.batch() * a.row.scales.rows * a.row.scales.cols), st),
                  "quantize_colwise");
    }
    if (a.x_colmajor && aligned(a.x, 16) && ((uintptr_t)a.data_t.ptr & 15) == 0 && a.K / 32 <= 65535 &&
        (a.M / 32 + 1) / 2 <= 2147483647) {
      // the transposed view of MoE weights (mxfp8, D1 and D2 multiples of 32); consecutive
      // blocks take consecutive group pairs of the same 32 physical rows
      const dim3 grid((unsigned)((a.M / 32 + 1) / 2), (unsigned)(a.K / 32), (unsigned)a.x.batch());
      switch (a.x.dt) {
        case DType::F32: moe_t_kernel<float><<<grid, kColThreads, 0, st>>>(b); break;
        case DType::F16: moe_t_kernel<__half><<<grid, kColThreads, 0, st>>>(b); break;
        default: moe_t_kernel<__nv_bfloat16><<<grid, kColThreads, 0, st>>>(b); break;
      }
      return check_launch("quantize_moe");
    }
    // affine 4 / 8-bit from row-major x with 16-byte aligned rows and x^T codes: colaff_kernel
    // (b.rowwise is false here: affine's row-wise half ran above)
    if (!a.q.fp() && (a.q.bits == 4 || a.q.bits == 8) && !a.x_colmajor && aligned(a.x, 16) &&
        ((uintptr_t)a.data_t.ptr & 15) == 0 &&
        band_fits((a.K + kAffTK - 1) / kAffTK, (a.M + kAffTM - 1) / kAffTM,
                  a.x.dt == DType::F32 ? kAffBand<float> : kAffBand<__half>)) {
      switch (a.x.dt) {
        case DType::F32: return launch_colaff_t<float>(b, st);
        case DType::F16: return launch_colaff_t<__half>(b, st);
        default: return launch_colaff_t<__nv_bfloat16>(b, st);
      }
    }
    if (colq && (!b.rowwise || ((uintptr_t)a.row.data.ptr & 3) == 0)) {  // row-wise codes: 4-byte stores
      switch (a.x.dt) {
        case DType::F32: return launch_colq_t<float>(b, st);
        case DType::F16: return launch_colq_t<__half>(b, st);
        default: return launch_colq_t<__nv_bfloat16>(b, st);
      }
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

}  // namespace cuda
}  // namespace qq
