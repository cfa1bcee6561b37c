// Where the CTAs of a clustered launch land: %smid of every CTA of a grid of (tiles, ks)
// CTAs in clusters of (1, ks, 1), for a dynamic shared-memory size that lets 1..4 such CTAs
// share an SM, under each cluster scheduling policy preference. The CTAs spin ~20 us so
// that the whole grid is resident at once (as a decode_matmul launch at the 4096-row weights
// is: 128 CTAs on 132 SMs). Prints, per case: SMs used, the most CTAs on one SM, and how many
// clusters had both CTAs on one SM.
//   nvcc -O2 -arch=sm_90a -o /tmp/cp bench/tune/cluster_placement.cu && /tmp/cp
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

__global__ void probe(int* smid, long long spin) {
  extern __shared__ char s[];
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  const int b = blockIdx.x + gridDim.x * blockIdx.y;
  if (threadIdx.x == 0) smid[b] = (int)id;
  const long long t = clock64();
  while (clock64() - t < spin) {
  }
  s[threadIdx.x] = (char)id;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int* d = nullptr;
  cudaMalloc(&d, 4096 * sizeof(int));
  const char* names[] = {"default", "spread", "load-balancing"};
  const cudaClusterSchedulingPolicy pol[] = {cudaClusterSchedulingPolicyDefault, cudaClusterSchedulingPolicySpread,
                                             cudaClusterSchedulingPolicyLoadBalancing};
  printf("SMs %d\n", sms);
  for (int tiles : {64, 96}) {
    for (int ks : {1, 2}) {
      for (int per : {1, 2, 3, 4}) {
        const size_t smem = (size_t)(228 / per - 2) * 1024;
        for (int pi = 0; pi < 3; ++pi) {
          if (ks == 1 && pi) continue;
          cudaLaunchAttribute at[2];
          at[0].id = cudaLaunchAttributeClusterDimension;
          at[0].val.clusterDim.x = 1;
          at[0].val.clusterDim.y = ks;
          at[0].val.clusterDim.z = 1;
          at[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
          at[1].val.clusterSchedulingPolicyPreference = pol[pi];
          cudaLaunchConfig_t c = {};
          c.gridDim = dim3(tiles, ks, 1);
          c.blockDim = dim3(320, 1, 1);
          c.dynamicSmemBytes = smem;
          c.attrs = at;
          c.numAttrs = 2;
          const int n = tiles * ks;
          cudaMemset(d, 0xff, n * sizeof(int));
          cudaError_t e = cudaLaunchKernelEx(&c, probe, d, 40000LL);
          if (e == cudaSuccess) e = cudaDeviceSynchronize();
          if (e != cudaSuccess) {
            printf("tiles %d ks %d per-SM %d %-14s error %s\n", tiles, ks, per, names[pi], cudaGetErrorString(e));
            cudaGetLastError();
            continue;
          }
          std::vector<int> h(n), cnt(1024, 0);
          cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost);
          int used = 0, most = 0, same = 0;
          for (int b = 0; b < n; ++b)
            if (cnt[h[b]]++ == 0) ++used;
          for (int v : cnt) most = v > most ? v : most;
          if (ks == 2)
            for (int t = 0; t < tiles; ++t) same += h[t] == h[t + tiles];
          printf("tiles %d ks %d per-SM %d (%3zu KB) %-14s SMs used %3d, most CTAs on one SM %d, clusters on one SM %d\n",
                 tiles, ks, per, smem / 1024, names[pi], used, most, same);
        }
      }
    }
  }
  return 0;
}
