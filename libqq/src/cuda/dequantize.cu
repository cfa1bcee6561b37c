// cuda/dequantize.cu - dequantization (qqDequantize) on the GPU: one thread
// per chunk of 8 output elements on the row-wise grid of quant.cuh; fp modes
// decode with the group's scale (and nvfp4's global scale), affine with its
// scale and bias, through the codecs of codec.h.
//
// Indexing and bit-exactness: quant.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../codec.h"
#include "../internal.h"
#include "common.cuh"
#include "quant.cuh"
#include "vec.cuh"

namespace qq {
namespace cuda {
namespace {

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

}  // namespace

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

}  // namespace cuda
}  // namespace qq
