// cuda/grouped_gemm.h - the interface of grouped_gemm_sm90.cu (CUTLASS's sm90
// grouped GEMM), in plain types so that file needs no other libqq header and
// the rest of libqq no CUTLASS header. Built only when the CUTLASS headers were
// found and sm_90a is among the architectures (QQ_HAVE_GROUPED_SM90); the
// dispatcher (qqmm.cu, grouped_qqmm) asks grouped_gemm_sm90_built() and falls
// back to one GEMM per expert otherwise.
#ifndef QQ_CUDA_GROUPED_GEMM_H_
#define QQ_CUDA_GROUPED_GEMM_H_

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace qq {
namespace cuda {

// D[rows of e, :N] = alpha[e] * A[rows of e, :K] @ B[e - e0]^T for the E
// experts e0 .. e0+E-1 of E_all, rows of e = [ends[e-1], ends[e]); bf16 A
// [T, K] (row pitch lda), B [E] x [N, K] (row pitch ldb, expert pitch
// b_stride), D [T, N] (row pitch ldd), all in elements, 16-byte aligned rows;
// fp32 accumulation; alpha (device, [E_all]) or nullptr for 1. ends: int32
// [E_all] on the device, never read on the host; bad ends (decreasing,
// outside [0, T], last != T) give a D of NaN.
struct GroupedGemmSm90 {
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0, b_stride = 0;
  void* D = nullptr;
  int64_t ldd = 0;
  const int32_t* ends = nullptr;
  const float* alpha = nullptr;
  int E_all = 0, e0 = 0, E = 0;
  int64_t T = 0, N = 0, K = 0;
  int device = 0, sm_count = 0;
};

bool grouped_gemm_sm90_built();
// Bytes of scratch (256-byte aligned) grouped_gemm_sm90 needs for g.
size_t grouped_gemm_sm90_scratch(const GroupedGemmSm90& g);
// Enqueues the shape kernel and the GEMM on `st`; nullptr on success, else
// what failed (a static string).
const char* grouped_gemm_sm90(const GroupedGemmSm90& g, void* scratch, cudaStream_t st);

}  // namespace cuda
}  // namespace qq

#endif  // QQ_CUDA_GROUPED_GEMM_H_
