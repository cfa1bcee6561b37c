// cuda/quantize.cu - row-wise quantization (qqQuantize) on the GPU.
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
// per word with byte permutes) and stores whole words. Scale bytes go out in
// the same pass (ScaleStore): the blocked layout's through shared memory, a
// block's 32-byte sectors at a time (its padding rows and columns staged as
// zero), the linear layout's four groups to a 4-byte store (16-bit x) or a
// thread's own (fp32 x, whose loads go through shared memory: kStagedX); no
// memset is needed. Column-wise and MoE layouts: colwise.cu.
// (v1: one thread per 8 elements with shuffles, threshold-compare E2M1.)
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

// A thread's kGroups scale bytes, consecutive in both layouts: nvfp4's two in one 2-byte
// store where the scales buffer is 2-byte aligned (then so is sp: g0 is even, and so are
// the linear layout's groups per row and the blocked layout's row offsets; a C caller's
// buffer may be odd). Two byte stores a thread, scattered over the blocked layout's
// 512-byte blocks, kept the L2 at 97 % busy with DRAM at 75 % (ncu, 16384^2 nvfp4).
template <int kGroups> __device__ __forceinline__ void store_codes(uint8_t* sp, uint32_t codes) {
  if (kGroups == 2 && ((uintptr_t)sp & 1) == 0) {
    *reinterpret_cast<uint16_t*>(sp) = (uint16_t)codes;
  } else {
#pragma unroll
    for (int k = 0; k < kGroups; ++k) sp[k] = (uint8_t)(codes >> (8 * k));
  }
}

// How a thread's kGroups scale bytes reach the scales buffer:
//  kDirect: stored by the thread (store_codes), to either layout.
//  kGather: where a row's groups are a multiple of 4, the lanes of four consecutive groups
//    (4 / kGroups of them: the 4 of an mx group each, nvfp4's pairs) gather their scale bytes
//    into one 4-byte store by the first. mxfp8 at 8192 x 5120 went 0.75 -> 0.82 of copy
//    bandwidth on the H200, 16384^2 0.85 -> 0.89 (one byte store a thread before); nvfp4 and
//    mxfp4 within noise (bench/results/quantize-h200-profile.md, session z).
//  kStaged (blocked layout): a block takes 8 rows of one 128-row block, 16 threads a row
//    (staged_row_pos), whose scale bytes in each 4-column tile of the layout are one whole
//    32-byte sector. The block gathers them in shared memory and writes them in 16-byte
//    stores; directly, each row's 4 bytes of a tile were a store to its own sector. H200,
//    16384^2 from bf16: nvfp4 0.82 -> 0.84 of copy bandwidth, mxfp4 0.94 -> 0.96, mxfp8
//    0.88 -> 0.95 (blocked now as fast as linear); from fp32 nvfp4 0.69 -> 0.79; 8192 x 5120
//    from bf16 0.64 / 0.71 / 0.81 -> 0.68 / 0.73 / 0.86 (quantize-h200-profile.md, session al).
//  kStagedX: kStaged's blocks with x's loads coalesced through shared memory (fp32 x, 32
//    elements a thread), for either layout (linear: 8 consecutive rows a block, each thread
//    storing its own scale bytes). A thread's 128 bytes of fp32 x in eight 16-byte loads put
//    32 lines under each load instruction; coalesced, 16 lanes read 256 contiguous bytes.
//    H200, 16384^2 from fp32, blocked scales, two rounds: nvfp4 0.78 -> 0.97 of copy, mxfp4
//    0.81-0.82 -> 0.98-0.99, mxfp8 0.81-0.82 -> 0.97; 8192 x 5120 0.70-0.76 -> 0.85-0.90;
//    linear scales 0.80-0.83 -> 0.93-0.96 (quantize-h200-profile.md, session al).
//    From 16-bit x it was slower (nvfp4 0.83 -> 0.77, mxfp4 0.94 -> 0.86; session z's
//    probe of the same idea found the same), so 16-bit x keeps its own loads.
enum ScaleStore { kDirect, kGather, kStaged, kStagedX };

// Which (batch entry, row, unit) a thread of a kStaged / kStagedX launch takes. Blocked
// scales: block x holds rows 128 (x / 16) + 2 (x % 16) + {0, 1} + 32 {0, 1, 2, 3} over all
// batch entries (each entry's rows are padded to a multiple of 128, so no 128-row block spans
// two); linear: rows 8 x .. 8 x + 7, those past the last with p.r = s.rows (no row: as a
// padding row). Thread t: row t / 16, unit 16 blockIdx.y + t % 16. The grid: staged_grid.
constexpr int kStageT = 16;  // threads a row
constexpr int kStageR = kRowThreads / kStageT;  // rows a block
__device__ __forceinline__ RowPos staged_row_pos(const Shape& s, bool blocked) {
  const uint32_t t = threadIdx.x / kStageT, x = blockIdx.x;
  uint32_t row = blocked ? (x / 16) * 128 + (x % 16) * 2 + (t & 1) + (t >> 1) * 32 : x * kStageR + t;
  const bool past = row >= s.nrows;  // (linear only: the blocked grid is exact)
  RowPos p = place_row(s, past ? s.nrows - 1 : row, blockIdx.y * kStageT + threadIdx.x % kStageT);
  if (past) p.r = s.rows;
  return p;
}
inline bool staged_grid_fits(const Shape& s) { return (s.chunks + kStageT - 1) / kStageT <= 65535; }
inline dim3 staged_grid(Shape& s) {
  s.nrows = (uint32_t)(s.total / s.chunks);  // blocked: a multiple of 128 (prows is)
  return dim3((s.nrows + kStageR - 1) / kStageR, (unsigned int)((s.chunks + kStageT - 1) / kStageT));
}

// The kN = G * kGroups elements of one unit at row r of batch entry b, groups g0 ..: their
// codes to data, their kGroups scale bytes returned (group k in byte k).
template <typename T, int G, int kGroups>
__device__ __forceinline__ uint32_t quantize_unit(const QuantizeArgs& a, const Shape& s, int64_t b, int64_t r,
                                                  uint32_t g0, const RawRow<T, G * kGroups>& x) {
  constexpr int kN = G * kGroups;
  const float enc = (G == 16 && a.gs) ? nvfp4_enc(a.gs[b * a.gs_stride]) : 1.0f;

  uint8_t* dst = (uint8_t*)a.data.ptr + (b * s.rows + r) * a.data.cols + (int64_t)g0 * G * a.q.bits / 8;
  const bool fp4 = G == 16 || a.q.bits == 4;
  uint32_t out[kN / 4];  // fp4: the first kN / 8 words; fp8: all
  uint32_t codes = 0;    // the groups' scale bytes, group k in byte k
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const float amax = x.absmax(k * G, G);
    // nvfp4 is the only group of 16
    const FpGroupScale gsc = fp_group_scale(amax, G == 16, enc, a.q.elem, a.q.floor_rounding);
    const float f = gsc.factor;
    const bool nan_group = gsc.nan_group;
    codes |= (uint32_t)gsc.code << (8 * k);
    if (fp4 && kMxfp4Bf16x2<T, G>) {
      // mxfp4 from bf16: the codes two elements an instruction (quant.cuh)
#pragma unroll
      for (int i = 0; i < G / 8; ++i) {
        const uint32_t* xw = x.w + k * G / 2 + 4 * i;
        const uint32_t w4[4] = {xw[0], xw[1], xw[2], xw[3]};
        out[k * G / 8 + i] = e2m1x8_encode_mx(w4, f) & (nan_group ? 0u : ~0u);  // (a mask: no branch)
      }
    } else if (fp4) {
#pragma unroll
      for (int i = 0; i < G / 8; ++i) {
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = x.get(k * G + 8 * i + j) * f;
        out[k * G / 8 + i] = e2m1x8_code(y, nan_group);
      }
    } else {
#pragma unroll
      for (int i = 0; i < G; i += 2) {
        const float lo = x.get(k * G + i) * f, hi = x.get(k * G + i + 1) * f;
        const uint32_t pr = fp8x2_code(a.q.elem, lo, hi, nan_group);
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
  return codes;
}

// x's 16-byte units through shared memory, coalesced (kStagedX, and affine's fp32 rows):
// kStride threads load a segment's units (load i of thread l: unit kStride i + l; those at or
// past `live` are not loaded, unless kAll says every unit is) into slots swizzled by coal_slot (unit u at u ^ (u / 8 % 8):
// conflict-free for these writers and for coal_get's readers); after the caller's barrier
// each thread reads back its own kU consecutive units.
__device__ __forceinline__ uint32_t coal_slot(uint32_t u) { return u ^ ((u >> 3) & 7); }
template <int kU, int kStride, bool kAll = false>
__device__ __forceinline__ void coal_put(uint4* xs, const uint4* src, uint32_t l, uint32_t live = 0) {
  uint4 v[kU];
#pragma unroll
  for (int i = 0; i < kU; ++i) {
    const uint32_t u = i * kStride + l;
    // (the address forms each caller measured with: guarded loads at src + u; kAll's with
    // src + l and a constant offset, where src + u took a 64-bit add a load)
    if (kAll || u < live) v[i] = __ldg(kAll ? src + l + i * kStride : src + u);
  }
#pragma unroll
  for (int i = 0; i < kU; ++i) {
    const uint32_t u = i * kStride + l;
    if (kAll || u < live) xs[coal_slot(u)] = v[i];
  }
}
template <int kU>
__device__ __forceinline__ void coal_get(const uint4* xs, uint32_t l, uint4 (&out)[kU]) {
#pragma unroll
  for (int i = 0; i < kU; ++i) out[i] = xs[coal_slot(l * kU + i)];
}

// kStaged: the block's 8 rows x 16 kGroups groups, tile by tile (kTiles of 4 columns), each
// tile's 32 bytes in the blocked layout's order (row r % 32 = 2k + t % 2 at 16 (t % 2), the
// 32-row slice t / 2 at 4 (t / 2), the column at c % 4). Threads of padding rows and past the
// row's end stage zero, so the padding columns of the last tiles come out zero.
template <typename T, int G, int kGroups, bool kCoal>
__device__ __forceinline__ void quantize_fp_staged(const QuantizeArgs& a, const Shape& s) {
  constexpr int kTiles = kStageT * kGroups / 4;
  __shared__ __align__(16) uint8_t stage[kTiles * 32];
  constexpr int kN = G * kGroups;
  const bool blocked = !kCoal || a.q.blocked;  // (kStaged: blocked scales only)
  const RowPos p = staged_row_pos(s, blocked);
  const uint32_t t = threadIdx.x / kStageT, l = threadIdx.x % kStageT, lg = l * kGroups;
  const bool real = p.r < s.rows;
  RawRow<T, kN> x;
  static_assert(kN * sizeof(T) % 16 == 0, "16-byte units");
  constexpr int kU = kN * (int)sizeof(T) / 16;  // a thread's 16-byte units: 8 (fp32) or 4 (16-bit)
  static_assert(!kCoal || kN == 32, "coalesced loads: 32 elements a thread");
  if constexpr (kCoal) {
    // The row's 16 kU units (its 16 threads' elements) loaded coalesced (coal_put: 16 lanes
    // read 256 contiguous bytes), then each thread's own kU units.
    __shared__ uint4 xs[kRowThreads / kStageT][kStageT * kU];
    if (real) {
      const uint4* src = reinterpret_cast<const uint4*>(a.x.at<T>(p.b, p.r) + (int64_t)blockIdx.y * kStageT * kN);
      coal_put<kU, kStageT>(xs[t], src, l, min((uint32_t)kStageT, (uint32_t)s.chunks - blockIdx.y * kStageT) * kU);
    }
    __syncthreads();
    if (real && p.live) {
      uint4 q[kU];
      coal_get<kU>(xs[t], l, q);
#pragma unroll
      for (int i = 0; i < kU; ++i)
        x.w[4 * i] = q[i].x, x.w[4 * i + 1] = q[i].y, x.w[4 * i + 2] = q[i].z, x.w[4 * i + 3] = q[i].w;
    }
  } else if (real && p.live) {
    x.load(a.x.at<T>(p.b, p.r) + (int64_t)p.chunk * kN);
  }
  const uint32_t codes = p.live && real ? quantize_unit<T, G, kGroups>(a, s, p.b, p.r, (uint32_t)p.chunk * kGroups, x) : 0u;
  if (!blocked) {  // linear: the row's 16 threads' bytes are contiguous already
    if (p.live && real)
      store_codes<kGroups>((uint8_t*)a.scales.ptr + (p.b * s.rows + p.r) * (s.chunks * kGroups) + p.chunk * kGroups,
                           codes);
    return;
  }
  uint8_t* sp = stage + (lg / 4) * 32 + (t & 1) * 16 + (t >> 1) * 4 + lg % 4;
  if (kGroups == 2) *reinterpret_cast<uint16_t*>(sp) = (uint16_t)codes;  // (lg even)
  else *sp = (uint8_t)codes;
  __syncthreads();
  if (threadIdx.x < 2 * kTiles) {
    const int64_t c4 = a.scales.cols, tile = (int64_t)blockIdx.y * kTiles + threadIdx.x / 2;
    if (tile < c4 / 4) {
      // 128-row block blockIdx.x / 16 over all batch entries: batch entry b's blocks start
      // at b * scales.rows * c4 = (b * scales.rows / 128) * 128 * c4 (blocked_offset)
      uint8_t* d = (uint8_t*)a.scales.ptr + (int64_t)(blockIdx.x / 16) * 128 * c4 + tile * 512 +
                   (blockIdx.x % 16) * 32 + (threadIdx.x & 1) * 16;
      *reinterpret_cast<uint4*>(d) = reinterpret_cast<const uint4*>(stage)[threadIdx.x];
    }
  }
}

template <typename T, int G, int kGroups, ScaleStore kStore>
__global__ void __launch_bounds__(kRowThreads) quantize_fp_kernel(QuantizeArgs a, Shape s) {
  constexpr int kN = G * kGroups;
  static_assert(kStore != kGather || kN == 32, "four groups on 4 / kGroups lanes");
  if constexpr (kStore == kStaged || kStore == kStagedX) {
    quantize_fp_staged<T, G, kGroups, kStore == kStagedX>(a, s);
    return;
  }
  const RowPos p = row_pos(s);
  // (every lane of the warp is here: full blocks; with kGather, one row a block, so the
  // gathering lanes of a live lane are live)
  const unsigned live = kStore == kGather ? __ballot_sync(0xffffffffu, p.live) : 0u;
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
      store_codes<kGroups>(sp, 0u);
      return;
    }
  } else {
    sp += (b * s.rows + r) * ng + g0;
  }

  RawRow<T, kN> x;
  x.load(a.x.at<T>(b, r) + (int64_t)g0 * G);
  const uint32_t codes = quantize_unit<T, G, kGroups>(a, s, b, r, g0, x);
  if constexpr (kStore == kGather) {
    uint32_t v = codes;
    if (kGroups == 1) v |= __shfl_down_sync(live, v, 1) << 8;
    v |= __shfl_down_sync(live, v, 4 / kGroups / 2) << 16;
    if ((g0 & 3) == 0) *reinterpret_cast<uint32_t*>(sp) = v;
  } else {
    store_codes<kGroups>(sp, codes);
  }
}

// affine: one thread per 32 elements (four 16-byte loads of bf16), their min/max two
// 16-bit elements per instruction (vec.cuh minmax_nan), the kLanes = group/32 threads
// of a group (1, 2 or 4) combine min/max with shuffles; the scale math runs once per
// thread, the per-element quotient uses the exact reciprocal scheme of affine_encode
// (affine_encode8: one branch per 8 for the rare division; 4- and 8-bit widths at
// compile time). Here s.chunks counts 32-element chunks; the grid packs rows (row_grid).
constexpr int kAff = 32;
template <typename T, int kLanes, int kBits>
__global__ void __launch_bounds__(kRowThreads) quantize_affine_kernel(QuantizeArgs a, Shape s) {
  const RowPos p = row_pos(s);  // affine scales are never blocked: prows == rows
  const bool live = p.live;
  const int64_t chunk = p.chunk, b = p.b, r = p.r;
  const int64_t row = b * s.prows + r;  // over all batch entries
  const int64_t g = chunk / kLanes, ng = s.chunks / kLanes;
  const int bits = kBits ? kBits : a.q.bits;

  constexpr int kWords = kAff * (int)sizeof(T) / 16;
  uint4 raw[kWords];
  const uint4* src = reinterpret_cast<const uint4*>(a.x.at<T>(b, r) + chunk * kAff);
  bool own = true;
  if constexpr (sizeof(T) == 4) {
    // fp32 x, 32 or more threads a row and whole warps: a warp's lanes hold 32 consecutive
    // chunks of one row (4 KB), loaded coalesced through the warp's part of shared memory
    // (coal_put / coal_get), each lane reading back its own 8 units.
    // A thread's eight 16-byte loads put 32 lines under each load instruction. H200, fp32
    // affine4 / affine8 at 16384^2: 0.84 / 0.84 -> 1.01 / 1.01 of copy, 8192 x 5120 0.73 /
    // 0.74 -> 0.89 / 0.90. 16-bit x (four loads a thread, instruction-bound) got slower this
    // way, 0.73 / 0.78 -> 0.68 / 0.74 (quantize-h200-profile.md, session am).
    if (s.tlog >= 5 && (s.chunks & 31) == 0) {
      __shared__ uint4 xs[kRowThreads / 32][32 * kWords];
      const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5;
      coal_put<kWords, 32, true>(xs[w], src - lane * kWords, lane);  // from lane 0's chunk
      __syncwarp();
      coal_get<kWords>(xs[w], lane, raw);
      own = false;
    }
  }
  if (own) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw[i] = __ldg(src + i);
  }
  float wmin, wmax;
  minmax_nan<T, kWords>(raw, &wmin, &wmax);
  float v[kAff];
  unpack_units<T, kAff>(raw, v);
  const int finite = affine_group_range<kLanes>(&wmin, &wmax);
  if (!live) return;

  const AffineParams ap = affine_group_params(wmin, wmax, finite, bits);
  const float scale = ap.scale, bias = ap.bias, inv = ap.inv;
  // 8 elements * bits bits = `bits` whole bytes: encoded 8 at a time. The 4- and 8-bit
  // codes of the 32 elements (16 / 32 bytes) go out in 16-byte stores where the data
  // pointer is 16-byte aligned (rows always are: K is a multiple of the group), else in
  // 4- / 8-byte ones (a C caller's buffer; quantize() checks 4- / 8-byte alignment).
  uint8_t* d = (uint8_t*)a.data.ptr + row * a.data.cols + chunk * kAff * bits / 8;
  uint64_t acc[kAff / 8];
#pragma unroll
  for (int j = 0; j < kAff / 8; ++j) acc[j] = finite ? affine_encode8<kBits>(v + 8 * j, scale, inv, bias, bits) : 0;
  constexpr bool kWide = kBits == 4 || kBits == 8;  // store_affine32's widths
  if (kWide && ((uintptr_t)d & 15) == 0) {
    if constexpr (kWide) store_affine32<kBits>(d, acc);
  } else {
#pragma unroll
    for (int j = 0; j < kAff / 8; ++j) {
      uint8_t* dj = d + j * bits;
      if (bits == 4) *reinterpret_cast<uint32_t*>(dj) = (uint32_t)acc[j];
      else if (bits == 8) *reinterpret_cast<uint2*>(dj) = make_uint2((uint32_t)acc[j], (uint32_t)(acc[j] >> 32));
      else
        for (int i = 0; i < bits; ++i) dj[i] = (uint8_t)(acc[j] >> (8 * i));
    }
  }
  if ((chunk % kLanes) == 0) {
    // stored scale and bias are rounded to x's dtype (docs/formats.md, Affine)
    reinterpret_cast<T*>(a.scales.ptr)[row * ng + g] = store_cast<T>(scale);
    reinterpret_cast<T*>(a.biases.ptr)[row * ng + g] = store_cast<T>(bias);
  }
}

// ---------------------------------------------------------------------------
// launcher
// ---------------------------------------------------------------------------
// 4- and 8-bit codes with their width known at compile time (constant shifts).
template <typename T, int kLanes>
void launch_affine_t(const QuantizeArgs& a, Shape s, dim3 grid, cudaStream_t st) {
  if (a.q.bits == 4) quantize_affine_kernel<T, kLanes, 4><<<grid, kRowThreads, 0, st>>>(a, s);
  else if (a.q.bits == 8) quantize_affine_kernel<T, kLanes, 8><<<grid, kRowThreads, 0, st>>>(a, s);
  else quantize_affine_kernel<T, kLanes, 0><<<grid, kRowThreads, 0, st>>>(a, s);
}

template <typename T>
qqStatus_t launch_quantize_t(const QuantizeArgs& a, Shape s, cudaStream_t st) {
  const int lanes = a.q.group / kVec;
  if (a.q.fp()) {
    // one thread per 32 elements: one group (mx), two (nvfp4) when a row has
    // an even number of groups, else one group of 16
    const int per = (a.q.group == 16 && (s.chunks / lanes) % 2 != 0) ? lanes : lanes * (32 / a.q.group);
    Shape sg = s;
    sg.chunks = s.chunks / per;
    sg.total = s.total / per;
    const dim3 ggrid = row_grid(sg, false);
    // gathered scale stores: 32 elements a thread, groups a row a multiple of 4 (so four
    // groups' lanes are all live), one row a block, a 4-byte aligned scales buffer
    const bool gather = (a.q.group == 32 || per != lanes) && (s.chunks / lanes) % 4 == 0 && sg.tlog == 7 &&
                        ((uintptr_t)a.scales.ptr & 3) == 0;
    // blocked scales staged a block at a time: 16-byte stores into the scales buffer; fp32 x
    // with 32 elements a thread: its loads coalesced through shared memory, either layout
    const bool wide = a.q.group == 32 || per != lanes;
    const bool xstage = wide && staged_grid_fits(sg) &&
                        (!a.q.blocked || ((uintptr_t)a.scales.ptr & 15) == 0);
    const bool staged = a.q.blocked && ((uintptr_t)a.scales.ptr & 15) == 0 && staged_grid_fits(sg);
    if constexpr (sizeof(T) == 4) {
      if (xstage) {
        const dim3 sgrid = staged_grid(sg);
        if (a.q.group == 32) quantize_fp_kernel<T, 32, 1, kStagedX><<<sgrid, kRowThreads, 0, st>>>(a, sg);
        else quantize_fp_kernel<T, 16, 2, kStagedX><<<sgrid, kRowThreads, 0, st>>>(a, sg);
        return check_launch("quantize");
      }
    }
    if (staged) {
      const dim3 sgrid = staged_grid(sg);
      if (a.q.group == 32) quantize_fp_kernel<T, 32, 1, kStaged><<<sgrid, kRowThreads, 0, st>>>(a, sg);
      else if (per == lanes) quantize_fp_kernel<T, 16, 1, kStaged><<<sgrid, kRowThreads, 0, st>>>(a, sg);
      else quantize_fp_kernel<T, 16, 2, kStaged><<<sgrid, kRowThreads, 0, st>>>(a, sg);
    } else if (a.q.group == 32) {
      if (gather) quantize_fp_kernel<T, 32, 1, kGather><<<ggrid, kRowThreads, 0, st>>>(a, sg);
      else quantize_fp_kernel<T, 32, 1, kDirect><<<ggrid, kRowThreads, 0, st>>>(a, sg);
    } else if (per == lanes) {
      quantize_fp_kernel<T, 16, 1, kDirect><<<ggrid, kRowThreads, 0, st>>>(a, sg);
    } else if (gather) {
      quantize_fp_kernel<T, 16, 2, kGather><<<ggrid, kRowThreads, 0, st>>>(a, sg);
    } else {
      quantize_fp_kernel<T, 16, 2, kDirect><<<ggrid, kRowThreads, 0, st>>>(a, sg);
    }
  } else {
    Shape sa = s;  // one thread per 32 elements
    sa.chunks = s.chunks / (kAff / kVec);
    sa.total = s.total / (kAff / kVec);
    const dim3 agrid = row_grid(sa, true);
    if (a.q.group == 32) launch_affine_t<T, 1>(a, sa, agrid, st);
    else if (a.q.group == 64) launch_affine_t<T, 2>(a, sa, agrid, st);
    else launch_affine_t<T, 4>(a, sa, agrid, st);
  }
  return check_launch("quantize");
}

// data is written a group at a time: 8 bytes (nvfp4), 16 (mxfp4, mxfp8);
// affine 4 (4-bit), 8 (8-bit) or 1 byte (2/3/5/6-bit) at a time
int data_align(const QSpec& q) {
  return q.fp() ? (q.mode == QQ_MODE_NVFP4 ? 8 : 16) : (q.bits == 4 ? 4 : (q.bits == 8 ? 8 : 1));
}
Shape row_shape(const QuantizeArgs& a) {
  Shape s;
  s.chunks = a.x.cols / kVec;
  s.rows = a.x.rows;
  s.prows = a.q.blocked ? a.scales.rows : a.x.rows;
  s.total = a.x.batch() * s.prows * s.chunks;
  return s;
}

}  // namespace

// Whether quantize() takes these arguments without an error (quantize_colwise's choice of
// its row-wise half); quantize() returns the error naming the one that fails.
bool quantize_accepts(const QuantizeArgs& a) {
  return aligned(a.x, 16) && aligned(a.data, data_align(a.q)) && row_grid_fits(row_shape(a));
}

qqStatus_t quantize(qqHandle_t h, const QuantizeArgs& a, void* stream) {
  QQ_TRY(check_aligned("quantize", "x", a.x, 16));
  QQ_TRY(check_aligned("quantize", "data", a.data, data_align(a.q)));
  const Shape s = row_shape(a);
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

}  // namespace cuda
}  // namespace qq
