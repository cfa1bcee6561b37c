// cuda/amax.cu - max |x| over a whole tensor (qqAmax, the input of nvfp4's
// global scale) on the GPU, NaN-propagating like the CPU backend.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../codec.h"
#include "../internal.h"
#include "common.cuh"
#include "quant.cuh"

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
void launch(const Mat& x, int64_t total, unsigned int* out, bool small, unsigned int grid, cudaStream_t st) {
  if (small) amax_small_kernel<T><<<1, kSmallThreads, 0, st>>>((const T*)x.ptr, total, out);
  else amax_kernel<T><<<grid, kThreads, 0, st>>>(x, total, out);
}

}  // namespace

qqStatus_t amax(qqHandle_t h, const Mat& x, float* out, void* stream) {
  const int64_t total = x.batch() * x.rows * x.cols;
  return on_device(x.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    const bool small = total <= kSmallTotal && compact(x) && (uintptr_t)x.ptr % 16 == 0;
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
      case DType::F32: launch<float>(x, total, o, small, grid, st); break;
      case DType::F16: launch<__half>(x, total, o, small, grid, st); break;
      default: launch<__nv_bfloat16>(x, total, o, small, grid, st); break;
    }
    return check_launch("amax");
  });
}

}  // namespace cuda
}  // namespace qq
