// cuda/dequantize.cu - dequantization (qqDequantize) on the GPU: a thread per
// up to kDqChunks chunks of 8 output elements on the row-wise grid of quant.cuh; fp modes
// (dequantize_fp_kernel, one instance per format) decode with the group's scale (and
// nvfp4's global scale), affine codes (dequantize_affine_kernel) with their group's scale
// and bias, through the codecs of codec.h.
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
// dequantize kernels: each thread U chunks of 8 output elements (U <= kDqChunks, or
// kDqChunksLong for long fp rows), blockDim.x apart along the row (each load and store
// instruction of a warp stays contiguous), U chosen per call so that a row's blocks are all
// (nearly) full.
// All of a thread's loads are issued before it decodes: with one chunk per thread
// the reads in flight (4-8 bytes a thread) were too few to cover DRAM latency, and
// the kernel ran at 0.50-0.63 of copy bandwidth (bench/results/quantize-h100.md).
// ---------------------------------------------------------------------------
constexpr int kDqChunks = 4;
constexpr int kDqChunksLong = 8, kDqLongMin = 6;  // long fp rows (launch_dequantize_t)
constexpr int kDqThreadsMax = 256;  // a block: 32 .. 256 threads (launch_dequantize_t)

// Fast decoding of fp chunks into bf16 / fp32 output (not fp16: its range is smaller),
// in bf16x2 arithmetic: the element bits placed into bf16 fields (vec.cuh's fp4_pairs
// and fp8_place), one multiply by a power of two that undoes the placement (exact: the
// element value, normal in bf16), one by the scale s (an exact bf16: E4M3 or a power
// of two). The product e * s is rounded once, to nearest even, by the bf16 fma: the
// bits f_to_bf16(e * s) gives, e * s being exact in fp32. 2-4 instructions an element
// instead of ~14 through the fp32 codecs. Not taken (fp_chunk_codec is): a NaN
// scale, an fp8 code with an all-ones exponent (the hardware's NaN is not the
// codec's). nvfp4 with a global scale takes the bf16x2 products too, then widens them
// to fp32 (exact), multiplies by the global scale's factor in fp32 and rounds once to the
// output, as the fp32 path does (store8_scaled): 368 -> 212 us at 16384^2 on an H200,
// where the fp32 codecs ran at half the speed of the other fp modes (prefill_probe).
// E4M3 byte b (not NaN) -> bf16 bits of its value times 2^-120 (bits placed as bf16)
__device__ __forceinline__ uint32_t e4m3_bf16_bits(uint32_t b) { return ((b & 0x7fu) << 4) | ((b & 0x80u) << 8); }

// Four bf16x2 words (8 elements in order) to the output.
template <typename TO> __device__ __forceinline__ void store8_bf16x2(TO* p, const uint32_t (&o)[4]);
template <> __device__ __forceinline__ void store8_bf16x2<__nv_bfloat16>(__nv_bfloat16* p, const uint32_t (&o)[4]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(o[0], o[1], o[2], o[3]);
}
template <> __device__ __forceinline__ void store8_bf16x2<float>(float* p, const uint32_t (&o)[4]) {
  float v[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[2 * i] = u2f(o[i] << 16), v[2 * i + 1] = u2f(o[i] & 0xffff0000u);
  store8<float>(p, v);
}

// Eight fp32 values as four bf16x2 words by the hardware conversion: to nearest even, as
// f_to_bf16 for every non-NaN value (overflow to Inf); only a NaN's bits differ.
__device__ __forceinline__ void pack8_bf16x2(const float (&v)[8], uint32_t (&o)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(o[i]) : "f"(v[2 * i + 1]), "f"(v[2 * i]));
}

// Four bf16x2 words (exact products e * s) times nvfp4's global factor gd in fp32, rounded
// once to the output: the fp32 path's v = (e * s) * gd, then store8's rounding
// (pack8_bf16x2: no NaN arises, gd and e * s being finite).
template <typename TO> __device__ __forceinline__ void store8_scaled(TO* p, const uint32_t (&o)[4], float gd) {
  float v[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[2 * i] = __fmul_rn(u2f(o[i] << 16), gd), v[2 * i + 1] = __fmul_rn(u2f(o[i] & 0xffff0000u), gd);
  if constexpr (std::is_same<TO, __nv_bfloat16>::value) {
    uint32_t w[4];
    pack8_bf16x2(v, w);
    store8_bf16x2<TO>(p, w);
  } else {
    store8<TO>(p, v);
  }
}

// Eight affine codes of one group to the output: codec.h's affine_decode, fma(q, scale,
// bias), with q made a float by the 2^23 magic number (exact for q < 2^23; the int -> float
// conversion runs at a quarter of the rate): m[i] holds the bits 0x4b000000 | q, the float
// 2^23 + q. bf16 results are packed by pack8_bf16x2 (its NaN differs from f_to_bf16's:
// redone then). With a finite scale and bias no element is NaN (0 <= q <= 255: no Inf -
// Inf, no 0 * Inf), so one test a chunk stands for eight.
template <typename TO>
__device__ __forceinline__ void affine_store8(TO* p, const uint32_t (&m)[kVec], float sc, float bi) {
  float v[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __fmaf_rn(u2f(m[i]) - 8388608.0f, sc, bi);
  if constexpr (std::is_same<TO, __nv_bfloat16>::value) {
    uint32_t o[4];
    pack8_bf16x2(v, o);
    if (is_finite_f(sc) && is_finite_f(bi)) {
      store8_bf16x2<TO>(p, o);
      return;
    }
  }
  store8<TO>(p, v);
}

// The fp formats, each a kernel of its own (dequantize_fp_kernel): the element width, the
// scale's kind, the group and the fp8 placement are compile-time constants, so that the
// loop holds no mode tests (one kernel for every mode held ~475 branches in its sm_90a
// SASS and ran at 0.66-0.8 of copy bandwidth on an H200, instruction bound:
// bench/results/quantize-h200-profile.md).
enum DqFp : int { kDqNv4 = 0, kDqMx4 = 1, kDqE4M3 = 2, kDqE5M2 = 3 };

// One chunk of 8 fp elements through codec.h's fp32 codecs, rounded once to the output:
// fp16 output (no bf16x2 form: fp16's range is smaller), NaN scales, fp8 codes with an
// all-ones exponent, and fp8 to fp32 below bf16's subnormal precision.
// Out of line where the bf16x2 path is the main one (fewer registers and instructions
// around it); inline for fp16 output, where it is the only one.
template <typename TO, int FM>
__device__ __forceinline__ void fp_chunk_codec_body(TO* o, uint32_t w0, uint32_t w1, uint32_t u, bool gsc, float gd) {
  float v[kVec];
  const float f = FM == kDqNv4 ? e4m3_decode((uint8_t)u) : ue8m0_decode((uint8_t)u);
  if constexpr (FM <= kDqMx4) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = e2m1_decode((uint8_t)((w0 >> (4 * i)) & 0xf)) * f;
  } else {
    constexpr int elem = FM == kDqE4M3 ? ELEM_E4M3 : ELEM_E5M2;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = elem_decode(elem, (uint8_t)(w0 >> (8 * i))) * f;
      v[i + 4] = elem_decode(elem, (uint8_t)(w1 >> (8 * i))) * f;
    }
  }
  if (gsc) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = v[i] * gd;
  }
  store8<TO>(o, v);
}
template <typename TO, int FM>
__device__ __noinline__ void fp_chunk_codec_call(TO* o, uint32_t w0, uint32_t w1, uint32_t u, bool gsc, float gd) {
  fp_chunk_codec_body<TO, FM>(o, w0, w1, u, gsc, gd);
}
template <typename TO, int FM>
__device__ __forceinline__ void fp_chunk_codec(TO* o, uint32_t w0, uint32_t w1, uint32_t u, bool gsc, float gd) {
  if constexpr (std::is_same<TO, __half>::value) fp_chunk_codec_body<TO, FM>(o, w0, w1, u, gsc, gd);
  else fp_chunk_codec_call<TO, FM>(o, w0, w1, u, gsc, gd);
}

// fp modes: each thread U <= KC chunks of 8 elements (4 bytes of fp4 codes or 8 of fp8, and
// the group's scale byte), loaded before any is decoded. KC = kDqChunksLong for long rows
// (launch_dequantize_t).
template <typename TO, int FM, int KC>
__global__ void __launch_bounds__(kDqThreadsMax) dequantize_fp_kernel(DequantizeArgs a, Shape s, int U, uint32_t mul0,
                                                                      uint32_t mul1) {
  constexpr bool kNv = FM == kDqNv4, kFp4 = FM <= kDqMx4, kE4 = FM == kDqE4M3;
  constexpr int kGShift = kNv ? 1 : 2;  // chunk -> group: 8 elements of 16 (nvfp4) or 32
  constexpr int kW = kFp4 ? 1 : 2;      // 32-bit words of codes a chunk
  const uint32_t row = blockIdx.x, prows = (uint32_t)s.prows;
  const uint32_t b = prows == gridDim.x ? 0u : row / prows, r = row - b * prows;
  const uint32_t T = blockDim.x, c0 = blockIdx.y * (T * U) + threadIdx.x, chunks = (uint32_t)s.chunks;
  const uint8_t* d = a.data.at<uint8_t>(b, r);
  TO* out = reinterpret_cast<TO*>(a.out.ptr) + (int64_t)row * a.out.cols;
  // group g's scale byte: srow[g], or in the blocked layout srow[(g / 4) * 512 + g % 4] from
  // the row's own offset (codec.h's blocked_offset, split into its row and column terms)
  const bool blocked = a.q.blocked;
  const uint8_t* srow =
      blocked ? a.scales.at<uint8_t>(b) + blocked_offset(r, 0, a.scales.cols) : a.scales.at<uint8_t>(b, r);
  uint32_t w[KC][kW];
  uint32_t sb[KC];
#pragma unroll
  for (int j = 0; j < KC; ++j) {
    const uint32_t c = j < U ? c0 + j * T : chunks;
#pragma unroll
    for (int h = 0; h < kW; ++h) w[j][h] = 0;
    sb[j] = 0;
    if (c >= chunks) continue;
    const uint32_t g = c >> kGShift;
    sb[j] = srow[blocked ? ((g >> 2) << 9) + (g & 3) : g];
    if constexpr (kFp4) {
      w[j][0] = *reinterpret_cast<const uint32_t*>(d + (size_t)c * 4);
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(d + (size_t)c * 8);
      w[j][0] = v.x, w[j][1] = v.y;
    }
  }
  // nvfp4's global factor after the bf16x2 products; gd is finite (nvfp4_gs clamps)
  const bool gsc = kNv && a.gs != nullptr;
  const float gd = gsc ? nvfp4_dec(*a.gs) : 1.0f;
#pragma unroll
  for (int j = 0; j < KC; ++j) {
    const uint32_t c = j < U ? c0 + j * T : chunks;
    if (c >= chunks) continue;
    const uint32_t u = sb[j];
    TO* o = out + (size_t)c * kVec;
    if constexpr (!std::is_same<TO, __half>::value) {
      // fp32 output takes bf16's rounding only where there is none: fp8 codes times
      // scales below 2^-124 (E4M3) / 2^-117 (E5M2) can fall under bf16's subnormal
      // precision (2^-133) while exact in fp32 (fp4 values never do).
      bool ok = kNv ? (u & 0x7fu) != 0x7fu : u != 0xffu;
      if (std::is_same<TO, float>::value && !kFp4) ok = ok && u >= (kE4 ? 3u : 10u);
      if (ok) {
        // the scale as bf16x2 (both halves): E4M3 placed, times 2^120; UE8M0 2^(u-127)
        const uint32_t S = kNv ? bmul(dup16(e4m3_bf16_bits(u)), 0x7b807b80u) : dup16(u ? u << 7 : 0x0040u);
        uint32_t q[4];
        if constexpr (kFp4) {
          uint32_t pr[4];  // (e_i, e_i+4) * 2^-126
          const uint32_t mul[2] = {mul0, mul1};
          fp4_pairs(w[j][0], mul, pr);
#pragma unroll
          for (int i = 0; i < 4; ++i) pr[i] = bmul(bmul(pr[i], 0x7e807e80u), S);  // * 2^126, * s
          q[0] = prmt(pr[0], pr[1], 0x5410u), q[1] = prmt(pr[2], pr[3], 0x5410u);
          q[2] = prmt(pr[0], pr[1], 0x7632u), q[3] = prmt(pr[2], pr[3], 0x7632u);
        } else {
          // vec.cuh's fp8_place: pairs (e0, e2), (e1, e3) of each word times 2^-fix, then in order
          const Fp8Bf16 e = fp8_bf16(kE4);
          ok = !fp8_special(w[j][0], e.nan_mask, e.nan_add) && !fp8_special(w[j][1], e.nan_mask, e.nan_add);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t p0, p1;
            fp8_place(w[j][h], e.shl, e.shr, e.mag, p0, p1);
            p0 = bmul(bmul(p0, e.fix2), S);
            p1 = bmul(bmul(p1, e.fix2), S);
            q[2 * h] = prmt(p0, p1, 0x5410u);
            q[2 * h + 1] = prmt(p0, p1, 0x7632u);
          }
        }
        if (ok) {
          if (gsc) store8_scaled<TO>(o, q, gd);
          else store8_bf16x2<TO>(o, q);
          continue;
        }
      }
    }
    fp_chunk_codec<TO, FM>(o, w[j][0], kW > 1 ? w[j][kW - 1] : 0u, u, gsc, gd);
  }
}

// Affine codes. kBits: 4 or 8 = codes of that width on aligned rows (avec); 0 = any call.
// (kDqChunks a thread at most: the long-row launch of the fp modes made 16384^2 affine
// 4- / 8-bit slower on an H200, 0.80 / 0.86 -> 0.67 / 0.75 of copy bandwidth.)
template <typename TO, typename TS, int kBits>
__global__ void __launch_bounds__(kDqThreadsMax) dequantize_affine_kernel(DequantizeArgs a, Shape s, int U,
                                                                          bool avec) {
  const uint32_t row = blockIdx.x, prows = (uint32_t)s.prows;
  const uint32_t b = prows == gridDim.x ? 0u : row / prows, r = row - b * prows;
  const uint32_t T = blockDim.x, c0 = blockIdx.y * (T * U) + threadIdx.x, chunks = (uint32_t)s.chunks;
  const uint8_t* d = a.data.at<uint8_t>(b, r);
  TO* out = reinterpret_cast<TO*>(a.out.ptr) + (int64_t)row * a.out.cols;
  // chunk c's group: c * 8 / group, a shift (groups of 32, 64 or 128; a run-time division
  // was ~20 instructions a chunk)
  const uint32_t gshift = (uint32_t)(__ffs(a.q.group) - 4);
  if constexpr (kBits == 4 || kBits == 8) {
    // affine 4- or 8-bit codes on aligned rows, the width at compile time: a code is a
    // constant shift and mask of a 32-bit word, where the run-time width below shifts 64-bit
    // words; 40 registers instead of 48 (12 blocks an SM instead of 10). 16384^2 to bf16 on
    // an H100: affine4 0.81 -> 0.88 of copy bandwidth, affine8 0.84 -> 0.91
    // (bench/results/quantize-h100-profile.md, session r).
    // The row's three input base pointers made opaque to the compiler (read with __ldg):
    // otherwise it folds the row offsets into each chunk's 64-bit index (add with carry,
    // then a shift-add pair an address, and a branch a chunk) where a base pointer takes
    // one wide multiply-add an address and predicated loads (sm_90a: 48 fewer
    // instructions an instance).
    const TS* srow = opaque_ptr(a.scales.at<TS>(b, r));
    const TS* brow = opaque_ptr(a.biases.at<TS>(b, r));
    d = opaque_ptr(d);
    constexpr int kW = kBits / 4;  // 32-bit words of codes a chunk
    uint32_t w[kDqChunks][kW];
    float sc[kDqChunks], bi[kDqChunks];
#pragma unroll
    for (int j = 0; j < kDqChunks; ++j) {
      const uint32_t c = j < U ? c0 + j * T : chunks;
#pragma unroll
      for (int h = 0; h < kW; ++h) w[j][h] = 0;
      sc[j] = bi[j] = 0.0f;
      if (c >= chunks) continue;
      const uint32_t g = c >> gshift;
      sc[j] = ldg_cast<TS>(srow + g);
      bi[j] = ldg_cast<TS>(brow + g);
      if constexpr (kBits == 4) {
        w[j][0] = __ldg(reinterpret_cast<const uint32_t*>(d + (size_t)c * 4));
      } else {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(d + (size_t)c * 8));
        w[j][0] = v.x, w[j][1] = v.y;
      }
    }
#pragma unroll
    for (int j = 0; j < kDqChunks; ++j) {
      const uint32_t c = j < U ? c0 + j * T : chunks;
      if (c >= chunks) continue;
      // 2^23 + q as float bits, each a byte permute into 0x4b000000's low byte (one
      // instruction an element where shift, mask and or took two or three); 4-bit codes
      // are first spread to bytes, the even and the odd nibbles apart
      uint32_t m[kVec];
      if constexpr (kBits == 4) {
        const uint32_t lo = w[j][0] & 0x0f0f0f0fu, hi = (w[j][0] >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          m[2 * i] = prmt(lo, 0x4b000000u, 0x7540u | i);
          m[2 * i + 1] = prmt(hi, 0x4b000000u, 0x7540u | i);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) m[i] = prmt(w[j][i >> 2], 0x4b000000u, 0x7540u | (i & 3));
      }
      affine_store8<TO>(out + (size_t)c * kVec, m, sc[j], bi[j]);
    }
  } else {
    const int bits = a.q.bits;
    const TS* srow = a.scales.at<TS>(b, r);
    const TS* brow = a.biases.at<TS>(b, r);
    uint64_t acc[kDqChunks];
    float sc[kDqChunks], bi[kDqChunks];
#pragma unroll
    for (int j = 0; j < kDqChunks; ++j) {
      const uint32_t c = j < U ? c0 + j * T : chunks;
      acc[j] = 0;
      sc[j] = bi[j] = 0.0f;
      if (c >= chunks) continue;
      const uint32_t g = c >> gshift;
      sc[j] = load_cast<TS>(srow + g);
      bi[j] = load_cast<TS>(brow + g);
      const uint8_t* p = d + (size_t)c * bits;  // a chunk is `bits` bytes
      if (avec && bits == 4) {
        acc[j] = *reinterpret_cast<const uint32_t*>(p);
      } else if (avec && bits == 8) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        acc[j] = (uint64_t)v.x | ((uint64_t)v.y << 32);
      } else {
        for (int i = 0; i < bits; ++i) acc[j] |= (uint64_t)p[i] << (8 * i);
      }
    }
    const uint32_t mask = (1u << bits) - 1;
#pragma unroll
    for (int j = 0; j < kDqChunks; ++j) {
      const uint32_t c = j < U ? c0 + j * T : chunks;
      if (c >= chunks) continue;
      uint32_t m[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) m[i] = 0x4b000000u | ((uint32_t)(acc[j] >> (i * bits)) & mask);
      affine_store8<TO>(out + (size_t)c * kVec, m, sc[j], bi[j]);
    }
  }
}

// fp4_pairs' multipliers, passed as kernel arguments (vec.cuh)
constexpr uint32_t kMul0 = 65u << 6, kMul1 = 65u << 2;

template <typename TO, typename TS>
void launch_dq(dim3 grid, int nt, cudaStream_t st, const DequantizeArgs& a, const Shape& s, int U, bool avec) {
  const int kb = avec ? a.q.bits : 0;
  if (kb == 4) dequantize_affine_kernel<TO, TS, 4><<<grid, nt, 0, st>>>(a, s, U, avec);
  else if (kb == 8) dequantize_affine_kernel<TO, TS, 8><<<grid, nt, 0, st>>>(a, s, U, avec);
  else dequantize_affine_kernel<TO, TS, 0><<<grid, nt, 0, st>>>(a, s, U, avec);
}

template <typename TO, int KC>
void launch_dq_fp(dim3 grid, int nt, cudaStream_t st, const DequantizeArgs& a, const Shape& s, int U) {
  if (a.q.mode == QQ_MODE_NVFP4) dequantize_fp_kernel<TO, kDqNv4, KC><<<grid, nt, 0, st>>>(a, s, U, kMul0, kMul1);
  else if (a.q.bits == 4) dequantize_fp_kernel<TO, kDqMx4, KC><<<grid, nt, 0, st>>>(a, s, U, kMul0, kMul1);
  else if (a.q.elem == ELEM_E4M3) dequantize_fp_kernel<TO, kDqE4M3, KC><<<grid, nt, 0, st>>>(a, s, U, kMul0, kMul1);
  else dequantize_fp_kernel<TO, kDqE5M2, KC><<<grid, nt, 0, st>>>(a, s, U, kMul0, kMul1);
}

template <typename TO>
qqStatus_t launch_dequantize_t(const DequantizeArgs& a, Shape s, bool avec, cudaStream_t st) {
  // A row's blocks: the fewest of 128 threads with at most kDqChunks chunks a thread, then
  // the fewest chunks a thread U that cover the row. Where that leaves threads idle, blocks
  // of up to kDqThreadsMax threads (a multiple of 32) if some U and T leave fewer idle: K =
  // 5120 (640 chunks) takes one block of 160 x 4 chunks, not two of 128 x 3 with 17 % of
  // the threads idle (8192 x 5120 to bf16 on an H100: nvfp4 0.79 -> 0.83 of copy bandwidth,
  // affine 4-bit 0.67 -> 0.76; quantize-h100-profile.md, session r). U <= 4: 8 took 72
  // registers and ran slower at 16384^2 (H200, 207 vs 187 us).
  int64_t per_row = (s.chunks + kRowThreads * kDqChunks - 1) / (kRowThreads * kDqChunks);
  int U = (int)((s.chunks + kRowThreads * per_row - 1) / (kRowThreads * per_row)), nt = kRowThreads;
  int64_t idle = per_row * U * kRowThreads - s.chunks;
  const int64_t rows_wide = (s.chunks + kDqThreadsMax * kDqChunks - 1) / (kDqThreadsMax * kDqChunks);
  for (int u = kDqChunks; u >= 1 && idle > 0; --u) {
    const int64_t t = ((s.chunks + rows_wide * u - 1) / (rows_wide * u) + 31) / 32 * 32;
    const int64_t left = rows_wide * u * t - s.chunks;
    if (t <= kDqThreadsMax && left < idle) idle = left, per_row = rows_wide, U = u, nt = (int)t;
  }
  // Long rows: blocks of up to kDqThreadsMax threads with up to kDqChunksLong chunks a
  // thread where that layout gives threads kDqLongMin or more of them (the last threads of
  // a row may get fewer): K in [10248, 16384], [20488, 32768] and above. More bytes in flight
  // a thread: 16384^2 nvfp4 / mxfp4 / mxfp8 on an H200 0.86 / 0.86 / 0.90 -> 0.90 / 0.90 /
  // 0.92 of copy bandwidth. The instance's larger arrays cost registers, so shorter rows keep
  // kDqChunks (8192 x 5120 at 3 chunks a thread: 0.79 -> 0.63). Measured at 8, 7 (4096 x
  // 14336: 0.80-0.84, no A/B) and 3 chunks a thread; 6 is the untested edge of the rule.
  // (bench/tune/dq_sweep.py; bench/results/dequantize-h200-notes.md, session y.)
  const int64_t pl = (s.chunks + kDqThreadsMax * kDqChunksLong - 1) / (kDqThreadsMax * kDqChunksLong);
  const int ul = (int)((s.chunks + kDqThreadsMax * pl - 1) / (kDqThreadsMax * pl));
  const bool lng = a.q.fp() && ul >= kDqLongMin;
  if (lng) {
    nt = (int)(((s.chunks + pl * ul - 1) / (pl * ul) + 31) / 32 * 32);
    per_row = pl;
    U = ul;
  }
  const dim3 grid((unsigned)(s.total / s.chunks), (unsigned)per_row);
  if (a.q.fp()) {
    if (lng) launch_dq_fp<TO, kDqChunksLong>(grid, nt, st, a, s, U);
    else launch_dq_fp<TO, kDqChunks>(grid, nt, st, a, s, U);
    return check_launch("dequantize");
  }
  switch (a.scales.dt) {
    case DType::F16: launch_dq<TO, __half>(grid, nt, st, a, s, U, avec); break;
    case DType::BF16: launch_dq<TO, __nv_bfloat16>(grid, nt, st, a, s, U, avec); break;
    default: launch_dq<TO, float>(grid, nt, st, a, s, U, avec); break;
  }
  return check_launch("dequantize");
}

}  // namespace

qqStatus_t dequantize(qqHandle_t h, const DequantizeArgs& a, void* stream) {
  Shape s;
  s.chunks = a.out.cols / kVec;
  s.rows = a.data.rows;
  s.prows = s.rows;
  s.total = a.data.batch() * s.rows * s.chunks;
  QQ_TRY(check_row_grid("dequantize", s));
  // fp4 rows are read 4 bytes at a time, fp8 rows 8; affine 4- and 8-bit rows too when
  // aligned so (avec), bytewise otherwise
  QQ_TRY(check_aligned("dequantize", "w", a.data, a.q.fp() ? a.q.bits : 1));
  const bool avec = !a.q.fp() && (a.q.bits == 4 || a.q.bits == 8) && aligned(a.data, a.q.bits);
  QQ_TRY(check_aligned("dequantize", "out", a.out, 16));
  return on_device(a.data.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    switch (a.out.dt) {
      case DType::F32: return launch_dequantize_t<float>(a, s, avec, st);
      case DType::F16: return launch_dequantize_t<__half>(a, s, avec, st);
      default: return launch_dequantize_t<__nv_bfloat16>(a, s, avec, st);
    }
  });
}

}  // namespace cuda
}  // namespace qq
