// cuda/prefetch.cu - qqPrefetch on the GPU: bytes asked into the L2 cache, a hint.
//
// Why libqq has it: in a decode step the gate/up matmul reads 58 MB of nvfp4 weights at
// ~0.7 of the copy's bandwidth (bound by its decode instructions at four CTAs an SM) and
// the down matmul that follows reads its 33 MB at ~0.45 (one CTA an SM, bound by latency;
// bench/results/qmm-decode-h100-notes.md). Down's weights asked into the L2 while gate/up
// runs use the DRAM time gate/up leaves idle, and down then reads them from the L2. The
// decode kernels load their weights with an evict-first policy, so gate/up's stream does
// not push the prefetched lines out first.
//
// One warp a block, a block an SM (fewer for a short span); the lanes ask for 16 KB pieces with
// cp.async.bulk.prefetch.L2 (sm_90+: the TMA unit issues the line requests, so the SMs'
// issue slots and the kernels running beside it are barely touched). Launched for
// programmatic dependent launch: the next kernel may start at once, and this kernel ends
// only after the kernel before it (griddepcontrol.wait), so that a kernel waiting on this
// one also waits on everything before it. Only the 16-byte-aligned interior of the span
// is asked for (the instruction's granule); the at most 30 bytes outside it are left.
#include <cuda_runtime.h>

#include "common.cuh"  // (first: ../internal.h after cuda_fp16.h)

namespace qq {
namespace cuda {
namespace {

constexpr int64_t kPiece = 16 << 10;

__global__ void __launch_bounds__(32) prefetch_kernel(const char* p, int64_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int64_t i = ((int64_t)blockIdx.x * 32 + threadIdx.x) * kPiece; i < n; i += (int64_t)gridDim.x * 32 * kPiece) {
    const uint32_t b = (uint32_t)(n - i < kPiece ? n - i : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + i), "r"(b) : "memory");
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace

qqStatus_t prefetch(qqHandle_t, int device, const char* p, int64_t n, void* stream) {
  const uintptr_t lo = ((uintptr_t)p + 15) & ~(uintptr_t)15, hi = ((uintptr_t)p + (uintptr_t)n) & ~(uintptr_t)15;
  if (hi <= lo) return QQ_STATUS_SUCCESS;
  return on_device(device, [&]() -> qqStatus_t {
    static std::atomic<uint64_t> ok{0}, no{0};
    bool pdl = false;  // (false: compute capability below 9.0, or no sm_90+ code: a hint, so nothing)
    QQ_TRY(pdl_ok("prefetch", prefetch_kernel, device, &ok, &no, &pdl));
    if (!pdl) return QQ_STATUS_SUCCESS;
    const int64_t m = (int64_t)(hi - lo), pieces = (m + kPiece - 1) / kPiece;
    const int sms = sm_count(device);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(pieces < sms ? pieces : sms), 1, 1);  // (spread over the SMs' TMA units)
    cfg.blockDim = dim3(32, 1, 1);
    cfg.stream = (cudaStream_t)stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    QQ_CUDA_TRY(cudaLaunchKernelEx(&cfg, prefetch_kernel, (const char*)lo, m), "prefetch");
    return check_launch("prefetch");
  });
}

}  // namespace cuda
}  // namespace qq
