// cuda/layout.cu - the scale layouts on the GPU: swizzle (linear -> the
// blocked 128x4 layout of cuBLASLt, padding zeroed) and unswizzle (back).
// The blocked index is codec.h's blocked_offset, as on the CPU.
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
// swizzle / unswizzle: one thread per blocked byte (padding included)
// ---------------------------------------------------------------------------
__global__ void swizzle_kernel(Mat lin, Mat blk, bool to_blocked, int64_t total) {
  const int64_t t = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (t >= total) return;
  // t enumerates (batch, r, c) over the padded shape; the blocked offset is
  // computed from it, so the linear side is read/written row-major.
  const int64_t per = blk.rows * blk.cols;
  const int64_t b = t / per, rc = t % per;
  const int64_t r = rc / blk.cols, c = rc % blk.cols;
  uint8_t* bp = (uint8_t*)blk.ptr + b * per + blocked_offset(r, c, blk.cols);
  const bool inside = r < lin.rows && c < lin.cols;
  if (to_blocked) {
    *bp = inside ? lin.at<uint8_t>(b, r)[c] : 0;
  } else if (inside) {
    lin.at<uint8_t>(b, r)[c] = *bp;
  }
}

unsigned int blocks_for(int64_t total) { return (unsigned int)((total + kThreads - 1) / kThreads); }

}  // namespace

qqStatus_t swizzle(qqHandle_t h, const Mat& lin, const Mat& blk, bool to_blocked, void* stream) {
  const int64_t total = lin.batch() * blk.rows * blk.cols;
  return on_device(lin.device, [&]() -> qqStatus_t {
    swizzle_kernel<<<blocks_for(total), kThreads, 0, (cudaStream_t)stream>>>(lin, blk, to_blocked, total);
    return check_launch(to_blocked ? "swizzle_scales" : "unswizzle_scales");
  });
}

}  // namespace cuda
}  // namespace qq
