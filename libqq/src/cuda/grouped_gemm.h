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

#include "../group_ends.h"

namespace qq {
namespace cuda {

// Two ways of splitting one GEMM over the experts, e = e0 .. e0+E-1 of E_all,
// with `ends` the int32 group ends [E_all] on the device (never read on the
// host), rows of e = [ends[e-1], ends[e]):
//  - kSplitRows (grouped_qqmm): D[rows of e, :N] = alpha[e] * A[rows of e, :K]
//    @ B[e - e0]^T; A bf16 [T, K], B [E] x [N, K] (expert pitch b_stride), D
//    [T, N].
//  - kSplitReduction (grouped_qqmm_wgrad): D[e] = alpha * A[:, P_e : P_e+L_e]
//    @ B[:, P_e : P_e+L_e]^T, the tokens of e padded to L_e = roundup(n_e, 32)
//    columns from P_e = sum of the L of the experts before (32 * seg_blocks[e],
//    on the device, written by the caller's segment kernel); A bf16 [K, Tp], B
//    [N, Tp], D [E_all] x [K, N] (expert pitch d_stride); an empty expert's
//    D[e] is written with zeros.
// kSplitRows with b_trans: each B[e] is given as its transpose, [K, N] rows of
// pitch ldb (a transposed view of prepared experts, w.transpose(1, 2)), read
// as it is stored (CUTLASS's row-major B) instead of copied.
// bf16 operands, row-major, pitches in elements, 16-byte aligned rows; fp32
// accumulation; D bf16 or fp32 (d_f32). alpha: device pointer, alpha_stride 1
// (one per expert, indexed by e) or 0 (one), or nullptr for 1. Bad ends
// (decreasing, outside [0, T], last != T) give a D of NaN.
enum GroupedSplit { kSplitRows = 0, kSplitReduction = 1 };



struct GroupedGemmSm90 {
  int split = kSplitRows;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0, b_stride = 0;
  bool b_trans = false;  // kSplitRows only: B[e] stored [K, N] (see above)
  void* D = nullptr;
  int64_t ldd = 0, d_stride = 0;
  bool d_f32 = false;
  const int32_t* ends = nullptr;
  const int32_t* seg_blocks = nullptr;  // kSplitReduction: P_e / 32, [E_all + 1]
  const float* alpha = nullptr;
  int alpha_stride = 1;
  int E_all = 0, e0 = 0, E = 0;
  int64_t T = 0, N = 0, K = 0;  // kSplitReduction: D[e] is [K, N] and T the tokens
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
