// emu_cuda.h - just enough of CUDA to run qmv.cu's kernels on the host
// (scripts/emulate_qmv.sh). One fiber (ucontext) per CUDA thread of a block,
// all on one OS thread, blocks one after another; __shared__ becomes a
// function-local static (blocks do not overlap). __syncthreads and each half of
// __shfl_xor_sync are sync points: a fiber yields there, and the scheduler runs
// every fiber of the block to its next sync point before any goes further (so
// a sync point some threads miss is reported, as it would hang or misbehave
// on the GPU).
#pragma once
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "codec.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) uint4 { uint32_t x, y, z, w; };
struct alignas(8) uint2 { uint32_t x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(4) __half2 { uint16_t x, y; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{a, b, c, d}; }
struct __half { uint16_t x; };
inline __half __ushort_as_half(unsigned short h) { return __half{h}; }
inline float __half2float(__half h) { return qq::fp16_to_f(h.x); }
inline float2 __half22float2(__half2 h) { return float2{qq::fp16_to_f(h.x), qq::fp16_to_f(h.y)}; }
typedef void* cudaStream_t;

namespace emu {
extern thread_local dim3 tIdx, bIdx;
extern dim3 gDim;
void sync_point();
extern float shfl_slot[1024];
// memory range the kernels may read (checked by every load)
bool readable(const void* p, size_t n);
}  // namespace emu
#define threadIdx emu::tIdx
#define blockIdx emu::bIdx
#define gridDim emu::gDim

template <class T> T __ldg(const T* p) {
  if (((uintptr_t)p) % alignof(T)) { fprintf(stderr, "misaligned __ldg %p (%zu)\n", (const void*)p, alignof(T)); abort(); }
  if (!emu::readable(p, sizeof(T))) { fprintf(stderr, "out-of-range __ldg %p\n", (const void*)p); abort(); }
  return *p;
}
inline uint4 emu_ld_stream(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
inline void __syncthreads() { emu::sync_point(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  const int tid = (int)emu::tIdx.x, w = tid >> 5, lane = tid & 31;
  emu::shfl_slot[tid] = v;
  emu::sync_point();
  const float r = emu::shfl_slot[(w << 5) | (lane ^ o)];
  emu::sync_point();
  return r;
}
void emu_launch(dim3 grid, int threads, const std::function<void()>& body);
