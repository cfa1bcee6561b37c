// cuda/dequantize.cu - dequantization (qqDequantize) on the GPU: a thread per
// kDqChunks chunks of 8 output elements on the row-wise grid of quant.cuh; fp modes
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
// dequantize kernel: each thread kDqChunks chunks of 8 output elements, kRowThreads
// apart along the row (each load and store instruction of a warp stays contiguous).
// All of a thread's loads are issued before it decodes: with one chunk per thread
// the reads in flight (4-8 bytes a thread) were too few to cover DRAM latency, and
// the kernel ran at 0.50-0.63 of copy bandwidth (bench/results/quantize-h100.md).
// ---------------------------------------------------------------------------
constexpr int kDqChunks = 4;

template <typename TO, typename TS>
__global__ void __launch_bounds__(kRowThreads) dequantize_kernel(DequantizeArgs a, Shape s, bool avec) {
  const uint32_t row = blockIdx.x, prows = (uint32_t)s.prows;
  const uint32_t b = prows == gridDim.x ? 0u : row / prows, r = row - b * prows;
  const uint32_t c0 = blockIdx.y * (kRowThreads * kDqChunks) + threadIdx.x, chunks = (uint32_t)s.chunks;
  const uint8_t* d = a.data.at<uint8_t>(b, r);
  TO* out = reinterpret_cast<TO*>(a.out.ptr) + (int64_t)row * a.out.cols;
  const int group = a.q.group;
  if (a.q.fp()) {
    uint32_t w[kDqChunks][2];
    uint8_t sb[kDqChunks];
    const uint8_t* srow = a.q.blocked ? a.scales.at<uint8_t>(b) : a.scales.at<uint8_t>(b, r);
#pragma unroll
    for (int j = 0; j < kDqChunks; ++j) {
      const uint32_t c = c0 + j * kRowThreads;
      w[j][0] = w[j][1] = 0;
      sb[j] = 0;
      if (c >= chunks) continue;
      const uint32_t g = c * kVec / group;
      sb[j] = srow[a.q.blocked ? blocked_offset(r, g, a.scales.cols) : g];
      if (a.q.bits == 4) {
        w[j][0] = *reinterpret_cast<const uint32_t*>(d + (size_t)c * 4);
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(d + (size_t)c * 8);
        w[j][0] = v.x, w[j][1] = v.y;
      }
    }
    const float gd = (a.q.mode == QQ_MODE_NVFP4 && a.gs) ? nvfp4_dec(*a.gs) : 1.0f;
#pragma unroll
    for (int j = 0; j < kDqChunks; ++j) {
      const uint32_t c = c0 + j * kRowThreads;
      if (c >= chunks) continue;
      float v[kVec];
      const float f = a.q.mode == QQ_MODE_NVFP4 ? e4m3_decode(sb[j]) : ue8m0_decode(sb[j]);
      if (a.q.bits == 4) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = e2m1_decode((uint8_t)((w[j][0] >> (4 * i)) & 0xf)) * f;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[i] = elem_decode(a.q.elem, (uint8_t)(w[j][0] >> (8 * i))) * f;
          v[i + 4] = elem_decode(a.q.elem, (uint8_t)(w[j][1] >> (8 * i))) * f;
        }
      }
      if (a.q.mode == QQ_MODE_NVFP4 && a.gs) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = v[i] * gd;
      }
      store8<TO>(out + (size_t)c * kVec, v);
    }
  } else {
    const int bits = a.q.bits;
    const TS* srow = a.scales.at<TS>(b, r);
    const TS* brow = a.biases.at<TS>(b, r);
    uint64_t acc[kDqChunks];
    float sc[kDqChunks], bi[kDqChunks];
#pragma unroll
    for (int j = 0; j < kDqChunks; ++j) {
      const uint32_t c = c0 + j * kRowThreads;
      acc[j] = 0;
      sc[j] = bi[j] = 0.0f;
      if (c >= chunks) continue;
      const uint32_t g = c * kVec / group;
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
      const uint32_t c = c0 + j * kRowThreads;
      if (c >= chunks) continue;
      float v[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = affine_decode((uint32_t)(acc[j] >> (i * bits)) & mask, sc[j], bi[j]);
      store8<TO>(out + (size_t)c * kVec, v);
    }
  }
}

template <typename TO>
qqStatus_t launch_dequantize_t(const DequantizeArgs& a, Shape s, bool avec, cudaStream_t st) {
  const dim3 grid((unsigned)(s.total / s.chunks),
                  (unsigned)((s.chunks + kRowThreads * kDqChunks - 1) / (kRowThreads * kDqChunks)));
  switch (a.q.fp() ? DType::U8 : a.scales.dt) {
    case DType::F16: dequantize_kernel<TO, __half><<<grid, kRowThreads, 0, st>>>(a, s, avec); break;
    case DType::BF16: dequantize_kernel<TO, __nv_bfloat16><<<grid, kRowThreads, 0, st>>>(a, s, avec); break;
    default: dequantize_kernel<TO, float><<<grid, kRowThreads, 0, st>>>(a, s, avec); break;
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
