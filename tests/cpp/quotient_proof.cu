// The proof behind codec.h's affine_quotient_fma (the GPU's affine encoders): for every pair of
// fp32 significands a, b in [1, 2) (2^23 x 2^23 pairs), with inv = RN(1 / b),
//   q = RN(a * inv),  r = RN(a - q * b) (one fma),  q' = RN(q + r * inv) (one fma),
// q' equals the IEEE quotient RN(a / b) (__fdiv_rn). codec.h says why this covers every d and
// scale the encoders give it (each step is the significands' step scaled by a power of two
// while q, inv and any nonzero residual stay in the normal range).
//
// Usage: quotient_proof [--exhaustive]. Without the flag it checks every 1024th b against every
// a (2^36 pairs, 0.05 s on an H200); with it every b (2^46 pairs, 47 s on an H200).
// Prints "affine_quotient_fma: N pairs, M mismatches" and exits nonzero on a mismatch or a CUDA
// error. tests/test_codec_proofs.py compiles and runs it where nvcc and a GPU are present.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

constexpr uint32_t kOne = 0x3f800000u;  // 1.0f: significand pairs are kOne + [0, 2^23)
constexpr int kSpan = 1 << 23;

struct Tally {
  unsigned long long pairs, bad;
  uint32_t first_a, first_b;  // one failing pair (0 if none)
};

__global__ void check(int b_stride, int b_count, Tally* t) {
  const int bi = blockIdx.x * blockDim.x + threadIdx.x;
  if (bi >= b_count) return;
  const float b = __uint_as_float(kOne + (uint32_t)bi * (uint32_t)b_stride);
  const float inv = __frcp_rn(b);
  unsigned long long bad = 0;
  uint32_t fa = 0;
  for (int ai = 0; ai < kSpan; ++ai) {
    const float a = __uint_as_float(kOne + (uint32_t)ai);
    const float q = __fmul_rn(a, inv);
    const float r = __fmaf_rn(-q, b, a);
    const float q2 = __fmaf_rn(r, inv, q);
    const bool ok = __float_as_uint(q2) == __float_as_uint(__fdiv_rn(a, b));
    bad += !ok;
    if (!ok && fa == 0) fa = __float_as_uint(a);
  }
  atomicAdd(&t->pairs, (unsigned long long)kSpan);
  if (bad) atomicAdd(&t->bad, bad);
  if (fa && atomicCAS(&t->first_a, 0u, fa) == 0u) t->first_b = __float_as_uint(b);
}

}  // namespace

int main(int argc, char** argv) {
  const bool exhaustive = argc > 1 && std::strcmp(argv[1], "--exhaustive") == 0;
  if (argc > 2 || (argc == 2 && !exhaustive)) {
    std::fprintf(stderr, "usage: %s [--exhaustive]\n", argv[0]);
    return 2;
  }
  const int stride = exhaustive ? 1 : 1024, count = kSpan / stride;
  Tally* t = nullptr;
  cudaError_t e = cudaMallocManaged(&t, sizeof(Tally));
  if (e == cudaSuccess) {
    std::memset(t, 0, sizeof(Tally));
    check<<<(count + 127) / 128, 128>>>(stride, count, t);
    e = cudaDeviceSynchronize();
  }
  if (e != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::printf("%s: every %ssignificand b against every a\n", exhaustive ? "exhaustive" : "sampled",
              exhaustive ? "" : "1024th ");
  if (t->first_a)
    std::printf("first failing pair: a 0x%08x, b 0x%08x\n", t->first_a, t->first_b);
  std::printf("affine_quotient_fma: %llu pairs, %llu mismatches\n", t->pairs, t->bad);
  const bool ok = t->bad == 0 && t->pairs == (unsigned long long)count * kSpan;
  cudaFree(t);
  return ok ? 0 : 1;
}
