// bench/tune/load_pattern.cu - what the decode kernel's (qmma.cu) access pattern can read,
// with no decode and no math: is the 0.49-of-copy ceiling in the loads or in the compute?
//   nvcc -O3 -arch=sm_90a -I libqq/include bench/tune/load_pattern.cu -o /tmp/lp && /tmp/lp
// Emulates qmma_kernel<QNV4, 8> on a 16384 x 16384 nvfp4 weight (16384 rows of 8192 bytes,
// scales 16384 x 1024): 8 warps a CTA, 2 CTAs an SM, a 16-row tile per warp, K split over
// KS warps, a ring of DEPTH steps of loads; a lane (g, q) loads 16-byte chunk 4 * (ks + KS *
// step) + q of rows g and g + 8. Variants:
//   rows       the layout as qmma reads it today (a warp load: 8 rows x 64 bytes)
//   rows+s     ... and the two 2-byte scale loads per step
//   rows+s+x   ... and x's 64 bytes per lane per step (4 x 16-byte __ldg of a 32 KB vector)
//   tiled      the same bytes per lane, stored so that each warp load is 512 contiguous bytes
//   tiled+s+x  tiled weights, one 4-byte scale word per lane per step (tiled too), x as above
//   tiled+sx8  the same with a ring of 8 steps instead of 4
//   stream     grid-stride 16-byte loads of the whole buffer (what plain reading reaches)
// Reported: GB/s of weight (+ scale) bytes, and the fraction of the copy bandwidth
// (cudaMemcpy device to device of 1 GiB, read + written bytes).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#include "../../libqq/src/cuda/vec.cuh"  // ld_stream: the load qmma.cu uses
using qq::cuda::ld_stream;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

constexpr int kRows = 16384, kRowBytes = 8192, kChunks = kRowBytes / 16, kWarps = 8;

struct Ld { uint4 d[2]; uint32_t s; };

template <int V, int DEPTH>
__global__ void __launch_bounds__(256, 2) pattern(const uint8_t* w, const uint8_t* sc, const uint4* x, int KS,
                                                  uint32_t* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int ks = warp % KS;
  const int tile = blockIdx.x * (kWarps / KS) + warp / KS;
  const int steps_row = kChunks / 4, nsteps = steps_row / KS;
  const uint8_t* r0 = w + (size_t)(tile * 16 + g) * kRowBytes;
  const uint8_t* r1 = r0 + (size_t)8 * kRowBytes;
  const uint8_t* s0 = sc + (size_t)(tile * 16 + g) * (kRowBytes / 8);
  const uint8_t* s1 = s0 + (size_t)8 * (kRowBytes / 8);
  auto load = [&](int step, Ld& l) {
    const int gs = ks + KS * step;          // the row's step
    if (V == 3 || V == 4) {                 // tiled: (tile, step) blocks of 2 x 512 bytes
      const uint8_t* b = w + ((size_t)tile * steps_row + gs) * 1024 + lane * 16;
      l.d[0] = ld_stream(b);
      l.d[1] = ld_stream(b + 512);
      if (V == 4) l.s = __ldg(reinterpret_cast<const uint32_t*>(sc) + ((size_t)tile * steps_row + gs) * 32 + lane);
      return;
    }
    const int c = 4 * gs + q;
    l.d[0] = ld_stream(r0 + (size_t)c * 16);
    l.d[1] = ld_stream(r1 + (size_t)c * 16);
    if (V >= 1) l.s = __ldg(reinterpret_cast<const uint16_t*>(s0 + 2 * c)) |
                      ((uint32_t)__ldg(reinterpret_cast<const uint16_t*>(s1 + 2 * c)) << 16);
  };
  uint32_t acc = 0;
  auto use = [&](int step, const Ld& l) {
    acc ^= l.d[0].x ^ l.d[0].y ^ l.d[0].z ^ l.d[0].w ^ l.d[1].x ^ l.d[1].y ^ l.d[1].z ^ l.d[1].w;
    if (V == 1 || V == 2 || V == 4) acc += l.s;
    if (V == 2 || V == 4) {
      const int c = 4 * (ks + KS * step) + q;
#pragma unroll
      for (int i = 0; i < 4; ++i) { const uint4 v = __ldg(x + (size_t)c * 4 + i); acc += v.x ^ v.y ^ v.z ^ v.w; }
    }
  };
  Ld ring[DEPTH];
#pragma unroll
  for (int p = 0; p < DEPTH; ++p) if (p < nsteps) load(p, ring[p]);
  for (int s0i = 0; s0i < nsteps; s0i += DEPTH) {
#pragma unroll
    for (int p = 0; p < DEPTH; ++p) {
      const int s = s0i + p;
      if (s < nsteps) { use(s, ring[p]); if (s + DEPTH < nsteps) load(s + DEPTH, ring[p]); }
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

__global__ void stream_read(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = ld_stream(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

template <typename F>
float time_us(F f, int iters = 20) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  f(); f();
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.f / iters;
}

int main() {
  const size_t wbytes = (size_t)kRows * kRowBytes, sbytes = wbytes / 8, cbytes = (size_t)1 << 30;
  uint8_t *w, *sc, *c0, *c1; uint4* x; uint32_t* sink;
  CK(cudaMalloc(&w, wbytes)); CK(cudaMalloc(&sc, sbytes)); CK(cudaMalloc(&x, 32768));
  CK(cudaMalloc(&c0, cbytes)); CK(cudaMalloc(&c1, cbytes)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(w, 1, wbytes)); CK(cudaMemset(sc, 2, sbytes)); CK(cudaMemset(x, 3, 32768)); CK(cudaMemset(c0, 4, cbytes));
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop; cudaGetDeviceProperties(&prop, 0);
  const float copy_us = time_us([&] { cudaMemcpyAsync(c1, c0, cbytes, cudaMemcpyDeviceToDevice); }, 10);
  const double copy = 2.0 * cbytes / copy_us / 1e3;
  printf("%s, %d SMs; copy %.0f GB/s (read + write)\n", prop.name, sms, copy);
  auto report = [&](const char* name, int ks, double bytes, float us) {
    printf("%-10s KS=%d  %8.1f us  %6.0f GB/s  %.3f of copy\n", name, ks, us, bytes / us / 1e3, bytes / us / 1e3 / copy);
  };
  const float st = time_us([&] { stream_read<<<sms * 8, 256>>>((const uint4*)w, wbytes / 16, sink); });
  report("stream", 0, wbytes, st);
  for (int ks : {1, 2, 4, 8}) {
    const dim3 grid(kRows / 16 / (kWarps / ks));
    report("rows", ks, wbytes, time_us([&] { pattern<0, 4><<<grid, 256>>>(w, sc, x, ks, sink); }));
    report("rows+s", ks, wbytes + sbytes, time_us([&] { pattern<1, 4><<<grid, 256>>>(w, sc, x, ks, sink); }));
    report("rows+s+x", ks, wbytes + sbytes, time_us([&] { pattern<2, 4><<<grid, 256>>>(w, sc, x, ks, sink); }));
    report("tiled", ks, wbytes, time_us([&] { pattern<3, 4><<<grid, 256>>>(w, sc, x, ks, sink); }));
    report("tiled+s+x", ks, wbytes + sbytes, time_us([&] { pattern<4, 4><<<grid, 256>>>(w, sc, x, ks, sink); }));
    report("tiled+sx8", ks, wbytes + sbytes, time_us([&] { pattern<4, 8><<<grid, 256>>>(w, sc, x, ks, sink); }));
  }
  CK(cudaGetLastError());
  return 0;
}
