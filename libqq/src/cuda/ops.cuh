// cuda/ops.cuh - entry points one CUDA file offers another.
//
// The backend entry points of internal.h live with their kernels
// (quantize.cu, dequantize.cu, colwise.cu, layout.cu, amax.cu, qmm.cu,
// qqmm.cu; devices, handles and memory in runtime.cu). The matmul
// dispatchers qmm.cu and qqmm.cu call into the kernel families declared
// here (qmv.cu, qmma.cu, gemm.cu). All take the caller's stream and never
// synchronize with the host.
#ifndef QQ_CUDA_OPS_CUH_
#define QQ_CUDA_OPS_CUH_

#include <cuda_runtime.h>

#include "../internal.h"
#include "common.cuh"  // Scratch

namespace qq {
namespace cuda {

// qqmm's small-M routes with x quantized inside the weight-only kernel's own launch
// (qmma.cu, qmv.cu): each CTA writes q(x)'s values for all rows of x into its shared
// memory (qdq.cuh, qx_rows_to_smem) before its main loop, instead of a qdq kernel writing
// them to scratch first - one launch and no scratch a call, the host cost that kept
// qqmm at M = 1 above torch's bf16 GEMM (bench/results/overhead-h200.md). x's nvfp4
// global scale multiplies the sums (qmma: alpha; qmv: its factor at the store). Taken
// where q(x) fits the shared memory below (x's rows are re-quantized by every CTA: ~16
// elements a thread at K = 4096, M = 1) and the kernel covers the call; qqmm falls back
// to the two launches otherwise.
struct QX {
  bool on = false;
  Mat x;                     // x itself: [B..., rows, K] of any float dtype
  QSpec q;                   // x's quantization (nvfp4: group 16; mx modes: 32)
  const float* gs = nullptr; // x's nvfp4 global scale (its encode factor), or none
  int rows = 0;              // rows of x, batch folded in (the matmul's M)
  int64_t pitch = 0;         // bf16 elements between rows in shared memory: K + 8 (a bank shift a row)
  bool vec = false;          // x's rows 16-byte aligned (16-byte loads)
};
constexpr size_t kQxMaxSmem = 40 * 1024;
inline size_t qx_smem_bytes(int64_t rows, int64_t K) { return (size_t)rows * (size_t)(K + 8) * 2; }
inline bool qx_fits(int64_t rows, int64_t K) { return qx_smem_bytes(rows, K) <= kQxMaxSmem; }
// The re-quantization is the fused form's cost on the GPU: every CTA quantizes and decodes
// all of x again (ctas * rows * K elements, ~19 instructions an element for the fp4
// formats' software E2M1), mostly before its main loop. Measured on the H200 in CUDA graphs
// against the two launches (bench/results/qqmm-small-m-h200.md): 256 CTAs x 4096 (4096 x
// 4096 at M = 1, nvfp4 and mxfp8) no slower; 384 x 4096 (6144 x 4096) 0.9 us slower of 17;
// 256 x 14336 (4096 x 14336) 5 us of 22; 256 x 16384 (4096 x 4096 at M = 4) 5 us of 11.
// Past this bound the launch it saves the host is lost on the device.
constexpr int64_t kQxMaxWork = (int64_t)1 << 20;
inline bool qx_work_ok(int64_t ctas, int64_t rows, int64_t K) { return ctas * rows * K <= kQxMaxWork; }

// qmv.cu - weight-only matmul for small M: out = x @ dequant(w)^T (+ bias),
// reading each packed weight byte once. Covers every mode, x/out dtype,
// transpose both ways, batch broadcasting and bias for M <= kQmvMaxM.
// Returns QQ_STATUS_NOT_SUPPORTED (without an error message) for a case it
// does not cover, so the caller can pick another path.
constexpr int kQmvMaxM = 4;  // measured: the M=16 tile runs slower than dequantize + GEMM (bench/results/qmm-h100.md)
// qx (qqmm, QX above): x quantized inside the launch; NOT_SUPPORTED where that form does
// not cover the call (only the 16-byte-chunk transpose=True kernels of the fp formats have it).
qqStatus_t qmv(const MatmulArgs& a, cudaStream_t stream, const QX* qx = nullptr);

// qmma.cu - weight-only matmul on the tensor cores for M <= kQmmaMaxM: bf16
// x, nvfp4 / mxfp4 / mxfp8 weights, transpose=True, 16-byte aligned rows.
// The result is multiplied by *alpha when alpha is set (qqmm's
// gx * gw / 2688^2), else by w's nvfp4 global factor. NOT_SUPPORTED (no
// message) for anything else.
constexpr int kQmmaMaxM = 64;
// qqmm with both forms of w (packed + q(w)'s bf16 values, qq.prepare_weight): the packed
// weight-only kernels win over the bf16 GEMM on the values for M <= 4 (qmv, any shape)
// and M <= 16 with whole 16-byte chunks per row (qmma); above, the GEMM on the values
// (bench/results/qmm-h100.md, qqmm-h100.md).
constexpr int kPackedOverValuesMaxM = 16;
// gather_qmm (a.gidx): with the handle's context `c` (scratch for the plan), entries that
// likely share experts are grouped by expert first, each expert's weights then read once
// (qmma.cu, gather_grouped); c == nullptr keeps one work item per batch entry.
// qx as for qmv (fp formats, M <= 8, no gather).
qqStatus_t qmma(const MatmulArgs& a, const float* alpha, cudaStream_t stream, qqContext* c = nullptr,
                const QX* qx = nullptr);

// gather_qmm's entries grouped by expert (qmma.cu; used by qmma's and qmmp's gather
// kernels): tables built on the device by one small kernel from the int32 indices, so that
// a work item is a tile of up to MT rows of one expert (entry-major: row r of an expert is
// row r % M of entry perm[seg_start[e] + r / M]) and each expert's weights are read once
// however many entries name it. The order of an expert's entries in perm is free (atomics):
// a row's sums never depend on the rows beside it in a tile.
struct GPlan {
  const int32_t* perm = nullptr;       // [B] batch entries, grouped by expert (expert E: index out of range)
  const int32_t* seg_start = nullptr;  // [E + 2] where each expert's entries start in perm; [E + 1] = B
  const int32_t* tile_seg = nullptr;   // [max_items] the expert of each work item
  const int32_t* tile_row0 = nullptr;  // [max_items] its first row among that expert's rows
  const int32_t* ntiles = nullptr;     // [1] work items in all (<= max_items)
  int E = 0;
};
constexpr int kPlanMaxE = 4000;  // the plan's tables live in shared memory
// The work items the plan can make at most: every row in full tiles, plus one partial tile
// per expert touched (and the out-of-range bin).
inline int64_t gather_plan_max_items(int64_t B, int64_t M, int64_t E, int MT) {
  return B * M / MT + (E + 1 < B ? E + 1 : B);
}
// Launches the plan for B entries of M rows, indices `gidx` (batch Mat, int32) into E <=
// kPlanMaxE experts, tiles of MT rows; its tables in `scratch` (valid on the stream until
// scratch goes out of scope). Entries * M must stay below 2^31.
qqStatus_t gather_plan(const Mat& gidx, int64_t B, int64_t M, int E, int MT, Scratch& scratch, cudaStream_t st,
                       const char* op, GPlan* G);
// Whether qmma takes call `a` (the same checks, no launch): qqmm asks before it
// quantizes x for it.
bool qmma_takes(const MatmulArgs& a, const QX* qx = nullptr);

// gemm.cu - one cuBLASLt GEMM, row-major:
//   D[M, N] = alpha * A[M, K] @ op(B) (+ bias[N]),  op(B) = B^T for B [N, K]
//   (b_trans) or B for B [K, N],
// with fp32 accumulation (CUBLAS_COMPUTE_32F, no TF32), A and B of type `ab`
// (bf16, fp16 or fp32), D of `d` (bf16, fp16 or fp32). alpha is `alpha` or,
// when alpha_dev is set, read on the device. bias is on the device, of type
// bias_dt (fp32 for gemm(); what the block-scaled table allows for
// gemm_blockscaled, see qqmm.cu). In gemm(), output types or bias
// combinations cuBLASLt refuses go through an fp32 scratch D and one
// conversion kernel, so the result is always rounded once.
struct Gemm {
  int64_t M = 0, N = 0, K = 0;
  DType ab = DType::BF16, d = DType::BF16;
  const void* A = nullptr;
  int64_t lda = 0;
  bool a_trans = false;  // A stored transposed: [K, M] row-major, lda >= M
  const void* B = nullptr;
  int64_t ldb = 0;
  bool b_trans = true;
  void* D = nullptr;
  int64_t ldd = 0;
  const void* bias = nullptr;
  DType bias_dt = DType::F32;
  float alpha = 1.0f;
  const float* alpha_dev = nullptr;
  // Block-scaled operands (Blackwell; gemm_blockscaled only): A and B packed in
  // cuBLASLt type `lt_ab` (CUDA_R_4F_E2M1 / CUDA_R_8F_E4M3 / _E5M2), lda/ldb in
  // elements, with blocked scales a_scale / b_scale of kind `scale_mode`
  // (cublasLtMatmulMatrixScale_t); b_trans must be true (TN).
  int lt_ab = -1, scale_mode = -1;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
};
qqStatus_t gemm(qqContext* c, const Gemm& g, cudaStream_t stream);
// The block-scaled GEMM through the same plan cache (descriptors and algorithm
// per shape, types, scale kind, bias type and alignment; a refusal is cached
// too). gemm_blockscaled_plan only consults the cache (asking cuBLASLt's
// heuristic the first time a key is seen, with g's scale and bias pointers
// already set): *ok = false means refused (the message says why), so the
// caller can skip the operands' quantization. gemm_blockscaled runs it; NOT_SUPPORTED (with a
// message saying why) when refused or when cublasLtMatmul itself fails - the
// plan is then marked bad, so later calls of that key are refused up front.
qqStatus_t gemm_blockscaled_plan(qqContext* c, const Gemm& g, bool* ok);
qqStatus_t gemm_blockscaled(qqContext* c, const Gemm& g, cudaStream_t stream);
// cuBLASLt's grouped mode over block-scaled operands (Blackwell, cuBLASLt >= 13.3 for mxfp8,
// 13.4 for nvfp4; gemm.cu): for each group e < E, D_e[m_e, N] = alpha_e * A_e[m_e, K] @
// B_e[N, K]^T, where every per-group value lives in device arrays [E] that the caller's own
// kernel wrote (the host never sees m_e): the pointers of the packed A_e and B_e, of D_e,
// of their blocked scales, of alpha_e and beta_e (= 0), and the int64 shapes and leading
// dimensions (elements) in cuBLASLt's column-major terms (its A is our B, as in gemm()).
// The plan (descriptors, algorithm) is cached per (E, N, K, types, scale kind, D type,
// average rows); the array addresses are set per call under the handle's mutex.
// NOT_SUPPORTED with the reason when cuBLASLt refuses or its matmul fails (then remembered).
struct GroupedLtGemm {
  int64_t E = 0, N = 0, K = 0, avg_m = 0;
  DType d = DType::BF16;
  int lt_ab = -1, scale_mode = -1;
  // 0: grouped_qqmm (each group's rows on the device); 1: grouped_qqmm_wgrad (each group's
  // reduction on the device). Part of the plan's key: a failed matmul refuses only its kind.
  int kind = 0;
  void** a_ptr = nullptr;        // our A_e (x rows of e): cuBLASLt's B
  void** b_ptr = nullptr;        // our B_e (w[e]): cuBLASLt's A
  void** d_ptr = nullptr;
  void** a_scale = nullptr;      // blocked scales of A_e / B_e
  void** b_scale = nullptr;
  void** alpha = nullptr;        // float* per group (device pointer mode)
  void** beta = nullptr;
  int64_t* rows_k = nullptr;     // the reduction per group: K (wgrad: the expert's padded tokens)
  int64_t* cols_n = nullptr;     // N per group
  int64_t* cols_m = nullptr;     // our A's rows per group: m_e (wgrad: K, or 0 for an empty expert)
  int64_t* ld_a = nullptr;       // our A's row pitch (elements)
  int64_t* ld_b = nullptr;       // our B's row pitch (elements)
  int64_t* ld_d = nullptr;       // D's row pitch (elements)
};
// run = false: only the plan (asking cuBLASLt the first time the key is seen, the arrays'
// addresses already allocated, not yet written), so a refusal comes before any work.
qqStatus_t gemm_grouped_blockscaled(qqContext* c, const GroupedLtGemm& g, bool run, cudaStream_t stream);
void destroy_plans(qqContext* c);

// Element-wise helpers of gemm.cu (fp32 [n] <- any float [n]; any <- fp32).
qqStatus_t to_f32(const char* op, const Mat& v, int64_t n, float* out, cudaStream_t stream);
// Sets g's bias from bias [g->N] (ptr == nullptr: none), after g->d and g->N:
// the caller's own memory when it has D's type (bf16 or fp32: cuBLASLt has an
// algorithm for a bf16 D with a bf16 bias, none for an fp32 bias, which would
// cost an fp32 D and a rounding pass), else converted to fp32 in scratch. The
// epilogue adds it in fp32 either way: the same result.
qqStatus_t gemm_bias(const char* op, const Mat& bias, Gemm* g, Scratch& scratch, cudaStream_t stream);

}  // namespace cuda
}  // namespace qq

#endif  // QQ_CUDA_OPS_CUH_
