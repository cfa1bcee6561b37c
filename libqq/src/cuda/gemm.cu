// cuda/gemm.cu - the one place libqq calls cuBLASLt for a plain (not
// block-scaled) GEMM: the dequantize-then-GEMM paths of qqmm (Hopper,
// Ampere) and of quantized_matmul (large M).
//
// cuBLASLt is column-major; our matrices are row-major. A row-major D[M, N]
// is a column-major D^T[N, M], so we ask cuBLASLt for
//   D^T[N, M] = op(B)^T[N, K] . A^T[K, M]
// with our B as its first operand ("A", transposed when B is [N, K]) and our
// A as its second ("B", transposed when A is stored [K, M]: a_trans). The bias epilogue adds a vector
// along cuBLASLt's rows, i.e. our columns: bias[N] - what we want.
//
// Plans: the descriptors and the heuristic's first algorithm are cached in
// the handle per key (shape, leading dimensions, types, bias type, alpha mode
// and the pointers' alignment), so a repeated shape costs no heuristic query.
// Every pointer attribute (bias, block scales) is set on the descriptor before
// the heuristic is asked: cuBLASLt reads their values for the alignment it
// may assume (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER) and rejects a
// block-scaled descriptor without scale pointers. They are set again per call
// under the handle's mutex, which is held until cublasLtMatmul has enqueued
// the work. A key whose cublasLtMatmul failed is marked bad like a refused one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "common.cuh"
#include "ops.cuh"

namespace qq {
namespace cuda {

// All fields int64 so that memcmp orders keys without padding bytes.
struct GemmKey {
  int64_t M, N, K, lda, ldb, ldd, ab, d, a_trans, b_trans, bias, alpha_dev, align_a, align_b, align_d;  // bias: 0 or 1 + DType
  int64_t align_bias;  // cuBLASLt reads the bias pointer's alignment when it picks the algorithm
  int64_t lt_ab, scale_mode;  // block-scaled GEMMs: cuBLASLt element type and scale kind; -1 otherwise
  int64_t grouped;            // cuBLASLt's grouped mode: the number of groups (M: their average rows); 0 otherwise
  int64_t grouped_kind;       // GroupedLtGemm::kind (a wgrad plan is not the forward's, even at equal sizes)
  bool operator<(const GemmKey& o) const { return memcmp(this, &o, sizeof(GemmKey)) < 0; }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo;
  size_t workspace = 0;
  bool ok = false;      // false: refused or failed for this key (remembered, not asked again)
  bool failed = false;  // cublasLtMatmul failed with the heuristic's algorithm (so ok = false)
  ~GemmPlan() {
    if (ld) lt_api().cublasLtMatrixLayoutDestroy(ld);
    if (lb) lt_api().cublasLtMatrixLayoutDestroy(lb);
    if (la) lt_api().cublasLtMatrixLayoutDestroy(la);
    if (desc) lt_api().cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

constexpr size_t kMaxWorkspace = 32u << 20;

cudaDataType_t cuda_type(DType t) {
  return t == DType::F32 ? CUDA_R_32F : (t == DType::F16 ? CUDA_R_16F : CUDA_R_16BF);
}

int64_t alignment(const void* p, int64_t ld, int es) {
  // the largest power of two (<= 256) dividing the start and the row pitch
  uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)(ld * es) | 256u;
  return (int64_t)(v & (~v + 1));
}

#define QQ_LT(call)                         \
  do {                                      \
    if ((call) != CUBLAS_STATUS_SUCCESS) {  \
      return plan;                          \
    }                                       \
  } while (0)

// Sets the per-call pointers (bias, block scales) on plan's descriptor.
cublasStatus_t set_pointers(GemmPlan* plan, const Gemm& g) {
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (g.bias) s = lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias));
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120800
  // cuBLASLt's A is our B (w), its B our A (x)
  if (s == CUBLAS_STATUS_SUCCESS && g.scale_mode >= 0)
    s = lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.b_scale, sizeof(g.b_scale));
  if (s == CUBLAS_STATUS_SUCCESS && g.scale_mode >= 0)
    s = lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.a_scale, sizeof(g.a_scale));
#endif
  return s;
}

// cuBLASLt's first algorithm for plan's descriptors under `pref` (destroyed here):
// plan->ok says whether there is one.
void pick_algo(cublasLtHandle_t lt, GemmPlan* plan, cublasLtMatmulPreference_t pref) {
  cublasLtMatmulHeuristicResult_t res;
  int n = 0;
  const cublasStatus_t hs =
      lt_api().cublasLtMatmulAlgoGetHeuristic(lt, plan->desc, plan->la, plan->lb, plan->ld, plan->ld, pref, 1, &res, &n);
  lt_api().cublasLtMatmulPreferenceDestroy(pref);
  if (hs == CUBLAS_STATUS_SUCCESS && n > 0) {
    plan->algo = res.algo;
    plan->workspace = res.workspaceSize;
    plan->ok = true;
  }
}

// Builds the plan for `k` (g: the call that first needs it, for its
// pointers); plan->ok says whether cuBLASLt has an algorithm.
GemmPlan* make_plan(cublasLtHandle_t lt, const GemmKey& k, const Gemm& g) {
  GemmPlan* plan = new GemmPlan;
  const cudaDataType_t ab = k.lt_ab >= 0 ? (cudaDataType_t)k.lt_ab : cuda_type((DType)k.ab),
                       d = cuda_type((DType)k.d);
  QQ_LT(lt_api().cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = k.b_trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k.a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  QQ_LT(lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  QQ_LT(lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120800
  if (k.scale_mode >= 0) {  // block-scaled: cuBLASLt's A is our B (w), its B our A (x)
    const cublasLtMatmulMatrixScale_t sm = (cublasLtMatmulMatrixScale_t)k.scale_mode;
    QQ_LT(lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm, sizeof(sm)));
    QQ_LT(lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sm, sizeof(sm)));
  }
#else
  if (k.scale_mode >= 0) return plan;  // this cuBLASLt has no block-scaled GEMM: refused
#endif
  if (k.bias) {
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = cuda_type((DType)(k.bias - 1));
    QQ_LT(lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    QQ_LT(lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  if (k.alpha_dev) {
    const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    QQ_LT(lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
  }
  // cuBLASLt's A = our B; its B = our A; its D = our D^T.
  if (k.b_trans) QQ_LT(lt_api().cublasLtMatrixLayoutCreate(&plan->la, ab, k.K, k.N, k.ldb));
  else QQ_LT(lt_api().cublasLtMatrixLayoutCreate(&plan->la, ab, k.N, k.K, k.ldb));
  if (k.a_trans) QQ_LT(lt_api().cublasLtMatrixLayoutCreate(&plan->lb, ab, k.M, k.K, k.lda));
  else QQ_LT(lt_api().cublasLtMatrixLayoutCreate(&plan->lb, ab, k.K, k.M, k.lda));
  QQ_LT(lt_api().cublasLtMatrixLayoutCreate(&plan->ld, d, k.N, k.M, k.ldd));
  QQ_LT(set_pointers(plan, g));
  if (k.scale_mode >= 0) test_hook_add(HOOK_BLOCKSCALED_QUERIES, 1);

  cublasLtMatmulPreference_t pref = nullptr;
  QQ_LT(lt_api().cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kMaxWorkspace;
  const uint32_t al_a = (uint32_t)k.align_b, al_b = (uint32_t)k.align_a, al_d = (uint32_t)k.align_d;
  lt_api().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  lt_api().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
  lt_api().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
  lt_api().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d));
  lt_api().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
  pick_algo(lt, plan, pref);
  return plan;
}

__device__ __forceinline__ void cvt(float v, float* d) { *d = v; }
__device__ __forceinline__ void cvt(float v, __half* d) { *d = __float2half_rn(v); }
__device__ __forceinline__ void cvt(float v, __nv_bfloat16* d) { *d = __float2bfloat16_rn(v); }

template <typename TO>
__global__ void f32_to_kernel(const float* src, int64_t M, int64_t N, TO* dst, int64_t ldd) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  const int64_t m = i / N, n = i - m * N;
  cvt(src[i], dst + m * ldd + n);
}

template <typename TI>
__global__ void to_f32_kernel(const TI* src, int64_t n, float* dst) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = (float)src[i];
}

unsigned grid_for(int64_t n) { return (unsigned)((n + 255) / 256); }

// The plan of `key`, built by make() on first use. Call with c->mu held.
template <typename Make>
GemmPlan* find_plan(qqContext* c, const GemmKey& key, Make make) {
  if (!c->plans) c->plans = new std::map<GemmKey, GemmPlan*>;
  GemmPlan*& slot = (*c->plans)[key];
  if (!slot) slot = make();
  return slot;
}
GemmPlan* find_plan(qqContext* c, const GemmKey& key, const Gemm& g) {
  return find_plan(c, key, [&] { return make_plan(c->lt, key, g); });
}

// A plan whose cublasLtMatmul (or its per-call setup) failed: refused from now on.
void mark_failed(GemmPlan* plan) {
  plan->ok = false;
  plan->failed = true;
}

// Runs the planned GEMM; `key` has been filled for g. A failing
// cublasLtMatmul marks the plan bad (refused from then on) and returns
// CUBLAS_ERROR with its status in the message.
qqStatus_t run(qqContext* c, const GemmKey& key, const Gemm& g, void* D, cudaStream_t st, Scratch& scratch,
               bool* refused) {
  std::lock_guard<std::mutex> lock(c->mu);
  GemmPlan* plan = find_plan(c, key, g);
  *refused = !plan->ok;
  if (!plan->ok) return QQ_STATUS_SUCCESS;
  // the pointers change per call; the lock above keeps the descriptor ours until enqueued
  if (set_pointers(plan, g) != CUBLAS_STATUS_SUCCESS)
    return set_error(QQ_STATUS_CUBLAS_ERROR, "gemm: setting the bias / block scale pointers failed");
  void* ws = nullptr;
  if (plan->workspace) QQ_TRY(scratch.get("gemm", plan->workspace, &ws));
  static const float kZero[2] = {0.0f, 0.0f};
  const void* alpha = g.alpha_dev ? (const void*)g.alpha_dev : (const void*)&g.alpha;
  // device pointer mode: beta is the second float of alpha_dev's pair
  const void* beta = g.alpha_dev ? (const void*)(g.alpha_dev + 1) : (const void*)kZero;
  const bool simulate = g.scale_mode >= 0 && test_hook(HOOK_FAIL_BLOCKSCALED_MATMUL);
  const cublasStatus_t s =
      simulate ? CUBLAS_STATUS_EXECUTION_FAILED
               : lt_api().cublasLtMatmul(c->lt, plan->desc, alpha, g.B, plan->la, g.A, plan->lb, beta, D, plan->ld, D,
                                plan->ld, &plan->algo, ws, plan->workspace, st);
  if (s != CUBLAS_STATUS_SUCCESS) {
    mark_failed(plan);
    (void)cudaGetLastError();  // a launch error behind the status must not leak into the next check
    return set_error(QQ_STATUS_CUBLAS_ERROR, "gemm: cublasLtMatmul (M=%lld N=%lld K=%lld) failed with status %d%s",
                     (long long)g.M, (long long)g.N, (long long)g.K, (int)s,
                     simulate ? " (simulated by the fail_blockscaled_matmul test hook)" : "");
  }
  return QQ_STATUS_SUCCESS;
}

}  // namespace

static GemmKey key_of(const Gemm& g) {
  GemmKey k{};
  k.M = g.M;
  k.N = g.N;
  k.K = g.K;
  k.lda = g.lda;
  k.ldb = g.ldb;
  k.ldd = g.ldd;
  k.ab = (int64_t)g.ab;
  k.d = (int64_t)g.d;
  k.a_trans = g.a_trans;
  k.b_trans = g.b_trans;
  k.bias = g.bias ? 1 + (int64_t)g.bias_dt : 0;
  k.align_bias = g.bias ? alignment(g.bias, 0, 1) : 0;
  k.alpha_dev = g.alpha_dev != nullptr;
  k.lt_ab = g.lt_ab;
  k.scale_mode = g.scale_mode;
  k.align_d = alignment(g.D, g.ldd, dtype_size(g.d));
  return k;
}

static GemmKey blockscaled_key(const Gemm& g) {
  GemmKey k = key_of(g);
  // packed rows: alignment of the start and the pitch in bytes
  const int bits = g.lt_ab == (int)CUDA_R_4F_E2M1 ? 4 : 8;
  k.align_a = alignment(g.A, g.lda * bits / 8, 1);
  k.align_b = alignment(g.B, g.ldb * bits / 8, 1);
  return k;
}

// The GEMMs need cuBLASLt, which libqq loads at run time (cublaslt_loader.h):
// NOT_SUPPORTED, saying why, when it could not be loaded.
static qqStatus_t no_cublaslt(const char* op) {
  return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: %s", op, cublaslt_error());
}

qqStatus_t gemm_blockscaled_plan(qqContext* c, const Gemm& g, bool* ok) {
  if (!c->lt) {  // refused, with the reason, like a shape cuBLASLt has no algorithm for
    *ok = false;
    no_cublaslt("block-scaled GEMM");
    return QQ_STATUS_SUCCESS;
  }
  const GemmKey k = blockscaled_key(g);
  std::lock_guard<std::mutex> lock(c->mu);
  const GemmPlan* plan = find_plan(c, k, g);
  *ok = plan->ok;
  if (!plan->ok)
    set_error(QQ_STATUS_NOT_SUPPORTED, "%s for M=%lld N=%lld K=%lld",
              plan->failed ? "cublasLtMatmul failed earlier with the block-scaled algorithm cuBLASLt chose, so the "
                             "shape is refused from now on"
                           : "cuBLASLt has no block-scaled algorithm",
              (long long)g.M, (long long)g.N, (long long)g.K);
  return QQ_STATUS_SUCCESS;
}

qqStatus_t gemm_blockscaled(qqContext* c, const Gemm& g, cudaStream_t st) {
  if (!c->lt) return no_cublaslt("block-scaled GEMM");
  Scratch scratch(c, st);
  bool refused = true;
  const qqStatus_t s = run(c, blockscaled_key(g), g, g.D, st, scratch, &refused);
  if (s == QQ_STATUS_CUBLAS_ERROR) {  // the plan is marked bad now; say so and let the caller fall back
    const std::string msg = qqGetLastErrorMessage();
    return set_error(QQ_STATUS_NOT_SUPPORTED, "%s; this shape is refused from now on", msg.c_str());
  }
  QQ_TRY(s);
  if (refused)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "cuBLASLt has no block-scaled algorithm for M=%lld N=%lld K=%lld "
                     "on this GPU", (long long)g.M, (long long)g.N, (long long)g.K);
  return QQ_STATUS_SUCCESS;
}

// The plan key of a plain (not block-scaled) GEMM.
static GemmKey plain_key(const Gemm& g) {
  GemmKey k = key_of(g);
  k.lt_ab = k.scale_mode = -1;
  const int es = dtype_size(g.ab);
  k.align_a = alignment(g.A, g.lda, es);
  k.align_b = alignment(g.B, g.ldb, es);
  return k;
}

qqStatus_t gemm(qqContext* c, const Gemm& g, cudaStream_t st) {
  if (!c->lt) return no_cublaslt("GEMM");
  Scratch scratch(c, st);
  GemmKey k = plain_key(g);
  bool refused = true;
  if (g.d != DType::F16) QQ_TRY(run(c, k, g, g.D, st, scratch, &refused));  // D written directly
  if (!refused) return QQ_STATUS_SUCCESS;
  // cuBLASLt has no algorithm for D in this type (fp16 out of bf16 inputs,
  // bf16 out with an fp32 bias, ...): fp32 D in scratch, with an fp32 bias,
  // then one rounding.
  float* d32 = nullptr;
  QQ_TRY(scratch.get("gemm", (size_t)(g.M * g.N) * 4, &d32));
  Gemm g32 = g;
  g32.d = DType::F32;
  if (g.bias && g.bias_dt != DType::F32) {
    Mat b;
    b.ptr = const_cast<void*>(g.bias);
    b.dt = g.bias_dt;
    QQ_TRY(gemm_bias("gemm", b, &g32, scratch, st));  // fp32 D: the bias converted to fp32
  }
  k = plain_key(g32);
  k.d = (int64_t)DType::F32;
  k.ldd = g.N;
  k.align_d = 256;
  QQ_TRY(run(c, k, g32, d32, st, scratch, &refused));
  if (refused)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "gemm: cuBLASLt has no algorithm for M=%lld N=%lld K=%lld with "
                     "%s inputs", (long long)g.M, (long long)g.N, (long long)g.K,
                     g.ab == DType::F32 ? "float32" : (g.ab == DType::F16 ? "float16" : "bfloat16"));
  const int64_t n = g.M * g.N;
  switch (g.d) {
    case DType::F32: f32_to_kernel<float><<<grid_for(n), 256, 0, st>>>(d32, g.M, g.N, (float*)g.D, g.ldd); break;
    case DType::F16: f32_to_kernel<__half><<<grid_for(n), 256, 0, st>>>(d32, g.M, g.N, (__half*)g.D, g.ldd); break;
    default:
      f32_to_kernel<__nv_bfloat16><<<grid_for(n), 256, 0, st>>>(d32, g.M, g.N, (__nv_bfloat16*)g.D, g.ldd);
  }
  return check_launch("gemm");
}

qqStatus_t gemm_bias(const char* op, const Mat& bias, Gemm* g, Scratch& scratch, cudaStream_t st) {
  if (!bias.ptr) {
    g->bias = nullptr;
    return QQ_STATUS_SUCCESS;
  }
  if (bias.dt == g->d && g->d != DType::F16) {  // as it is (fp16 D takes the fp32 route in gemm)
    g->bias = bias.ptr;
    g->bias_dt = bias.dt;
    return QQ_STATUS_SUCCESS;
  }
  float* b32 = nullptr;
  QQ_TRY(scratch.get(op, (size_t)g->N * 4, &b32));
  QQ_TRY(to_f32(op, bias, g->N, b32, st));
  g->bias = b32;
  g->bias_dt = DType::F32;
  return QQ_STATUS_SUCCESS;
}

qqStatus_t to_f32(const char* op, const Mat& v, int64_t n, float* out, cudaStream_t st) {
  switch (v.dt) {
    case DType::F32: to_f32_kernel<float><<<grid_for(n), 256, 0, st>>>((const float*)v.ptr, n, out); break;
    case DType::F16: to_f32_kernel<__half><<<grid_for(n), 256, 0, st>>>((const __half*)v.ptr, n, out); break;
    default: to_f32_kernel<__nv_bfloat16><<<grid_for(n), 256, 0, st>>>((const __nv_bfloat16*)v.ptr, n, out);
  }
  return check_launch(op);
}

// ---------------------------------------------------------------------------
// Grouped block-scaled GEMM (cuBLASLt's CUBLASLT_BATCH_MODE_GROUPED)
// ---------------------------------------------------------------------------
// What cuBLAS documents ("cublasLtMatmul", "Experimental: To use cublasLtMatmul() with
// grouped matrices"): compute capability 9.0, 10.x or 11.0; every matrix in grouped mode
// and column-major; pointer mode host or device; on 10.x / 11.0 the A / B scale modes may
// be VEC32_UE8M0 (E4M3 / E5M2 operands) or VEC16_UE4M3 (E2M1), D bf16 / fp16 / fp32,
// default epilogue; the matrices and (with ALPHA_BATCH_STRIDE = 1) alpha and beta are
// device arrays of per-group pointers, their shapes and leading dimensions device arrays of
// per-group values; and "the arguments validation is very limited": what the arrays say
// must be right (the caller's kernel clamps bad group ends). The scale pointers are device
// arrays of per-group pointers too (TransformerEngine's grouped MXFP8 / NVFP4 GEMMs set them
// so). The average shapes, the heuristic's hints, are uint32_t (cublasLt.h). Layouts are
// made with cublasLtMatrixLayoutCreate and the grouped attributes, not the newer
// cublasLtGroupedMatrixLayoutCreate, so that libqq still loads with an older cuBLASLt
// (the version gate is the caller's).
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 130300
namespace {

cublasStatus_t set_grouped_layout(cublasLtMatrixLayout_t l, const int64_t* rows, const int64_t* cols,
                                  const int64_t* ld) {
  const CublasLtApi& api = lt_api();
  cublasStatus_t s = api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_GROUPED_MATRIX_LAYOUT_ROWS_ARRAY, &rows,
                                                          sizeof(rows));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_GROUPED_MATRIX_LAYOUT_COLS_ARRAY, &cols, sizeof(cols));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_GROUPED_MATRIX_LAYOUT_LD_ARRAY, &ld, sizeof(ld));
  return s;
}

// The per-call device arrays on plan's layouts and descriptor (call with c->mu held).
cublasStatus_t set_grouped_arrays(GemmPlan* plan, const GroupedLtGemm& g) {
  // cuBLASLt's A is our B (w[e]: K x N, transposed), its B our A (x rows of e: K x m_e), its D
  // our D^T (N x m_e)
  cublasStatus_t s = set_grouped_layout(plan->la, g.rows_k, g.cols_n, g.ld_b);
  if (s == CUBLAS_STATUS_SUCCESS) s = set_grouped_layout(plan->lb, g.rows_k, g.cols_m, g.ld_a);
  if (s == CUBLAS_STATUS_SUCCESS) s = set_grouped_layout(plan->ld, g.cols_n, g.cols_m, g.ld_d);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.b_scale,
                                                sizeof(g.b_scale));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = lt_api().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.a_scale,
                                                sizeof(g.a_scale));
  return s;
}

GemmPlan* make_grouped_plan(cublasLtHandle_t lt, const GemmKey& k, const GroupedLtGemm& g) {
  GemmPlan* plan = new GemmPlan;
  test_hook_add(HOOK_GROUPED_QUERIES, 1);  // plans made, refused or not (a test sees refusals remembered)
  const CublasLtApi& api = lt_api();
  const cudaDataType_t ab = (cudaDataType_t)k.lt_ab, d = cuda_type((DType)k.d);
  QQ_LT(api.cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // TN, as the block-scaled tables require
  QQ_LT(api.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  QQ_LT(api.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtMatmulMatrixScale_t sm = (cublasLtMatmulMatrixScale_t)k.scale_mode;
  QQ_LT(api.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm, sizeof(sm)));
  QQ_LT(api.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sm, sizeof(sm)));
  const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
  QQ_LT(api.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
  const int64_t one = 1;  // alpha and beta: device arrays of per-group pointers
  QQ_LT(api.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_ALPHA_BATCH_STRIDE, &one, sizeof(one)));
  QQ_LT(api.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BETA_BATCH_STRIDE, &one, sizeof(one)));
  // (the sizes given here are placeholders: the grouped arrays replace them)
  QQ_LT(api.cublasLtMatrixLayoutCreate(&plan->la, ab, k.K, k.N, k.K));
  QQ_LT(api.cublasLtMatrixLayoutCreate(&plan->lb, ab, k.K, k.M, k.K));
  QQ_LT(api.cublasLtMatrixLayoutCreate(&plan->ld, d, k.N, k.M, k.N));
  const uint32_t mode = CUBLASLT_BATCH_MODE_GROUPED;
  const int32_t count = (int32_t)k.grouped, width = CUBLASLT_INTEGER_WIDTH_64;
  for (cublasLtMatrixLayout_t l : {plan->la, plan->lb, plan->ld}) {
    QQ_LT(api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
    QQ_LT(api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    QQ_LT(api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_GROUPED_MATRIX_LAYOUT_ROWS_COLS_ARRAY_INTEGER_WIDTH,
                                               &width, sizeof(width)));
    QQ_LT(api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_GROUPED_MATRIX_LAYOUT_LD_ARRAY_INTEGER_WIDTH, &width,
                                               sizeof(width)));
  }
  QQ_LT(set_grouped_arrays(plan, g));

  cublasLtMatmulPreference_t pref = nullptr;
  QQ_LT(api.cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kMaxWorkspace;
  // the shapes are on the device: their averages are the heuristic's hint (D is N x m_e)
  const auto u32 = [](int64_t v) { return (uint32_t)std::min<int64_t>(v, 0xffffffffll); };
  const uint32_t avg_rows = u32(k.N), avg_cols = u32(k.M), avg_k = u32(k.K);
  api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_ROWS, &avg_rows,
                                           sizeof(avg_rows));
  api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_COLS, &avg_cols,
                                           sizeof(avg_cols));
  api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM, &avg_k,
                                           sizeof(avg_k));
  pick_algo(lt, plan, pref);
  return plan;
}
#undef QQ_LT

}  // namespace

qqStatus_t gemm_grouped_blockscaled(qqContext* c, const GroupedLtGemm& g, bool run_it, cudaStream_t st) {
  if (!c->lt) return no_cublaslt("grouped block-scaled GEMM");
  GemmKey k{};
  k.grouped = g.E;
  k.grouped_kind = g.kind;
  k.M = g.avg_m;
  k.N = g.N;
  k.K = g.K;
  k.d = (int64_t)g.d;
  k.lt_ab = g.lt_ab;
  k.scale_mode = g.scale_mode;
  k.alpha_dev = 1;
  Scratch scratch(c, st);
  std::lock_guard<std::mutex> lock(c->mu);
  GemmPlan* plan = find_plan(c, k, [&] { return make_grouped_plan(c->lt, k, g); });
  if (!plan->ok)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "%s for %lld groups of N=%lld K=%lld", plan->failed ?
                     "cublasLtMatmul failed earlier with the grouped block-scaled algorithm cuBLASLt chose, so "
                     "the shape is refused from now on" : "cuBLASLt has no grouped block-scaled algorithm",
                     (long long)g.E, (long long)g.N, (long long)g.K);
  if (!run_it) return QQ_STATUS_SUCCESS;
  if (set_grouped_arrays(plan, g) != CUBLAS_STATUS_SUCCESS) {  // refused like a failed matmul (nothing ran)
    mark_failed(plan);
    return set_error(QQ_STATUS_NOT_SUPPORTED, "setting the grouped arrays on cuBLASLt's descriptors failed; this "
                     "shape is refused from now on");
  }
  void* ws = nullptr;
  if (plan->workspace) QQ_TRY(scratch.get("gemm", plan->workspace, &ws));
  const bool simulate = test_hook(HOOK_FAIL_BLOCKSCALED_MATMUL);
  const cublasStatus_t s =
      simulate ? CUBLAS_STATUS_EXECUTION_FAILED
               : lt_api().cublasLtMatmul(c->lt, plan->desc, g.alpha, g.b_ptr, plan->la, g.a_ptr, plan->lb, g.beta,
                                         g.d_ptr, plan->ld, g.d_ptr, plan->ld, &plan->algo, ws, plan->workspace, st);
  if (s != CUBLAS_STATUS_SUCCESS) {
    mark_failed(plan);
    (void)cudaGetLastError();  // as in run()
    return set_error(QQ_STATUS_NOT_SUPPORTED, "the grouped block-scaled cublasLtMatmul (%lld groups, N=%lld "
                     "K=%lld) failed with status %d%s; this shape is refused from now on", (long long)g.E,
                     (long long)g.N, (long long)g.K, (int)s,
                     simulate ? " (simulated by the fail_blockscaled_matmul test hook)" : "");
  }
  return QQ_STATUS_SUCCESS;
}
#else
qqStatus_t gemm_grouped_blockscaled(qqContext*, const GroupedLtGemm&, bool, cudaStream_t) {
  return set_error(QQ_STATUS_NOT_SUPPORTED, "libqq was built against a cuBLASLt older than 13.3, which has no "
                   "grouped block-scaled GEMM");
}
#endif

void destroy_plans(qqContext* c) {
  if (!c->plans) return;
  for (auto& kv : *c->plans) delete kv.second;
  delete c->plans;
  c->plans = nullptr;
}

}  // namespace cuda
}  // namespace qq
