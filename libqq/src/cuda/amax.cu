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
    // |NaN| keeps NaN bits. A grid of one block owns *out: a plain store, so
    // that no memset launch has to clear it first.
    if (threadIdx.x == 0) {
      if (gridDim.x == 1) *out = f2u(m) & 0x7fffffffu;
      else atomicMax(out, f2u(m) & 0x7fffffffu);
    }
  }
}

// Up to this many elements one block of kSmallThreads reduces all of x: one
// launch instead of a memset and a launch (the host cost of small calls, such
// as the global scale of a decode step's activations, is mostly launches);
// 128K bf16 elements are 256 KB, read by one SM in a few microseconds.
constexpr int64_t kSmallTotal = int64_t(1) << 17;
constexpr int kSmallThreads = 1024;

}  // namespace

qqStatus_t amax(qqHandle_t h, const Mat& x, float* out, void* stream) {
  const int64_t total = x.batch() * x.rows * x.cols;
  return on_device(x.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    unsigned int grid = 1;
    int threads = kSmallThreads;
    if (total > kSmallTotal) {  // many blocks, combined by atomicMax into a cleared *out
      QQ_CUDA_TRY(cudaMemsetAsync(out, 0, sizeof(float), st), "amax");
      const int sms = sm_count(x.device);
      const int64_t want = (total + kThreads * 8 - 1) / (kThreads * 8);
      grid = (unsigned int)(want < (int64_t)sms * 8 ? want : (int64_t)sms * 8);
      threads = kThreads;
    }
    switch (x.dt) {
      case DType::F32: amax_kernel<float><<<grid, threads, 0, st>>>(x, total, (unsigned int*)out); break;
      case DType::F16: amax_kernel<__half><<<grid, threads, 0, st>>>(x, total, (unsigned int*)out); break;
      default: amax_kernel<__nv_bfloat16><<<grid, threads, 0, st>>>(x, total, (unsigned int*)out); break;
    }
    return check_launch("amax");
  });
}

}  // namespace cuda
}  // namespace qq
