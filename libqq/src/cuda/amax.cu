// cuda/amax.cu - max |x| over a whole tensor (qqAmax, the input of nvfp4's
// global scale) on the GPU, NaN-propagating like the CPU backend.
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

// Block-wide max of every thread's m (NaN wins); the result in thread 0.
__device__ __forceinline__ float block_nanmax(float m) {
#pragma unroll
  for (int o = 16; o; o >>= 1) m = nanmax_f(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float warp_max[32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < (blockDim.x >> 5) ? warp_max[threadIdx.x] : 0.0f;
#pragma unroll
    for (int o = 16; o; o >>= 1) m = nanmax_f(m, __shfl_xor_sync(0xffffffffu, m, o));
  }
  return m;
}

// ---------------------------------------------------------------------------
// amax_kernel: any layout. Grid-stride max |x| per block, then one atomicMax
// on the bit pattern of a cleared *out (non-negative floats order like their
// bits; NaN's bits are above +Inf's, so NaN wins, which is what amax promises).
// |NaN| keeps NaN bits.
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
  m = block_nanmax(m);
  if (threadIdx.x == 0) atomicMax(out, f2u(m) & 0x7fffffffu);
}

// ---------------------------------------------------------------------------
// amax_small_kernel: a compact, 16-byte aligned x of at most kSmallTotal
// elements, reduced by one block that owns *out (a plain store: no memset
// launch before it). The host cost of a small call (the global scale of a
// decode step's activations) is mostly its launches. Each thread keeps 8
// independent 16-byte loads in flight, so the one SM reads x at a useful
// rate (one load at a time per warp would take tens of microseconds).
// ---------------------------------------------------------------------------
constexpr int64_t kSmallTotal = int64_t(1) << 17;  // 256 KB of bf16
constexpr int kSmallThreads = 1024;
constexpr int kSmallUnroll = 8;

template <typename T>
__global__ void __launch_bounds__(kSmallThreads) amax_small_kernel(const T* __restrict__ x, int64_t total,
                                                                   unsigned int* out) {
  constexpr int V = 16 / sizeof(T);
  const int64_t nv = total / V;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < nv; i += (int64_t)kSmallThreads * kSmallUnroll) {
    uint4 r[kSmallUnroll];
#pragma unroll
    for (int u = 0; u < kSmallUnroll; ++u) {
      const int64_t j = i + (int64_t)u * kSmallThreads;
      r[u] = j < nv ? __ldg(xv + j) : make_uint4(0u, 0u, 0u, 0u);  // zeros: |0| changes no max
    }
#pragma unroll
    for (int u = 0; u < kSmallUnroll; ++u) {
      const T* e = reinterpret_cast<const T*>(&r[u]);
#pragma unroll
      for (int k = 0; k < V; ++k) m = nanmax_f(m, abs_f(load_cast<T>(e + k)));
    }
  }
  for (int64_t i = nv * V + threadIdx.x; i < total; i += kSmallThreads) m = nanmax_f(m, abs_f(load_cast<T>(x + i)));
  m = block_nanmax(m);
  if (threadIdx.x == 0) *out = f2u(m) & 0x7fffffffu;
}

// ---------------------------------------------------------------------------
// amax_vec_kernel: a compact, 16-byte aligned x of any size (the global scale
// of a training step's activations and gradients: 100+ MB). amax_kernel's
// per-element index arithmetic (two 64-bit divisions an element) held it at
// a sixth of the copy bandwidth. Here each thread keeps kVecUnroll 16-byte
// loads in flight and reduces in the integers: |x|'s bit pattern orders like
// |x| and every NaN's lies above +Inf's, so an unsigned max of (bits & ~sign)
// is the NaN-propagating max |x| (16-bit formats two at a time, u16x2 max).
// Blocks combine as amax_kernel's do (atomicMax on a cleared *out).
// ---------------------------------------------------------------------------
constexpr int kVecUnroll = 4;

// Float value of the max key of format T (|x|'s bits; NaN stays NaN).
template <typename T> __device__ __forceinline__ float key_value(uint32_t k);
template <> __device__ __forceinline__ float key_value<float>(uint32_t k) { return u2f(k); }
template <> __device__ __forceinline__ float key_value<__nv_bfloat16>(uint32_t k) { return u2f(k << 16); }
template <> __device__ __forceinline__ float key_value<__half>(uint32_t k) {
  return __half2float(__ushort_as_half((unsigned short)k));
}

template <typename T>
__global__ void amax_vec_kernel(const T* __restrict__ x, int64_t total, unsigned int* out) {
  constexpr bool k16 = sizeof(T) == 2;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const int64_t nv = total / (16 / sizeof(T));
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  uint32_t m = 0;  // 16-bit formats: two keys, one per half
  auto fold = [&](uint32_t w) {
    if (k16) m = __vmaxu2(m, w & 0x7fff7fffu);
    else m = max(m, w & 0x7fffffffu);
  };
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride * kVecUnroll) {
    uint4 r[kVecUnroll];
#pragma unroll
    for (int u = 0; u < kVecUnroll; ++u) {
      const int64_t j = i + u * stride;
      r[u] = j < nv ? ld_stream(xv + j) : make_uint4(0u, 0u, 0u, 0u);  // zeros change no max
    }
#pragma unroll
    for (int u = 0; u < kVecUnroll; ++u) {
      fold(r[u].x);
      fold(r[u].y);
      fold(r[u].z);
      fold(r[u].w);
    }
  }
  // the elements past the last whole 16 bytes (fewer than 8), by the first threads
  const int64_t tail = nv * (16 / sizeof(T)) + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (tail < total) {
    const uint32_t b = k16 ? (uint32_t)(*reinterpret_cast<const uint16_t*>(x + tail))
                           : *reinterpret_cast<const uint32_t*>(x + tail);
    fold(b);
  }
  if (k16) m = max(m & 0xffffu, m >> 16);
  const float v = block_nanmax(key_value<T>(m));
  if (threadIdx.x == 0) atomicMax(out, f2u(v) & 0x7fffffffu);
}

// x's elements lie one after another from x.ptr (rows of ld = cols, batches of
// rows * cols, in order).
bool compact(const Mat& x) {
  if (x.rows > 1 && x.ld != x.cols) return false;
  int64_t want = x.rows * x.cols;
  for (int i = x.nb - 1; i >= 0; --i) {
    if (x.bshape[i] > 1 && x.bstride[i] != want) return false;
    want *= x.bshape[i];
  }
  return true;
}

template <typename T>
void launch(const Mat& x, int64_t total, unsigned int* out, bool small, bool vec, unsigned int grid,
            cudaStream_t st) {
  if (small) amax_small_kernel<T><<<1, kSmallThreads, 0, st>>>((const T*)x.ptr, total, out);
  else if (vec) amax_vec_kernel<T><<<grid, kThreads, 0, st>>>((const T*)x.ptr, total, out);
  else amax_kernel<T><<<grid, kThreads, 0, st>>>(x, total, out);
}

}  // namespace

qqStatus_t amax(qqHandle_t h, const Mat& x, float* out, void* stream) {
  const int64_t total = x.batch() * x.rows * x.cols;
  return on_device(x.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    const bool vec = compact(x) && (uintptr_t)x.ptr % 16 == 0;
    const bool small = total <= kSmallTotal && vec;
    unsigned int grid = 1;
    if (!small) {  // many blocks, combined by atomicMax into a cleared *out
      QQ_CUDA_TRY(cudaMemsetAsync(out, 0, sizeof(float), st), "amax");
      if (total == 0) return QQ_STATUS_SUCCESS;
      const int sms = sm_count(x.device);
      const int64_t want = (total + kThreads * 8 - 1) / (kThreads * 8);
      grid = (unsigned int)(want < (int64_t)sms * 8 ? want : (int64_t)sms * 8);
    }
    unsigned int* o = (unsigned int*)out;
    switch (x.dt) {
      case DType::F32: launch<float>(x, total, o, small, vec, grid, st); break;
      case DType::F16: launch<__half>(x, total, o, small, vec, grid, st); break;
      default: launch<__nv_bfloat16>(x, total, o, small, vec, grid, st); break;
    }
    return check_launch("amax");
  });
}

}  // namespace cuda
}  // namespace qq
