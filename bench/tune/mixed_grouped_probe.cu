// bench/tune/mixed_grouped_probe.cu - step 1 of bench/results/moe-mixed-input-plan.md: can a
// grouped GEMM that reads the experts' E4M3 codes (converted to bf16 in the mainloop) run
// the MoE forward as fast as the bf16 grouped GEMM libqq runs today? If so, the weights'
// quantize-dequantize pass (q(W)'s bf16 values written every step, ~1 ms of the E = 32
// step, moe-h200-notes.md) could write 1-byte codes instead, and the GEMM would read them.
//
// Standalone (not part of libqq): CUTLASS's sm90 ptr-array grouped kernels only.
//   ref      bf16 x bf16, libqq's grouped_gemm_sm90.cu configuration (tokens as A,
//            128x256x64 tile, cluster 2x1x1, cooperative), weights = bf16(codes * scale)
//   dc128    mixed input, codes as the converted operand (CUTLASS needs it to be A: the
//            problem is swapped, D^T = W . X^T, as in CUTLASS's example 69), DirectConvert,
//            tile 128 (weight rows) x 128 (tokens) x 64, cluster 1x1x1
//   dc256    the same, tile 128 x 256 x 64, cluster 1x1x1
//   sc128    ConvertAndScale: bf16 scale per (weight row, 64 of K) (chunk 64 = TileK), tile
//            128 x 128 x 64 - the cost of the scale multiply (a 32x32-tile MXFP8 scale needs
//            two scales per 64 of K: that fork of the collective is step 2, not here)
// For each: us per call (CUDA events, mean of 20 after 3 warm-up calls), TFLOP/s, and the
// largest |difference| from ref over the whole output and the count of differing bf16 words
// (same values multiplied: 0 when the fp32 sums are taken in the same order).
//   nvcc -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//     -I.cutlass bench/tune/mixed_grouped_probe.cu -o /tmp/mgp && /tmp/mgp
// (-DNDEBUG as in libqq's Release build: CUTLASS's device asserts are calls, and a call inside
// the mainloop makes ptxas serialize the wgmma pipeline.)
// Shapes: T = 16384 tokens spread evenly over E = 8 and 32 experts, (N, K) = (4096, 4096)
// and (4096, 2048) - bench_moe's forward GEMMs (gate_up, down).
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmath>

#include <type_traits>
#include <vector>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

using namespace cute;

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

using Bf16 = cutlass::bfloat16_t;
using E4m3 = cutlass::float_e4m3_t;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Shape3 = ProblemShape::UnderlyingProblemShape;
using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;

// ---- ref: libqq's bf16 grouped GEMM (tokens x [rows of e, K] @ W[e]^T) ----
struct Ref {
  using Tile = Shape<_128, _256, _64>;
  using Cluster = Shape<_2, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, void, RowMajor*, 8, Bf16, RowMajor*, 8, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Bf16, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, RowMajor*, 8, Bf16, ColMajor*, 8, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// ---- mixed: the swapped problem D^T [N, rows] = W[e] [N, K] (codes, K-major) @ X^T ----
// Internal A = the codes (RowMajor [N, K]), internal B = the tokens (ColumnMajor K x rows,
// i.e. [rows, K] rows), D ColumnMajor N x rows (i.e. [rows, N] rows, the output as stored).
template <typename AElem, typename TileT, typename ClusterT>
struct Mixed {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileT, ClusterT, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, void, ColMajor*, 8, Bf16, ColMajor*, 8, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Bf16, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, AElem, RowMajor*, 16, Bf16, ColMajor*, 8, float, TileT,
      ClusterT,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
using Dc128 = Mixed<E4m3, Shape<_128, _128, _64>, Shape<_1, _1, _1>>;
using Dc256 = Mixed<E4m3, Shape<_128, _256, _64>, Shape<_1, _1, _1>>;
using Sc128 = Mixed<cute::tuple<E4m3, Bf16>, Shape<_128, _128, _64>, Shape<_1, _1, _1>>;

using RSA = Ref::Kernel::InternalStrideA;
using RSB = Ref::Kernel::InternalStrideB;
using RSD = Ref::Kernel::InternalStrideD;
static_assert(std::is_same_v<RSA, Stride<int64_t, _1, _0>> && std::is_same_v<RSB, Stride<int64_t, _1, _0>> &&
              std::is_same_v<RSD, Stride<int64_t, _1, _0>>, "ref strides: (pitch, 1, 0)");
using MSA = Dc128::Kernel::InternalStrideA;
using MSB = Dc128::Kernel::InternalStrideB;
using MSD = Dc128::Kernel::InternalStrideD;
static_assert(std::is_same_v<MSA, Stride<int64_t, _1, _0>> && std::is_same_v<MSB, Stride<int64_t, _1, _0>>,
              "mixed A, B: (pitch, 1, 0)");
static_assert(std::is_same_v<MSD, Stride<_1, int64_t, _0>>, "mixed D: column-major (1, pitch, 0)");
using SS = Sc128::Mainloop::NonVoidStrideScale;  // (1, N, 0): [K/64][N] per expert, N contiguous

template <typename T>
T* dalloc(size_t n) {
  T* p;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}
template <typename T>
T* upload(const std::vector<T>& v) {
  T* p = dalloc<T>(v.size());
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// codes: random E4M3 bytes that are neither NaN (0x7f / 0xff) nor larger than 2^4 in
// magnitude (products stay far from overflow); x: bf16 in [-1, 1); scales: 2^(-3..3)
__global__ void init_kernel(uint8_t* codes, Bf16* x, uint16_t* sbits, int64_t n_codes, int64_t n_x, int64_t n_s,
                            uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_codes + n_x + n_s;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    if (i < n_codes) {
      uint8_t c = (uint8_t)(h & 0x87) | (uint8_t)(((h >> 8) % 12) << 3);  // exponent field 0..11 (< 2^5)
      codes[i] = c;
    } else if (i < n_codes + n_x) {
      x[i - n_codes] = Bf16((float)(int)(h & 0xffff) / 32768.0f - 1.0f);
    } else {
      sbits[i - n_codes - n_x] = (uint16_t)((127 - 3 + (h % 7)) << 7);  // bf16 2^(-3..3)
    }
  }
}

// ref's bf16 weights: w[e, n, k] = e4m3(code) * scale[e, k / 64, n] (exact in bf16)
__global__ void dequant_kernel(const uint8_t* codes, const uint16_t* sbits, Bf16* w, int E, int N, int K, bool scaled) {
  const int64_t total = (int64_t)E * N * K;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e = i / ((int64_t)N * K), r = i % ((int64_t)N * K), n = r / K, k = r % K;
    float v = float(E4m3::bitcast(codes[i]));
    if (scaled) {
      uint16_t b = sbits[(e * (K / 64) + k / 64) * N + n];
      v *= __uint_as_float((uint32_t)b << 16);
    }
    w[i] = Bf16(v);
  }
}

struct Problem {
  int E, T, N, K;
  uint8_t* codes;
  uint16_t* sbits;
  Bf16 *x, *w, *d_ref, *d_mix;
};

template <typename G>
float time_gemm(G& gemm, int iters, void* ws, const typename G::Arguments& args) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i)
    if (gemm.run() != cutlass::Status::kSuccess) printf("run failed\n");
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) gemm.run();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  return ms * 1000.f / iters;
}

cutlass::KernelHardwareInfo hw_info() {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
  return hw;
}

float run_ref(const Problem& p) {
  std::vector<Shape3> shapes(p.E);
  std::vector<const Bf16*> pa(p.E), pb(p.E);
  std::vector<Bf16*> pd(p.E);
  std::vector<RSA> sa(p.E);
  std::vector<RSB> sb(p.E);
  std::vector<RSD> sd(p.E);
  const int m = p.T / p.E;
  for (int e = 0; e < p.E; ++e) {
    shapes[e] = make_shape(m, p.N, p.K);
    pa[e] = p.x + (int64_t)e * m * p.K;
    pb[e] = p.w + (int64_t)e * p.N * p.K;
    pd[e] = p.d_ref + (int64_t)e * m * p.N;
    get<0>(sa[e]) = p.K, get<0>(sb[e]) = p.K, get<0>(sd[e]) = p.N;
  }
  using G = Ref::Gemm;
  typename G::Arguments args;
  decltype(args.epilogue.thread) fusion;
  fusion.alpha = 1.f, fusion.beta = 0.f;
  args = typename G::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                               {p.E, upload(shapes), nullptr},
                               {upload(pa), upload(sa), upload(pb), upload(sb)},
                               {fusion, nullptr, nullptr, upload(pd), upload(sd)},
                               hw_info()};
  G gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return printf("ref: can_implement refused\n"), -1.f;
  void* ws = dalloc<uint8_t>(G::get_workspace_size(args) + 1);
  if (gemm.initialize(args, ws) != cutlass::Status::kSuccess) return printf("ref: initialize failed\n"), -1.f;
  return time_gemm(gemm, 20, ws, args);
}

template <typename M>
float run_mixed(const Problem& p, bool scaled) {
  std::vector<Shape3> shapes(p.E);
  std::vector<const E4m3*> pa(p.E);
  std::vector<const Bf16*> pb(p.E), ps(p.E);
  std::vector<Bf16*> pd(p.E);
  std::vector<MSA> sa(p.E);
  std::vector<MSB> sb(p.E);
  std::vector<MSD> sd(p.E);
  std::vector<SS> ss(p.E);
  const int m = p.T / p.E;
  for (int e = 0; e < p.E; ++e) {
    shapes[e] = make_shape(p.N, m, p.K);  // swapped: (weight rows, tokens, K)
    pa[e] = reinterpret_cast<const E4m3*>(p.codes) + (int64_t)e * p.N * p.K;
    pb[e] = p.x + (int64_t)e * m * p.K;
    pd[e] = p.d_mix + (int64_t)e * m * p.N;
    ps[e] = reinterpret_cast<const Bf16*>(p.sbits) + (int64_t)e * (p.K / 64) * p.N;
    get<0>(sa[e]) = p.K, get<0>(sb[e]) = p.K, get<1>(sd[e]) = p.N;
    get<1>(ss[e]) = p.N;
  }
  using G = typename M::Gemm;
  typename G::Arguments args;
  decltype(args.epilogue.thread) fusion;
  fusion.alpha = 1.f, fusion.beta = 0.f;
  typename G::GemmKernel::MainloopArguments ml{upload(pa), upload(sa), upload(pb), upload(sb)};
  if constexpr (!std::is_same_v<M, Dc128> && !std::is_same_v<M, Dc256>) {
    ml.ptr_S = upload(ps);
    ml.dS = upload(ss);
    ml.chunk_size = 64;
  }
  (void)scaled;
  args = typename G::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                               {p.E, upload(shapes), nullptr},
                               ml,
                               {fusion, nullptr, nullptr, upload(pd), upload(sd)},
                               hw_info()};
  G gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return printf("mixed: can_implement refused\n"), -1.f;
  void* ws = dalloc<uint8_t>(G::get_workspace_size(args) + 1);
  if (gemm.initialize(args, ws) != cutlass::Status::kSuccess) return printf("mixed: initialize failed\n"), -1.f;
  return time_gemm(gemm, 20, ws, args);
}

// largest |ref - mixed| and the count of differing words; NaN anywhere counts as a difference
void compare(const Problem& p, double* maxdiff, int64_t* ndiff, double* maxref) {
  const int64_t n = (int64_t)p.T * p.N;
  std::vector<uint16_t> a(n), b(n);
  CK(cudaMemcpy(a.data(), p.d_ref, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), p.d_mix, n * 2, cudaMemcpyDeviceToHost));
  *maxdiff = 0, *ndiff = 0, *maxref = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t ua = (uint32_t)a[i] << 16, ub = (uint32_t)b[i] << 16;
    float fa, fb;
    memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
    if (a[i] != b[i]) ++*ndiff;
    double d = fabs((double)fa - fb);
    if (!(d <= *maxdiff)) *maxdiff = d;  // (NaN sticks)
    if (fabs(fa) > *maxref) *maxref = fabs(fa);
  }
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const int T = 16384;
  const int NK[2][2] = {{4096, 4096}, {4096, 2048}};
  for (int E : {8, 32}) {
    for (auto& nk : NK) {
      Problem p{E, T, nk[0], nk[1], nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
      const int64_t nc = (int64_t)E * p.N * p.K, nx = (int64_t)T * p.K, ns = (int64_t)E * (p.K / 64) * p.N;
      p.codes = dalloc<uint8_t>(nc);
      p.sbits = dalloc<uint16_t>(ns);
      p.x = dalloc<Bf16>(nx);
      p.w = dalloc<Bf16>(nc);
      p.d_ref = dalloc<Bf16>((int64_t)T * p.N);
      p.d_mix = dalloc<Bf16>((int64_t)T * p.N);
      init_kernel<<<1024, 256>>>(p.codes, p.x, p.sbits, nc, nx, ns, 12345u + E + p.K);
      CK(cudaGetLastError());
      const double flop = 2.0 * T * p.N * p.K;
      struct Case {
        const char* name;
        bool scaled;
        float (*fn)(const Problem&, bool);
      } cases[] = {{"dc128", false, run_mixed<Dc128>}, {"dc256", false, run_mixed<Dc256>}, {"sc128", true, run_mixed<Sc128>}};
      for (const Case& c : cases) {
        dequant_kernel<<<1024, 256>>>(p.codes, p.sbits, p.w, E, p.N, p.K, c.scaled);
        CK(cudaGetLastError());
        CK(cudaMemset(p.d_ref, 0xff, (int64_t)T * p.N * 2));  // poison: NaN bf16
        CK(cudaMemset(p.d_mix, 0xff, (int64_t)T * p.N * 2));
        const float us_ref = run_ref(p);
        const float us_mix = c.fn(p, c.scaled);
        CK(cudaDeviceSynchronize());
        double maxdiff, maxref;
        int64_t ndiff;
        compare(p, &maxdiff, &ndiff, &maxref);
        printf("E=%2d N=%d K=%d %-6s ref %8.1f us %6.1f TFLOP/s | mixed %8.1f us %6.1f TFLOP/s | mixed/ref time %.3f"
               " | max|diff| %.3g (max|ref| %.3g), %lld of %lld words differ\n",
               E, p.N, p.K, c.name, us_ref, flop / us_ref * 1e-6, us_mix, flop / us_mix * 1e-6, us_mix / us_ref,
               maxdiff, maxref, (long long)ndiff, (long long)T * p.N);
        fflush(stdout);
      }
      for (void* q : {(void*)p.codes, (void*)p.sbits, (void*)p.x, (void*)p.w, (void*)p.d_ref, (void*)p.d_mix})
        CK(cudaFree(q));
    }
  }
  return 0;
}
