// bench/tune/qmmp_proto.cu - prototype, not part of libqq: decode-shape nvfp4
// weight-only matmul (M <= 16) from a prepared weight layout streamed through a
// shared-memory ring filled by bulk copies (cp.async.bulk + mbarrier), to measure
// what fraction of copy bandwidth that design reaches before it goes into the
// library (bench/results/decode-kernel-plan.md, steps 1-4).
//
// Prepared layout ("fragment blocks", FB): 16 weight rows x 64 k = 512 code bytes +
// 64 scale bytes = 576 B, stored [N/16][K/64][576]. Lane l = 4 g + q of a warp owns
// code bytes [16 l, 16 l + 16): word j = mma k-step j; within it nibbles (0, 4) =
// A register a0 (row g), (1, 5) = a1 (row g + 8), (2, 6) = a2 (row g), (3, 7) = a3
// (row g + 8); a register's two elements are physical k = 16 q + 4 j + {0, 1} (a0,
// a1) or {2, 3} (a2, a3). So lane q's elements of the FB are all in scale group q
// (16 k): one scale pair per lane per FB, at halfword 256 + l (row g, row g + 8),
// and its x elements are 16 contiguous bf16 (two 16-byte shared loads per row of x).
// Scale codes are re-based at prepare time: bf16 bits of s * 2^117 = code * 16 +
// 0x7000 (5-bit exponent offset, 3-bit mantissa), one PRMT + one IMAD per scale.
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a qmmp_proto.cu -o qmmp
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

constexpr int kFB = 576, kStageW = 4 * 4 * kFB /* 4 row blocks x 4 FBs */, kXS = 528 /* 512 + pad */;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint32_t a, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(n));
}
__device__ __forceinline__ void mbar_expect(uint32_t a, uint32_t tx) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(tx) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  } while (!done);
}
template <bool kHint>
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t pol) {
  if (kHint)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(pol)
        : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
}
__device__ __forceinline__ uint32_t bmul(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// MODE 0: decode + mma; 1: loads only (codes, scales, x XORed together) - the
// ceiling of the access pattern. S stages, MT n8 tiles of x rows (M <= 8 MT).
template <int MT, int S, int MODE, bool kHint, int kMinB, int KC, bool kTileMajor>
__global__ void __launch_bounds__(288, kMinB)
    qmmp(const uint8_t* __restrict__ W, const __nv_bfloat16* __restrict__ x, float* __restrict__ out, int M, int N,
         int K, int cps, uint32_t mul0, uint32_t mul1) {
  constexpr int XS = KC * 512 + 16, XB = MT * 8 * XS, SW = KC * kStageW, STG = SW + XB;
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S * STG);  // full[S], empty[S]
  float* red = reinterpret_cast<float*>(bars + 2 * S);
  const int tile = blockIdx.x, nk = K / (256 * KC);
  const int c0 = blockIdx.y * cps, c1 = min(nk, c0 + cps), nch = c1 - c0;
  if (nch <= 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t bar0 = smem_u32(bars);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(bar0 + 8 * s, 1);
      mbar_init(bar0 + 8 * (S + s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // rows of x past M stay zero in every stage
  for (int s = 0; s < S; ++s)
    for (int i = threadIdx.x; i < (MT * 8 - M) * (XS / 16); i += blockDim.x)
      reinterpret_cast<uint4*>(smem + s * STG + SW + M * XS)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  if (warp == 8) {  // producer
    if (lane == 0) {
      uint64_t pol = 0;
      if (kHint) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
      const size_t kfb = K / 64;
      for (int i = 0; i < nch; ++i) {
        const int s = i % S;
        if (i >= S) mbar_wait(bar0 + 8 * (S + s), ((i / S) - 1) & 1);
        const uint32_t full = bar0 + 8 * s, dst = smem_u32(smem + s * STG);
        mbar_expect(full, SW + M * 512 * KC);
        if (kTileMajor) {  // the stage is one contiguous span: [N/64][K/256][4 rb][4 FB]
          bulk_g2s<kHint>(dst, W + ((size_t)tile * (K / 256) + (size_t)(c0 + i) * KC) * kStageW, SW, full, pol);
        } else {
          for (int rb = 0; rb < 4; ++rb)
            bulk_g2s<kHint>(dst + rb * 4 * KC * kFB, W + ((size_t)(tile * 4 + rb) * kfb + (size_t)(c0 + i) * 4 * KC) * kFB,
                            4 * KC * kFB, full, pol);
        }
        for (int m = 0; m < M; ++m)
          bulk_g2s<false>(dst + SW + m * XS, x + (size_t)m * K + (size_t)(c0 + i) * 256 * KC, 512 * KC, full, 0);
      }
    }
    return;
  }
  const int rb = warp & 3, fpar = warp >> 2, g = lane >> 2, q = lane & 3;
  float acc[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;
  uint32_t xr = 0;
  for (int i = 0; i < nch; ++i) {
    const int s = i % S;
    mbar_wait(bar0 + 8 * s, (i / S) & 1);
    const uint8_t* base = smem + s * STG;
#pragma unroll
    for (int ff = 0; ff < 2 * KC; ++ff) {
      const int f = fpar + 2 * ff;  // FB along the stage's K: 0 .. 4 KC
      const uint8_t* fb = kTileMajor ? base + ((f >> 2) * 4 + rb) * 4 * kFB + (f & 3) * kFB : base + rb * 4 * KC * kFB + f * kFB;
      const uint4 wv = *reinterpret_cast<const uint4*>(fb + 16 * lane);
      const uint32_t sc = *reinterpret_cast<const uint16_t*>(fb + 512 + 2 * lane);
      if (MODE == 1) {
        xr ^= wv.x ^ wv.y ^ wv.z ^ wv.w ^ sc;
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const uint8_t* xrow = base + SW + (8 * t + g) * XS + f * 128 + 32 * q;
          const uint4 xa = *reinterpret_cast<const uint4*>(xrow), xb = *reinterpret_cast<const uint4*>(xrow + 16);
          xr ^= xa.x ^ xa.w ^ xb.y ^ xb.z;
        }
        continue;
      }
      const uint32_t Sg = prmt(sc, 0, 0x4040u) * 16u + 0x70007000u;
      const uint32_t Sg8 = prmt(sc, 0, 0x4141u) * 16u + 0x70007000u;
      uint4 xa[MT], xb[MT];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const uint8_t* xrow = base + SW + (8 * t + g) * XS + f * 128 + 32 * q;
        xa[t] = *reinterpret_cast<const uint4*>(xrow);
        xb[t] = *reinterpret_cast<const uint4*>(xrow + 16);
      }
      const uint32_t w4[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t w = w4[j], w8 = w >> 8;
        const uint32_t a0 = bmul(((w & 0x000f000fu) * mul0) & 0x81c081c0u, Sg);
        const uint32_t a1 = bmul(((w & 0x00f000f0u) * mul1) & 0x81c081c0u, Sg8);
        const uint32_t a2 = bmul(((w8 & 0x000f000fu) * mul0) & 0x81c081c0u, Sg);
        const uint32_t a3 = bmul(((w8 & 0x00f000f0u) * mul1) & 0x81c081c0u, Sg8);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const uint32_t b0 = j == 0 ? xa[t].x : j == 1 ? xa[t].z : j == 2 ? xb[t].x : xb[t].z;
          const uint32_t b1 = j == 0 ? xa[t].y : j == 1 ? xa[t].w : j == 2 ? xb[t].y : xb[t].w;
          mma16816(acc[t], a0, a1, a2, a3, b0, b1);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bar0 + 8 * (S + s));
  }
  if (MODE == 1) acc[0][0] = (float)(xr & 1);
  // the two FB-parity warps of a row block: add in a fixed order, then out
  if (fpar == 1)
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[((rb * MT + t) * 4 + i) * 32 + lane] = acc[t][i];
  asm volatile("bar.sync 1, 256;" ::: "memory");
  if (fpar == 0) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float v = (acc[t][i] + red[((rb * MT + t) * 4 + i) * 32 + lane]) * 512.0f;  // 2^9
        const int m = 8 * t + 2 * q + (i & 1), n = tile * 64 + rb * 16 + g + 8 * (i >> 1);
        if (m < M) atomicAdd(out + (size_t)m * N + n, v);
      }
  }
}

// Independent reference: element (n, k) located in the layout by formula, decoded by table.
__device__ __host__ inline void locate(int n, int k, int K, bool tm, size_t& byte, int& shift, size_t& sbyte) {
  const int R = n / 16, r = n % 16, F = k / 64, kk = k % 64;
  const int g = r & 7, half = r >> 3, q = kk / 16, j = (kk % 16) / 4, e = kk % 4;
  const int pair = (e < 2 ? 0 : 2) + half, nib = pair + 4 * (e & 1), lane = 4 * g + q;
  const size_t fb = (tm ? (((size_t)(R / 4) * (K / 256) + F / 4) * 4 + R % 4) * 4 + F % 4 : (size_t)R * (K / 64) + F) * kFB;
  byte = fb + 16 * lane + 4 * j + nib / 2;
  shift = 4 * (nib & 1);
  sbyte = fb + 512 + 2 * lane + half;
}
__global__ void ref_kernel(const uint8_t* W, const __nv_bfloat16* x, double* out, double* mag, int M, int N, int K, bool tm) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  const float tab[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  double s = 0, a = 0;
  for (int k = 0; k < K; ++k) {
    size_t b, sb;
    int sh;
    locate(n, k, K, tm, b, sh, sb);
    const int c = (W[b] >> sh) & 15, sc = W[sb];
    const double e = (c & 8 ? -1.0 : 1.0) * tab[c & 7];
    const double scale = ldexp(1.0 + (sc & 7) / 8.0, (sc >> 3) - 20);
    const double v = (double)__bfloat162float(x[(size_t)m * K + k]) * e * scale;
    s += v;
    a += fabs(v);
  }
  out[(size_t)m * N + n] = s;
  mag[(size_t)m * N + n] = a;
}

__device__ inline uint32_t hsh(uint64_t i) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (uint32_t)(z ^ (z >> 31));
}
__global__ void fill_w(uint8_t* W, size_t bytes, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x) {
    const uint32_t h = hsh(i + ((uint64_t)seed << 40));
    const size_t o = i % kFB;
    // scale codes: exponent offset 16..22 (s in 2^-4 .. 2^2 x 1.875), any mantissa
    W[i] = o < 512 ? (uint8_t)h : (uint8_t)(((16 + (h >> 8) % 7) << 3) | (h & 7));
  }
}
__global__ void fill_x(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16(((int)(hsh(i + ((uint64_t)seed << 40)) % 2001) - 1000) / 1000.0f);
}

struct Bufs {
  uint8_t* W;
  __nv_bfloat16* x;
  float* out;
  uint8_t* flush;
};
constexpr size_t kFlush = 256ull << 20;

template <int MT, int S, int MODE, bool kHint, int kMinB, int KC, bool TM>
float run(const Bufs& b, int M, int N, int K, int ksplit, int reps, bool check) {
  constexpr int XS = KC * 512 + 16, XB = MT * 8 * XS, STG = KC * kStageW + XB;
  const size_t smem = S * STG + 2 * S * 8 + 4 * MT * 4 * 32 * 4;
  auto kern = qmmp<MT, S, MODE, kHint, kMinB, KC, TM>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const int nk = K / (256 * KC), cps = (nk + ksplit - 1) / ksplit;
  dim3 grid(N / 64, (nk + cps - 1) / cps);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int r = 0; r < reps + 2; ++r) {
    CK(cudaMemsetAsync(b.flush, r & 0xff, kFlush));
    CK(cudaMemsetAsync(b.out, 0, (size_t)M * N * 4));
    CK(cudaEventRecord(e0));
    kern<<<grid, 288, smem>>>(b.W, b.x, b.out, M, N, K, cps, 65u << 6, 65u << 2);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 2) ts.push_back(ms * 1000.0f);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  if (check && MODE == 0) {
    double *ro, *rm;
    CK(cudaMalloc(&ro, (size_t)M * N * 8));
    CK(cudaMalloc(&rm, (size_t)M * N * 8));
    ref_kernel<<<dim3((N + 127) / 128, M), 128>>>(b.W, b.x, ro, rm, M, N, K, TM);
    CK(cudaDeviceSynchronize());
    std::vector<double> hr((size_t)M * N), hm((size_t)M * N);
    std::vector<float> ho((size_t)M * N);
    CK(cudaMemcpy(hr.data(), ro, hr.size() * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hm.data(), rm, hm.size() * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ho.data(), b.out, ho.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (size_t i = 0; i < ho.size(); ++i) worst = std::max(worst, fabs(ho[i] - hr[i]) / (hm[i] + 1e-30));
    printf("  check M=%d N=%d K=%d: max |err| / sum|x w| = %.3g %s\n", M, N, K, worst, worst < 2e-6 ? "OK" : "FAIL");
    CK(cudaFree(ro));
    CK(cudaFree(rm));
  }
  return ts[ts.size() / 2];
}

int main(int argc, char** argv) {
  int dev;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, dev));
  printf("device %s, %d SMs\n", p.name, p.multiProcessorCount);
  const size_t maxW = (size_t)28672 * 16384 / 64 * kFB / 16 * 1;  // >= 16384^2 and 28672 x 4096
  Bufs b;
  CK(cudaMalloc(&b.W, std::max(maxW, (size_t)16384 * 16384 / 1024 * kFB)));
  CK(cudaMalloc(&b.x, (size_t)16 * 16384 * 2));
  CK(cudaMalloc(&b.out, (size_t)16 * 28672 * 4));
  CK(cudaMalloc(&b.flush, kFlush));
  // copy bandwidth (read + write) on 1 GB
  {
    uint8_t *s, *d;
    const size_t n = 1ull << 30;
    CK(cudaMalloc(&s, n));
    CK(cudaMalloc(&d, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int r = 0; r < 7; ++r) {
      CK(cudaEventRecord(e0));
      CK(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    printf("copy bandwidth %.1f GB/s\n", 2.0 * n / (ts[3] * 1e-3) / 1e9);
    CK(cudaFree(s));
    CK(cudaFree(d));
  }
  const int shapes[5][2] = {{16384, 16384}, {6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  const int Ms[] = {1, 16};
  for (auto& sh : shapes) {
    const int N = sh[0], K = sh[1];
    const size_t wbytes = (size_t)N * K / 1024 * kFB;
    fill_w<<<1024, 256>>>(b.W, wbytes, N ^ K);
    fill_x<<<256, 256>>>(b.x, (size_t)16 * K, K);
    CK(cudaDeviceSynchronize());
    const int tiles = N / 64, nk = K / 256;
    for (int M : Ms) {
      auto gbs = [&](float us) { return wbytes / (us * 1e-6) / 1e9; };
      printf("N=%d K=%d M=%d (%.1f MB)\n", N, K, M, wbytes / 1e6);
#define VARIANT(NAME, MT, S, MODE, MINB, KC, TM)                                                  \
  {                                                                                               \
    if (MODE == 0) run<MT, S, MODE, true, MINB, KC, TM>(b, M, N, K, 4, 1, true);                   \
    float best = 1e30f;                                                                           \
    int bk = 0;                                                                                   \
    printf("  %-28s", NAME);                                                                      \
    for (int ks : {1, 2, 3, 4, 6, 8, 16}) {                                                       \
      if (ks > nk / KC || (ks > 1 && tiles * ks > 4 * 132 * 3)) continue;                         \
      const float t = run<MT, S, MODE, true, MINB, KC, TM>(b, M, N, K, ks, 15, false);            \
      printf(" %d:%.1f", ks, t);                                                                  \
      if (t < best) best = t, bk = ks;                                                            \
    }                                                                                             \
    printf("  best ks%d %.1f us %.0f GB/s\n", bk, best, gbs(best));                               \
  }
      if (M <= 8) {
        VARIANT("rows S4 3CTA", 1, 4, 0, 3, 1, false)
        VARIANT("tile-major S4 3CTA", 1, 4, 0, 3, 1, true)
        VARIANT("tile-major S5 3CTA", 1, 5, 0, 3, 1, true)
        VARIANT("tile-major S4 4CTA", 1, 4, 0, 4, 1, true)
        VARIANT("tile-major KC2 S3 3CTA", 1, 3, 0, 3, 2, true)
        VARIANT("tile-major KC2 S4 2CTA", 1, 4, 0, 2, 2, true)
        VARIANT("loads-only tile-major S4", 1, 4, 1, 3, 1, true)
        VARIANT("loads-only tile-major KC2 S3", 1, 3, 1, 3, 2, true)
      } else {
        VARIANT("rows S4 3CTA", 2, 4, 0, 3, 1, false)
        VARIANT("tile-major S4 3CTA", 2, 4, 0, 3, 1, true)
        VARIANT("tile-major KC2 S3 2CTA", 2, 3, 0, 2, 2, true)
        VARIANT("loads-only tile-major S4", 2, 4, 1, 3, 1, true)
      }
    }
  }
  return 0;
}
