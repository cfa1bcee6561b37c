// cuda/vec.cuh - 16-byte loads and stores of 8 elements as fp32, shared by
// the kernels that stream rows (quantize, qqmm's q(x), qmv, qmma), and the
// bf16x2 decoding of packed fp4 words (qmma, dequantize).
#ifndef QQ_CUDA_VEC_CUH_
#define QQ_CUDA_VEC_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../codec.h"
#include "../internal.h"

namespace qq {
namespace cuda {

// min / max that pass a NaN through (PTX min.NaN / max.NaN, sm_80+).
__device__ __forceinline__ float fmin_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// min and max, as fp32, of the elements of kWords 16-byte words; a NaN anywhere makes both
// NaN, so the group is finite exactly when both are (an Inf shows as the min or the max).
// 16-bit types two elements per instruction on the packed halves (HMNMX2 with NaN): a
// conversion to fp32 is exact and monotone, so the min of the halves is the half of the
// min. Against fp32 compare-and-select per element with a separate finiteness test (seven
// instructions an element), one. Which zero a min of -0 and +0 returns is unspecified;
// affine_params does not depend on it.
template <typename T, int kWords>
__device__ __forceinline__ void minmax_nan(const uint4* q, float* lo, float* hi) {
  if constexpr (sizeof(T) == 4) {
    float mn = __uint_as_float(q[0].x), mx = mn;
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const float e[4] = {__uint_as_float(q[i].x), __uint_as_float(q[i].y), __uint_as_float(q[i].z),
                          __uint_as_float(q[i].w)};
#pragma unroll
      for (int j = 0; j < 4; ++j) mn = fmin_nan(mn, e[j]), mx = fmax_nan(mx, e[j]);
    }
    *lo = mn;
    *hi = mx;
  } else {
    using T2 = typename std::conditional<std::is_same<T, __half>::value, __half2, __nv_bfloat162>::type;
    auto as2 = [](uint32_t w) { return *reinterpret_cast<const T2*>(&w); };
    T2 mn = as2(q[0].x), mx = mn;
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const uint32_t e[4] = {q[i].x, q[i].y, q[i].z, q[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) mn = __hmin2_nan(mn, as2(e[j])), mx = __hmax2_nan(mx, as2(e[j]));
    }
    *lo = fmin_nan(__low2float(mn), __high2float(mn));
    *hi = fmax_nan(__low2float(mx), __high2float(mx));
  }
}

// 8 consecutive 16-bit elements as fp32 from their 16-byte word.
template <typename T> __device__ __forceinline__ void unpack8(const uint4& a, float* v);
template <> __device__ __forceinline__ void unpack8<__nv_bfloat16>(const uint4& a, float* v) {
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = bf16_to_f((uint16_t)(w[i] & 0xffff));
    v[2 * i + 1] = bf16_to_f((uint16_t)(w[i] >> 16));
  }
}
template <> __device__ __forceinline__ void unpack8<__half>(const uint4& a, float* v) {
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffff)));
    v[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
  }
}
// kN consecutive elements of x's dtype as fp32 from their 16-byte units (8 a unit of 16-bit x
// through unpack8, 4 a unit of fp32).
template <typename T, int kN> __device__ __forceinline__ void unpack_units(const uint4* u, float* v) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kN / 4; ++i) {
      v[4 * i] = __uint_as_float(u[i].x), v[4 * i + 1] = __uint_as_float(u[i].y);
      v[4 * i + 2] = __uint_as_float(u[i].z), v[4 * i + 3] = __uint_as_float(u[i].w);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN / 8; ++i) unpack8<T>(u[i], v + 8 * i);
  }
}

// Values the compiler can no longer see through (an empty asm that "changes" them), the one
// home of that device: a pointer it would otherwise fold back into 64-bit indices from a
// kernel argument (opaque_ptr: dequantize.cu's row pointers), a loop-invariant offset it
// would otherwise re-derive inside a loop (opaque: qmmp.cu's consumer loop; volatile, so it
// is not sunk into the loop either).
template <typename P> __device__ __forceinline__ P* opaque_ptr(P* p) {
  uint64_t v = reinterpret_cast<uint64_t>(p);
  asm("" : "+l"(v));
  return reinterpret_cast<P*>(v);
}
__device__ __forceinline__ uint32_t opaque(uint32_t v) {
  asm volatile("" : "+r"(v));
  return v;
}

// Load 8 consecutive elements (16-byte aligned) as fp32: load8 from global
// memory through the read-only path, load8_generic from any address space
// (shared memory).
template <typename T> __device__ __forceinline__ void load8(const T* p, float* v) {
  unpack8<T>(__ldg(reinterpret_cast<const uint4*>(p)), v);
}
template <> __device__ __forceinline__ void load8<float>(const float* p, float* v) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
template <typename T> __device__ __forceinline__ void load8_generic(const T* p, float* v) {
  unpack8<T>(*reinterpret_cast<const uint4*>(p), v);
}
template <> __device__ __forceinline__ void load8_generic<float>(const float* p, float* v) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Store 8 fp32 values as T (16-byte aligned), rounding to nearest even.
template <typename T> __device__ __forceinline__ void store8(T* p, const float* v);
template <> __device__ __forceinline__ void store8<float>(float* p, const float* v) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <> __device__ __forceinline__ void store8<__nv_bfloat16>(__nv_bfloat16* p, const float* v) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = (uint32_t)f_to_bf16(v[2 * i]) | ((uint32_t)f_to_bf16(v[2 * i + 1]) << 16);
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}
template <> __device__ __forceinline__ void store8<__half>(__half* p, const float* v) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = (uint32_t)f_to_fp16(v[2 * i]) | ((uint32_t)f_to_fp16(v[2 * i + 1]) << 16);
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Element-wise load of one element as fp32 (rows that are not 16-byte aligned).
template <typename T> __device__ __forceinline__ float load1(const T* p);
template <> __device__ __forceinline__ float load1<float>(const float* p) { return __ldg(p); }
template <> __device__ __forceinline__ float load1<__half>(const __half* p) { return __half2float(__ldg(p)); }
template <> __device__ __forceinline__ float load1<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(__ldg(p));
}

// v + bias[n] (v when there is no bias), in fp32.
__device__ __forceinline__ float biased(const Mat& bias, int64_t n, float v) {
  if (bias.ptr) {
    const void* bp = bias.ptr;
    v += bias.dt == DType::F32 ? ((const float*)bp)[n]
                               : (bias.dt == DType::BF16 ? bf16_to_f(((const uint16_t*)bp)[n])
                                                         : fp16_to_f(((const uint16_t*)bp)[n]));
  }
  return v;
}
// v rounded to dtype dt and read back: the value store_biased would leave.
__device__ __forceinline__ float round_as(DType dt, float v) {
  return dt == DType::F32 ? v : (dt == DType::BF16 ? bf16_to_f(f_to_bf16(v)) : fp16_to_f(f_to_fp16(v)));
}
// out's element i = v in out's dtype (f32, bf16 or f16).
__device__ __forceinline__ void store_as(const Mat& out, int64_t i, float v) {
  if (out.dt == DType::F32) ((float*)out.ptr)[i] = v;
  else if (out.dt == DType::BF16) ((uint16_t*)out.ptr)[i] = f_to_bf16(v);
  else ((uint16_t*)out.ptr)[i] = f_to_fp16(v);
}
// One output value of a weight-only matmul (qmv.cu, qmma.cu, qmmp.cu): + bias[n] (if
// any), rounded once to out's dtype (RNE, as the CPU), at element i of out.
__device__ __forceinline__ void store_biased(const Mat& out, const Mat& bias, int64_t i, int64_t n, float v) {
  store_as(out, i, biased(bias, n, v));
}
__device__ __forceinline__ void store_out(const MatmulArgs& a, int64_t b, int64_t m, int64_t n, float v) {
  store_biased(a.out, a.bias, a.out.offset(b) + m * a.out.ld + n, n, v);
}

// ---- bf16x2 arithmetic of the weight decoders (qmma.cu, dequantize.cu) ----
// a * b per bf16 half (fma with -0: exact when the product is representable,
// subnormals included; sm_80 has no bf16x2 mul).
__device__ __forceinline__ uint32_t bmul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}
// c += A (16 x 16, bf16, row) * B (16 x 8, bf16, col) in fp32: the weight-only kernels'
// multiply-add (qmma.cu, qmmp.cu), A = the decoded weights, B = x.
__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// fp4 word (8 E2M1 codes) -> pairs j = (e_j, e_j+4), j = 0..3, as bf16 times
// 2^-126 (as qmv.cu's fp4x8: magnitude to bf16 bits 6..8, sign to 15; E2M1
// subnormals land on bf16 subnormals). Nibbles j and j + 4 are masked out (at
// bits 0..3 / 16..19, or 4..7 / 20..23 for odd j; j >= 2 from w >> 8), then one
// integer multiply by 65 * 2^6 (or 65 * 2^2) adds the nibble moved to bits
// 6..9 and a copy of it 6 bits higher, whose top bit - the sign - lands on
// bit 15 (31); the two addends share no bit, so nothing carries, and a mask
// keeps sign and magnitude. 2 ALU instructions and one IMAD per pair instead
// of 2 shifts and 2 LOP3: qmma is bound by the integer ALU pipe
// (bench/results/qmm-decode-h100-notes.md), and IMAD issues on the FMA pipe.
// The multipliers `mul` = {65 << 6, 65 << 2} come from kernel parameters so
// that ptxas cannot turn them back into shifts.
__device__ __forceinline__ void fp4_pairs(uint32_t w, const uint32_t (&mul)[2], uint32_t (&p)[4]) {
  const uint32_t w8 = w >> 8;
  p[0] = ((w & 0x000f000fu) * mul[0]) & 0x81c081c0u;
  p[1] = ((w & 0x00f000f0u) * mul[1]) & 0x81c081c0u;
  p[2] = ((w8 & 0x000f000fu) * mul[0]) & 0x81c081c0u;
  p[3] = ((w8 & 0x00f000f0u) * mul[1]) & 0x81c081c0u;
}

__device__ __forceinline__ uint32_t dup16(uint32_t h) { return h | (h << 16); }  // both bf16 halves = h
// bf16x2 bits of (lo, hi), rounded to nearest even by one conversion instruction (cvt.rn.bf16x2.f32);
// the qdq kernels store q(x)'s values with it, which are bf16 values already.
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// Eight values v[0..8) as bf16 in order (16 bytes), through bf16x2_bits.
__device__ __forceinline__ uint4 bf16x8_bits(const float* v) {
  return make_uint4(bf16x2_bits(v[0], v[1]), bf16x2_bits(v[2], v[3]), bf16x2_bits(v[4], v[5]),
                    bf16x2_bits(v[6], v[7]));
}

// fp8 codes (E4M3 / E5M2) placed into bf16 fields, the one home of the placement (qmv.cu,
// qmma.cu, dequantize.cu): a word's bytes 0 and 2 go to the halves of one bf16 pair,
// bytes 1 and 3 to the other; the exponent and mantissa bits land at bf16 bits 4..10
// (E4M3) or 5..11 (E5M2), the sign at 15, so a pair holds e * 2^-fix (exact; subnormal
// codes land on bf16 subnormals). Codes with an all-ones exponent (E4M3 NaN, E5M2
// Inf/NaN) would come out finite: fp8_special finds them.
struct Fp8Bf16 {
  uint32_t shl, shr, mag;      // placement: ((w << shl) & mag), ((w >> shr) & mag)
  int fix;                     // 120 (E4M3), 112 (E5M2)
  uint32_t fix2;               // bf16x2 of 2^fix
  float fixf;                  // 2^fix
  uint32_t nan_mask, nan_add;  // fp8_special
};
QQ_HD Fp8Bf16 fp8_bf16(bool e4m3) {
  return e4m3 ? Fp8Bf16{4, 4, 0x07f007f0u, 120, 0x7b807b80u, 0x1p120f, 0x7f7f7f7fu, 0x01010101u}
              : Fp8Bf16{5, 3, 0x0fe00fe0u, 112, 0x77807780u, 0x1p112f, 0x7c7c7c7cu, 0x04040404u};
}
// Pairs (e0, e2) and (e1, e3) of w's codes, times 2^-fix, as bf16x2.
QQ_HD void fp8_place(uint32_t w, uint32_t shl, uint32_t shr, uint32_t mag, uint32_t& p0, uint32_t& p1) {
  p0 = ((w << shl) & mag) | ((w << 8) & 0x80008000u);
  p1 = ((w >> shr) & mag) | (w & 0x80008000u);
}
// Nonzero when a code of w has an all-ones exponent.
QQ_HD uint32_t fp8_special(uint32_t w, uint32_t nan_mask, uint32_t nan_add) {
  return ((w & nan_mask) + nan_add) & 0x80808080u;
}

// Streaming 8- and 16-byte loads that do not allocate in L1 (keep x there).
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

}  // namespace cuda
}  // namespace qq

#endif  // QQ_CUDA_VEC_CUH_
