// bench/tune/instr_rate.cu - how many of one instruction an SM issues a clock, for the
// instructions the quantize encoders choose between. Session ah replaced the mxfp8
// quantize-dequantize's fp32 form (unpack, FMUL, F2FP.SATFINITE.E4M3, F2FP.F16.E4M3.UNPACK,
// HADD2.F32, FMUL, F2FP.BF16.PACK: ~11 a pair, 3 of them conversions) by a bf16x2 form (2
// HMNMX2.BF16, 2 HFMA2.BF16, VIADD, 3 LOP3: 8 a pair) and the pass ran 0.80 -> 0.63 of
// copy on an H200 (bench/results/quantize-h200-profile.md): fewer instructions, slower.
// This measures each instruction's rate alone, so that the next encoder is chosen by
// numbers rather than by instruction counts.
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a bench/tune/instr_rate.cu -o /tmp/ir && /tmp/ir
// Each thread runs kChains independent chains of the instruction kIters times (inline asm,
// volatile: nothing is folded away); 4 blocks of 256 threads an SM, all resident at once;
// the cycles are the largest clock64() span of any block. Printed: warp-wide operations a
// clock an SM (4.0 = one a clock on each of the 4 schedulers: "full rate"). The SASS is
// not always one instruction an operation: ptxas (CUDA 13.0, sm_90a) fuses two max steps
// into one 3-input VIMNMX3 / VHMNMX (2 operations an instruction) and spreads the 16-bit
// fmas over HFMA2 and HFMA2.MMA (two pipes); check with cuobjdump -sass /tmp/ir.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) return printf("%s: %s\n", #x, cudaGetErrorString(e_)), 1; \
  } while (0)

constexpr int kChains = 8, kIters = 4096, kThreads = 256, kBlocksPerSm = 4;

// kChains chains a thread, kIters steps each: r[i] = step(r[i], k) (k a run-time value, so
// nothing is constant), timed by clock64() around the loop
template <typename T, typename Step>
__device__ __forceinline__ void chains(T seed, T k, T* out, long long* cyc, Step step) {
  T r[kChains];
#pragma unroll
  for (int i = 0; i < kChains; ++i) r[i] = seed + (T)(threadIdx.x + i);
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int i = 0; i < kChains; ++i) r[i] = step(r[i], k);
  }
  const long long t1 = clock64();
  T s = r[0];
#pragma unroll
  for (int i = 1; i < kChains; ++i) s += r[i];
  out[blockIdx.x * kThreads + threadIdx.x] = s;
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
}

#define OP_KERNEL(NAME, ASM, CONSTRAINT, TYPE)                                                    \
  __global__ void __launch_bounds__(kThreads) NAME(TYPE seed, TYPE k, TYPE* out, long long* cyc) { \
    chains(seed, k, out, cyc, [](TYPE r, TYPE k) {                                                \
      asm volatile(ASM : "+" CONSTRAINT(r) : CONSTRAINT(k));                                      \
      return r;                                                                                   \
    });                                                                                           \
  }

OP_KERNEL(k_hfma2_bf16, "fma.rn.bf16x2 %0, %0, %1, %0;", "r", uint32_t)   // HFMA2.BF16_V2
OP_KERNEL(k_hmax2_bf16, "max.bf16x2 %0, %0, %1;", "r", uint32_t)          // HMNMX2.BF16_V2
OP_KERNEL(k_hfma2_f16, "fma.rn.f16x2 %0, %0, %1, %0;", "r", uint32_t)     // HFMA2
OP_KERNEL(k_vmax_u16x2, "max.u16x2 %0, %0, %1;", "r", uint32_t)           // VIMNMX.U16x2
OP_KERNEL(k_imax_u32, "max.u32 %0, %0, %1;", "r", uint32_t)               // VIMNMX.U32
OP_KERNEL(k_lop3, "lop3.b32 %0, %0, %1, 0x80008000, 0xea;", "r", uint32_t)  // LOP3
OP_KERNEL(k_prmt, "prmt.b32 %0, %0, %1, 0x5410;", "r", uint32_t)          // PRMT
OP_KERNEL(k_ffma, "fma.rn.f32 %0, %0, %1, %0;", "f", float)               // FFMA
OP_KERNEL(k_fmul, "mul.rn.f32 %0, %0, %1;", "f", float)                   // FMUL
// the fp4 decoders' integer steps (vec.cuh's fp4_pairs: LOP3, IMAD, SHF) and its scale multiply
OP_KERNEL(k_imad, "mad.lo.u32 %0, %0, %1, %0;", "r", uint32_t)           // IMAD
OP_KERNEL(k_shf, "shf.r.wrap.b32 %0, %0, %0, %1;", "r", uint32_t)        // SHF
OP_KERNEL(k_iadd, "add.u32 %0, %0, %1;", "r", uint32_t)                  // IADD3
OP_KERNEL(k_hmul2_bf16, "mul.rn.bf16x2 %0, %0, %1;", "r", uint32_t)      // HMUL2.BF16_V2
// two instructions a step (per_step 2): do two pipes issue side by side?
OP_KERNEL(k_lop3_imad, "lop3.b32 %0, %0, %1, 0x80008000, 0xea;\n\tmad.lo.u32 %0, %0, %1, %0;", "r", uint32_t)
OP_KERNEL(k_lop3_hmul2, "lop3.b32 %0, %0, %1, 0x80008000, 0xea;\n\tmul.rn.bf16x2 %0, %0, %1;", "r", uint32_t)
OP_KERNEL(k_imad_hmul2, "mad.lo.u32 %0, %0, %1, %0;\n\tmul.rn.bf16x2 %0, %0, %1;", "r", uint32_t)
OP_KERNEL(k_lop3_prmt, "lop3.b32 %0, %0, %1, 0x80008000, 0xea;\n\tprmt.b32 %0, %0, %1, 0x5410;", "r", uint32_t)

// conversions: each step goes through the conversion(s) (the result feeds the next step)
__global__ void __launch_bounds__(kThreads) k_cvt_e4m3(uint32_t seed, uint32_t k, uint32_t* out, long long* cyc) {
  chains(seed, k, out, cyc, [](uint32_t r, uint32_t k) {  // F2FP.SATFINITE.E4M3.F32.PACK_AB, F2FP.F16.E4M3.UNPACK_B
    uint16_t c;
    asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c) : "f"(__uint_as_float(r & 0x3fffffffu)),
                 "f"(__uint_as_float(k)));
    asm volatile("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(c));
    return r;
  });
}
__global__ void __launch_bounds__(kThreads) k_cvt_bf16x2(uint32_t seed, uint32_t k, uint32_t* out, long long* cyc) {
  chains(seed, k, out, cyc, [](uint32_t r, uint32_t k) {  // F2FP.BF16.F32.PACK_AB
    asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(__uint_as_float(r)), "f"(__uint_as_float(k)));
    return r;
  });
}

template <typename T>
int measure(const char* name, int per_step, void (*kern)(T, T, T*, long long*), T seed, T k, int sms, T* out,
            long long* cyc) {
  const int blocks = sms * kBlocksPerSm;
  kern<<<blocks, kThreads>>>(seed, k, out, cyc);  // warm-up
  CK(cudaDeviceSynchronize());
  kern<<<blocks, kThreads>>>(seed, k, out, cyc);
  CK(cudaDeviceSynchronize());
  long long h[4096], mx = 0;
  CK(cudaMemcpy(h, cyc, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
  for (int i = 0; i < blocks; ++i) mx = h[i] > mx ? h[i] : mx;
  const double warp_instr = (double)kBlocksPerSm * (kThreads / 32) * kIters * kChains * per_step;
  printf("%-40s %6.2f warp ops / clock / SM\n", name, warp_instr / (double)mx);
  return 0;
}

int main() {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("device %s, %d SMs\n", p.name, p.multiProcessorCount);
  const int sms = p.multiProcessorCount;
  uint32_t* out;
  long long* cyc;
  CK(cudaMalloc(&out, sms * kBlocksPerSm * kThreads * sizeof(uint32_t)));
  CK(cudaMalloc(&cyc, sms * kBlocksPerSm * sizeof(long long)));
  float* fout = reinterpret_cast<float*>(out);
  int rc = 0;
  rc |= measure<uint32_t>("fma.rn.bf16x2 (HFMA2.BF16_V2)", 1, k_hfma2_bf16, 0x3f803f80u, 0x3f813f81u, sms, out, cyc);
  rc |= measure<uint32_t>("max.bf16x2 (HMNMX2.BF16_V2)", 1, k_hmax2_bf16, 0x3f803f80u, 0x3f813f81u, sms, out, cyc);
  rc |= measure<uint32_t>("fma.rn.f16x2 (HFMA2)", 1, k_hfma2_f16, 0x3c003c00u, 0x3c013c01u, sms, out, cyc);
  rc |= measure<uint32_t>("max.u16x2 (VIMNMX.U16x2)", 1, k_vmax_u16x2, 1u, 0x00050005u, sms, out, cyc);
  rc |= measure<uint32_t>("max.u32 (VIMNMX.U32)", 1, k_imax_u32, 1u, 5u, sms, out, cyc);
  rc |= measure<uint32_t>("lop3.b32 (LOP3.LUT)", 1, k_lop3, 1u, 0x7f807f80u, sms, out, cyc);
  rc |= measure<uint32_t>("prmt.b32 (PRMT)", 1, k_prmt, 1u, 0x12345678u, sms, out, cyc);
  rc |= measure<float>("fma.rn.f32 (FFMA)", 1, k_ffma, 1.0f, 0.999f, sms, fout, cyc);
  rc |= measure<float>("mul.rn.f32 (FMUL)", 1, k_fmul, 1.0f, 0.999f, sms, fout, cyc);
  rc |= measure<uint32_t>("mad.lo.u32 (IMAD)", 1, k_imad, 1u, 3u, sms, out, cyc);
  rc |= measure<uint32_t>("shf.r.wrap (SHF)", 1, k_shf, 1u, 3u, sms, out, cyc);
  rc |= measure<uint32_t>("add.u32 (IADD3)", 1, k_iadd, 1u, 3u, sms, out, cyc);
  rc |= measure<uint32_t>("mul.rn.bf16x2 (HMUL2.BF16_V2)", 1, k_hmul2_bf16, 0x3f803f80u, 0x3f813f81u, sms, out, cyc);
  rc |= measure<uint32_t>("LOP3 + IMAD", 2, k_lop3_imad, 1u, 3u, sms, out, cyc);
  rc |= measure<uint32_t>("LOP3 + HMUL2.BF16", 2, k_lop3_hmul2, 1u, 0x3f813f81u, sms, out, cyc);
  rc |= measure<uint32_t>("IMAD + HMUL2.BF16", 2, k_imad_hmul2, 1u, 0x3f813f81u, sms, out, cyc);
  rc |= measure<uint32_t>("LOP3 + PRMT", 2, k_lop3_prmt, 1u, 0x12345678u, sms, out, cyc);
  rc |= measure<uint32_t>("e4m3x2.f32 + f16x2.e4m3x2 cvt (2 F2FP, +LOP3)", 2, k_cvt_e4m3, 0x3f800000u, 0x3f000000u, sms, out,
                          cyc);
  rc |= measure<uint32_t>("cvt.rn.bf16x2.f32 (F2FP.BF16.PACK_AB)", 1, k_cvt_bf16x2, 0x3f800000u, 0x3f000000u, sms, out,
                          cyc);
  return rc;
}
