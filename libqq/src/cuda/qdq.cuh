// cuda/qdq.cuh - q(x)'s values in registers: an operand quantized by the quantize
// kernels' rule (codec.h, bit for bit) and decoded again, for the kernels that quantize
// an operand on the fly: qqmm.cu's qdq kernels (q(x) for the GEMM routes) and the
// small-M weight-only kernels (qmma.cu, qmv.cu) when qqmm runs them on a float x
// (qx_rows_to_smem below: the quantization inside the matmul's own launch).
#ifndef QQ_CUDA_QDQ_CUH_
#define QQ_CUDA_QDQ_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "../codec.h"
#include "../internal.h"
#include "ops.cuh"  // QX
#include "vec.cuh"

namespace qq {
namespace cuda {

// Decoded values of a pair of codes (lo in the low byte/nibble). fp8 uses the
// hardware conversion to half2 on sm_89+ (exact: every E4M3/E5M2 value is an
// fp16 value); E2M1 and older GPUs the codec.
__device__ __forceinline__ float2 decode2(int elem, uint32_t pr) {
  if (elem == ELEM_E2M1) return make_float2(e2m1_decode(pr & 0xf), e2m1_decode((pr >> 4) & 0xf));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pr, elem == ELEM_E4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half22float2(__half2(h));
#else
  return make_float2(elem_decode(elem, pr & 0xff), elem_decode(elem, pr >> 8));
#endif
}

// One group of G values, in place: q(v)'s values, v = decode(q(v)) * scale -
// the quantize kernel's scale and element math (codec.h, bit for bit); enc is
// the nvfp4 global scale's encode factor (1 for none); the global scale itself
// stays out (the caller folds it into alpha), except gs_post (qdq_kernel).
// kElem: the element format at compile time (one path, no branch a pair), or
// -1 for q.elem's at run time.
// qdq_scaled: the same for N values of a group of G whose amax is given as
// |x|'s largest bit pattern (NaN above Inf) - a group spread over several
// values arrays (moe_qdq_kernel's 32x32 tiles). qdq_group: a whole group.
template <int G, int N, int kElem = -1>
__device__ __forceinline__ void qdq_scaled(float* v, uint32_t ab, const QSpec& q, float enc, const float* gs_post) {
  const int elem = kElem >= 0 ? kElem : q.elem;
  const float amax = u2f(ab);
  const FpGroupScale gsc = fp_group_scale(amax, G == 16, enc, elem, q.floor_rounding);
  const float f = gsc.factor;
  const bool nan_group = gsc.nan_group;
  float sdec = G == 16 ? e4m3_decode(gsc.code) : ue8m0_decode(gsc.code);
  if (gs_post) sdec = sdec * nvfp4_dec(*gs_post);  // fp32 route only; one extra rounding, within tolerance
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    uint32_t pr;
    // (a NaN group's codes: codec.h's elem_nan_code in each byte, as quant.cuh's encoders)
    if (elem == ELEM_E2M1) pr = nan_group ? elem_nan_code(ELEM_E2M1) * 0x11u : e2m1x2_encode(v[i] * f, v[i + 1] * f);
    else if (elem == ELEM_E4M3) pr = nan_group ? elem_nan_code(ELEM_E4M3) * 0x0101u : e4m3x2_encode(v[i] * f, v[i + 1] * f);
    else pr = nan_group ? elem_nan_code(ELEM_E5M2) * 0x0101u : e5m2x2_encode(v[i] * f, v[i + 1] * f);
    const float2 d = decode2(elem, pr);
    v[i] = d.x * sdec;
    v[i + 1] = d.y * sdec;
  }
}

// |v|'s largest bit pattern over N values (the amax as qdq_scaled takes it; NaN above Inf).
template <int N>
__device__ __forceinline__ uint32_t abs_bits_max(const float* v) {
  uint32_t ab = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) ab = max(ab, f2u(v[i]) & 0x7fffffffu);
  return ab;
}

template <int G, int kElem = -1>
__device__ __forceinline__ void qdq_group(float* v, const QSpec& q, float enc, const float* gs_post) {
  qdq_scaled<G, G, kElem>(v, abs_bits_max<G>(v), q, enc, gs_post);
}

// q(x)'s rows [X.rows, K] into shared memory `dst` as bf16 (exact: every q(x) value is a
// bf16 value, docs/formats.md), row r at dst + r * X.pitch; without the nvfp4 global scale
// (the caller multiplies its sums by it, as qqmm's GEMM routes do with alpha). Row r of the
// folded batch is row r % X.x.rows of entry r / X.x.rows. A thread takes 16 values: an
// nvfp4 group, or half an mx group (two adjacent lanes, their amax combined by a shuffle),
// so that the chain a thread runs before the matmul can start is 16 values long whatever
// the format (a whole mx group a thread was 1.4 us more at 4096^2, M = 1, on an H200;
// 8 values a thread cost the nvfp4 kernel 0.7 us). The block's threads take chunks in
// turn, every thread the same number of rounds (the shuffle needs the whole warp);
// blockDim.x is a multiple of 32; the caller synchronizes before reading. G: 16 (nvfp4)
// or 32; K % G == 0.
template <typename T, int G>
__device__ __forceinline__ void qx_rows_t(const QX& X, __nv_bfloat16* dst, int64_t K) {
  constexpr int kV = 16, kLanes = G / kV;
  const int64_t nc = K / kV, total = (int64_t)X.rows * nc;  // 16-value chunks (nc % kLanes == 0)
  const float enc = (G == 16 && X.gs) ? nvfp4_enc(*X.gs) : 1.0f;
  for (int64_t base = 0; base < total; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool on = i < total;
    const int64_t r = on ? i / nc : 0, c = i - r * nc, b = r / X.x.rows;
    float v[kV];
    if (on) {
      const T* src = X.x.at<T>(b, r - b * X.x.rows) + c * kV;
      if (X.vec) {
#pragma unroll
        for (int j = 0; j < kV; j += 8) load8<T>(src + j, v + j);
      } else {
#pragma unroll
        for (int j = 0; j < kV; ++j) v[j] = load1<T>(src + j);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kV; ++j) v[j] = 0.0f;
    }
    uint32_t ab = abs_bits_max<kV>(v);
#pragma unroll
    for (int o = 1; o < kLanes; o <<= 1) ab = max(ab, __shfl_xor_sync(0xffffffffu, ab, o));
    if (on) {
      qdq_scaled<G, kV>(v, ab, X.q, enc, nullptr);
      uint4* d = reinterpret_cast<uint4*>(dst + r * X.pitch + c * kV);
#pragma unroll
      for (int j = 0; j < kV / 8; ++j) d[j] = bf16x8_bits(v + 8 * j);
    }
  }
}

// G: the group size, which the caller's format fixes (X.q.group is G): one size compiled a kernel.
template <int G>
__device__ __forceinline__ void qx_rows_to_smem(const QX& X, __nv_bfloat16* dst, int64_t K) {
  switch (X.x.dt) {
    case DType::F32: qx_rows_t<float, G>(X, dst, K); break;
    case DType::F16: qx_rows_t<__half, G>(X, dst, K); break;
    default: qx_rows_t<__nv_bfloat16, G>(X, dst, K); break;
  }
}

}  // namespace cuda
}  // namespace qq

#endif  // QQ_CUDA_QDQ_CUH_
