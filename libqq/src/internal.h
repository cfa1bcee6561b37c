// internal.h - what the API layer hands the backends.
//
// The API layer (the entry points of api_*.cpp, through the checks of
// validate.cpp) is the only place that reads DLTensors and checks
// arguments. Below it, the CPU backend (cpu/) and the CUDA backend (cuda/)
// take these plain views (pointer, dtype, batch shape/strides, rows, cols,
// row stride) and trust them.
#ifndef QQ_INTERNAL_H_
#define QQ_INTERNAL_H_

#include <stdint.h>

#include "codec.h"  // QQ_HD
#include "qq/qq.h"

namespace qq {

constexpr int kMaxDims = 8;

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, U8 = 3, I32 = 4 };

inline int dtype_size(DType d) {
  switch (d) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    default: return 1;
  }
}

// A batched matrix [batch..., rows, cols] with unit stride along cols.
// Strides are in elements. Batch index b (0..batch()-1, row-major over bshape)
// starts at ptr + offset(b) elements.
struct Mat {
  void* ptr = nullptr;
  DType dt = DType::F32;
  int nb = 0;                       // number of batch dims
  int64_t bshape[kMaxDims] = {0};
  int64_t bstride[kMaxDims] = {0};  // 0 for broadcast dims
  int64_t rows = 0, cols = 0, ld = 0;
  int device = -1;                  // -1 = CPU, else CUDA device id

  QQ_HD int64_t batch() const {
    int64_t n = 1;
    for (int i = 0; i < nb; ++i) n *= bshape[i];
    return n;
  }
  QQ_HD int64_t offset(int64_t b) const {
    if (nb <= 1) return nb ? b * bstride[0] : 0;  // the common cases, no division
    int64_t off = 0;
    for (int i = nb - 1; i >= 0; --i) {
      off += (b % bshape[i]) * bstride[i];
      b /= bshape[i];
    }
    return off;
  }
  template <typename T> QQ_HD T* at(int64_t b, int64_t r = 0) const {
    return reinterpret_cast<T*>(ptr) + offset(b) + r * ld;
  }
};

// Resolved quantization parameters.
struct QSpec {
  qqMode_t mode;
  int group;
  int bits;
  int floor_rounding;   // 1 = FLOOR (mx modes)
  int blocked;          // scales in the blocked layout
  int elem;             // ElemKind for fp modes
  QQ_HD bool fp() const { return mode != QQ_MODE_AFFINE; }
  QQ_HD int64_t packed_cols(int64_t k) const { return k * bits / 8; }
};

// Returns from the enclosing function when `expr` is not QQ_STATUS_SUCCESS.
#define QQ_TRY(expr)                          \
  do {                                        \
    qqStatus_t st_ = (expr);                  \
    if (st_ != QQ_STATUS_SUCCESS) return st_; \
  } while (0)

// Thread-local error message (validate.cpp). Returns `st` so that callers can
// write `return set_error(QQ_STATUS_INVALID_VALUE, "...", ...)`.
qqStatus_t set_error(qqStatus_t st, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
// Empties the thread's last-error message: a call that succeeds after a route
// refused it (and said why) leaves no stale message.
void clear_error() noexcept;

// The route of the current thread's last product (route.cpp; read by
// qqGetLastRoute). Each qqQqmm / qqQuantizedMatmul resets it to AUTO on entry;
// the backend sets it once the product is enqueued.
void set_route(qqRoute_t r);

// Test hooks (route.cpp): switches only the test suite sets, through the
// exported but undeclared-in-qq.h qqInternalSetTestHook (Python:
// qq._qq._set_test_hook). Read on every call, so a test can flip them.
enum TestHook {
  // AUTO qqmm tries the block-scaled path on any GPU (on Hopper cuBLASLt
  // refuses, which exercises the fallback) and route='blockscaled' is no
  // longer an ARCH_MISMATCH there.
  HOOK_FORCE_BLOCKSCALED = 0,
  // The block-scaled cublasLtMatmul is treated as failed (not called): the
  // plan must be marked bad and AUTO must fall back (Blackwell tests).
  HOOK_FAIL_BLOCKSCALED_MATMUL = 1,
  // Number of block-scaled heuristic queries made so far (read-only counter,
  // so a test can see that a refusal is remembered).
  HOOK_BLOCKSCALED_QUERIES = 2,
  // qqmm's small-M routes quantize x in a kernel of its own first (two launches and
  // scratch), as before x was quantized inside the weight-only kernel (ops.cuh, QX): the
  // tests compare the two forms, the benchmarks time them.
  HOOK_UNFUSED_QX = 3,
  // Number of grouped block-scaled plans made (grouped_qqmm on Blackwell, each asking
  // cuBLASLt once, refused or not; a counter like HOOK_BLOCKSCALED_QUERIES).
  HOOK_GROUPED_QUERIES = 4,
  // grouped_qqmm's block-scaled route runs on any GPU with a plain kernel in place of
  // cuBLASLt's grouped GEMM, reading the same per-expert arrays (qqmm.cu): everything of
  // that route but cuBLASLt itself is then tested where no Blackwell GPU is.
  HOOK_EMULATE_GROUPED = 5,
  HOOK_COUNT
};
int test_hook(TestHook h);
void test_hook_add(TestHook h, int delta);

// The route a call on `device` (-1 = CPU) asked for, checked: INVALID_VALUE
// for a value outside qqRoute_t, NOT_SUPPORTED for a route of the other
// device kind (a GPU route with CPU tensors, 'cpu' with CUDA tensors).
qqStatus_t check_route(const char* op, int route, int device);

// `st`, recording route `r` for qqGetLastRoute when st is SUCCESS.
inline qqStatus_t routed(qqStatus_t st, qqRoute_t r) {
  if (st == QQ_STATUS_SUCCESS) set_route(r);
  return st;
}

// ---- backend entry points -------------------------------------------------
// Same signatures on both backends; `stream` is ignored by the CPU.
// gs: pointer to the fp32 global scale (host memory for the CPU, device memory
// for CUDA) or nullptr.
struct QuantizeArgs {
  Mat x;         // float [B..., M, K]
  Mat data;      // uint8 [B..., M, K*bits/8], compact
  Mat scales;    // linear [B..., M, K/g] or blocked [B..., R128, C4], compact
  Mat biases;    // affine: like linear scales; else ptr == nullptr
  const float* gs;
  // gs[b * gs_stride] is batch entry b's global scale (0: one for all). Only grouped_qqmm's
  // Blackwell route sets it (per-expert nvfp4 scales of float experts; the GPU backend): the
  // CPU backend refuses it.
  int64_t gs_stride = 0;
  QSpec q;
};
struct DequantizeArgs {
  Mat data;      // uint8 [B..., M, Kp]
  Mat scales;    // as in QuantizeArgs (rows/cols are the scales' own)
  Mat biases;
  Mat out;       // float [B..., M, K], compact
  const float* gs;
  QSpec q;
};
struct MatmulArgs {
  // qqmm: x float or packed (x_packed), w float or packed (w_packed).
  // quantized_matmul: x float, w packed, transpose as given.
  Mat x, x_scales;
  Mat w, w_scales, w_biases;
  Mat bias;       // [N] or ptr == nullptr
  Mat out;        // [B..., M, N] compact
  bool x_packed = false, w_packed = false;
  bool w_prepared = false;  // qqmm: w holds q(w)'s values (float), used as is
  bool x_prepared = false;  // qqmm: x holds q(x)'s values (float), used as is (exact route)
  // qqmm: a prepared x / w given as a transposed 2-D view. The Mat then
  // describes the stored matrix (x: [K, M], w: [K, N], row-major with ld).
  bool x_trans = false, w_trans = false;
  Mat w_values;             // qqmm: q(w)'s values next to a packed w (ptr == nullptr: none);
                            // the backend picks the form per call
  bool transpose = true;
  int x_blocked = 0, w_blocked = 0;
  const float* gs_x = nullptr;
  const float* gs_w = nullptr;
  int64_t M = 0, N = 0, K = 0;
  QSpec q;
  Mat c;             // qqmm: out += beta * c (same shape as out), ptr == nullptr: none
  float beta = 0.0f;
  qqRoute_t route = QQ_ROUTE_AUTO;  // qqmm: the route asked for (checked by check_route)
  // gather_qmm: int32 expert indices, one per batch entry of out (batch dims aligned
  // to out's like x's; rows = cols = 1); w, w_scales, w_biases then keep their own
  // batch of one dim [E]. ptr == nullptr: none (w's batch aligned to out's).
  Mat gidx;
};

// The weight entry that batch entry b of `a` multiplies: b itself, or for
// gather_qmm the expert its index names; -1 for an index outside [0, E) (the
// CPU backend refuses those before it runs; the GPU kernels, which cannot
// stop the stream, write NaN rows for them: docs/api.md, gather_qmm).
QQ_HD int64_t weight_entry(const MatmulArgs& a, int64_t b) {
  if (!a.gidx.ptr) return b;
  const int64_t e = *((const int32_t*)a.gidx.ptr + a.gidx.offset(b));
  return e >= 0 && e < a.w.bshape[0] ? e : -1;
}

// Quantization along the rows (the second-to-last axis) of x [B..., M, K]:
// the result is the row-wise quantization of x^T [B..., K, M], written
// without materializing x^T. Also serves the MoE weights [E, D1, D2]
// (M = D1, K = D2) with their 32x1 / 32x32 scalings.
enum ColScaleKind {
  COL_SCALE_T_LINEAR = 0,   // [B..., K, M/g]          (scales of x^T, linear)
  COL_SCALE_BLOCKED = 1,    // [B..., R128(K), C4(M/g)] (scales of x^T, blocked)
  COL_SCALE_D1_LINEAR = 2,  // [B, M/g, K] (32x1) or [B, M/g, K/32] (32x32)
};
struct ColwiseArgs {
  Mat x;                // row-major: logical [B, M, K]; x_colmajor: physical [B, K, M] (stride 1 along M)
  bool x_colmajor = false;
  int64_t M = 0, K = 0;
  Mat data_t;           // [B..., K, M*bits/8], compact
  Mat scales_t, biases_t;
  int scale_kind = COL_SCALE_T_LINEAR;
  bool tile32 = false;  // one amax per 32x32 tile (mxfp8 MoE 32x32)
  bool rowwise = false; // also quantize along K from the same read
  QuantizeArgs row;     // the row-wise outputs when rowwise
  const float* gs = nullptr;
  QSpec q;
};

// The compute capabilities (major * 10 + minor) with block-scaled tensor cores
// through cuBLASLt: 10.x (B200/B300), 11.0 (Thor), 12.x (RTX 50, DGX Spark).
// qqmm's block-scaled route and qqGetDeviceFeature both ask this.
inline bool blockscaled_cc(int cc) { return cc / 10 == 10 || cc / 10 == 11 || cc / 10 == 12; }

// grouped_qqmm_wgrad: out[e] = alpha * q(x_e)^T q(dy_e) for the rows x_e, dy_e
// of expert e, both quantized along the tokens in blocks that start at the
// expert's first token (the last one zero-padded), alpha = the nvfp4 global
// scales' factors (gs_x, gs_dy; nullptr: 1); an empty expert's out[e] = 0.
struct WgradArgs {
  Mat x, dy;                      // float [T, K], [T, N]
  Mat out;                        // compact [E, K, N] (nb = 1)
  const int32_t* ends = nullptr;  // int32 [E] group ends, on x's device
  int64_t E = 0, T = 0, K = 0, N = 0;
  QSpec q;
  const float* gs_x = nullptr;
  const float* gs_dy = nullptr;
};

// qqQuantizeDequantize: q(x)'s bf16 values along K (out) and / or along M
// (out_t, in x's orientation), without the global scale.
// tile32 (qqQuantizeDequantizeMoe): mxfp8 with one scale per 32x32 tile of each
// batch entry of x [E, D1, D2]; out [E, D1, D2] and / or out_t [E, D2, D1]
// (transposed), both compact.
struct QdqArgs {
  Mat x;          // float [M, K]; tile32: [E, D1, D2] (nb = 1)
  Mat out, out_t; // bf16 compact, or ptr == nullptr
  const float* gs = nullptr;
  QSpec q;
  bool tile32 = false;
};

// qqToDecodeLayout: packed nvfp4 / mxfp4 / mxfp8 / affine 4- or 8-bit w [N, K] -> the
// decode layout (decode_layout.h), out compact decode_layout_bytes(N, K, fmt) bytes.
struct DecodeLayoutArgs {
  QSpec q;
  Mat w;       // packed [E, N, K * bits / 8] (nb = 1; E = 1 for a 2-D weight)
  Mat scales;  // linear [E, N, K / group] or blocked (q.blocked) [E, R128, C4], batch-strided like w
  Mat biases;  // affine: like linear scales; else ptr == nullptr
  int64_t E = 1, N = 0, K = 0;
  uint8_t* out = nullptr;  // E layouts of decode_layout_bytes(N, K, fmt) bytes, one after another
  // qqToDecodeLayoutGated: F = N / 2 (a multiple of 32) for a gate/up weight stored with its
  // rows interleaved (decode_layout.h, decode_gated_row); 0: rows in w's order
  int64_t gated = 0;
};
// qqDecodeMatmul: out [M, N] = x [M, K] @ W^T (* nvfp4's global factor) (+ bias).
// qqDecodeGatherQmm: the same per batch entry b of out [B..., M, N], with x's batch entry
// b (broadcast) and the expert gidx[b] of the E layouts in w.
struct DecodeMatmulArgs {
  QSpec q;                     // nvfp4, mxfp4, mxfp8 (E4M3), affine 4-bit (group 64, 128) or 8-bit
  Mat x;                       // [M, K], row stride x.ld; gather: batch-aligned with gidx
  const uint8_t* w = nullptr;  // the decode layout of W [N, K] (gather: E of them)
  int64_t M = 0, N = 0, K = 0;
  const float* gs = nullptr;
  Mat bias;                    // [N] or ptr == nullptr
  Mat out;                     // compact [B, M, N]
  Mat gidx;                    // gather: int32 expert per batch entry (batch-only Mat); else ptr == nullptr
  int64_t B = 1, E = 1;        // batch entries of out, layouts in w
  // qqDecodeGatedMatmul: F = N / 2 for a gated layout (0: not gated); bias is [N] in w's row
  // order. swiglu: out is [B, M, F] = swiglu of the [M, N] product, each product value
  // rounded to out's dtype first (what qqDecodeGatedMatmul then qqSwiglu would give).
  int64_t gated = 0;
  bool swiglu = false;
};

namespace cpu {
qqStatus_t to_decode_layout(const DecodeLayoutArgs& a);
qqStatus_t decode_matmul(const DecodeMatmulArgs& a);
qqStatus_t quantize_colwise(const ColwiseArgs& a);
qqStatus_t quantize_dequantize(const QdqArgs& a);
qqStatus_t quantize(const QuantizeArgs& a);
qqStatus_t dequantize(const DequantizeArgs& a);
qqStatus_t swizzle(const Mat& linear, const Mat& blocked, bool to_blocked);
qqStatus_t amax(const Mat& x, float* out);
// out [..., F] = silu(x[..., :F]) * x[..., F:] (qqSwiglu); x and out of one dtype.
qqStatus_t swiglu(const Mat& x, const Mat& out);
qqStatus_t qqmm(const MatmulArgs& a);
qqStatus_t quantized_matmul(const MatmulArgs& a);
qqStatus_t grouped_wgrad(const WgradArgs& a);  // ends on the host, already checked
// Runs fn(begin, end) over [0, n) on up to hardware_concurrency threads when
// n * cost_per_item is large enough to pay for them.
void parallel_for(int64_t n, int64_t cost_per_item, void (*fn)(void*, int64_t, int64_t), void* ctx);
}  // namespace cpu

namespace cuda {
// Implemented in cuda/ when libqq is built with CUDA; stubs otherwise.
int device_count();
qqStatus_t device_capability(int device, int* major, int* minor);
qqStatus_t quantize(qqHandle_t h, const QuantizeArgs& a, void* stream);
bool quantize_accepts(const QuantizeArgs& a);
qqStatus_t quantize_colwise(qqHandle_t h, const ColwiseArgs& a, void* stream);
qqStatus_t dequantize(qqHandle_t h, const DequantizeArgs& a, void* stream);
qqStatus_t swizzle(qqHandle_t h, const Mat& linear, const Mat& blocked, bool to_blocked, void* stream);
qqStatus_t amax(qqHandle_t h, const Mat& x, float* out, void* stream);
qqStatus_t swiglu(qqHandle_t h, const Mat& x, const Mat& out, void* stream);
qqStatus_t qqmm(qqHandle_t h, const MatmulArgs& a, void* stream);
qqStatus_t quantize_dequantize(qqHandle_t h, const QdqArgs& a, void* stream);
// grouped_qqmm in a fixed number of launches (Hopper, exact path): `a` is a
// qqmm of all T tokens (x [T, K], out [T, N]) against expert 0, with w (and
// its scales) given the batch [E] of the experts, gs_w[e * gw_stride] expert
// e's global scale; `ends` the int32 group ends on the device, never read on
// the host. *taken = false (and nothing done) where this path does not apply;
// the caller then loops.
qqStatus_t grouped_qqmm(qqHandle_t h, const MatmulArgs& a, int64_t gw_stride, const int32_t* ends, int64_t E,
                        void* stream, bool* taken);
// grouped_qqmm_wgrad on the GPU: Hopper (built with CUTLASS) in a fixed number
// of launches without reading the ends on the host (bad ends: out all NaN);
// elsewhere the ends are read on the host (checked: INVALID_VALUE) and each
// expert runs as one GEMM.
qqStatus_t grouped_qqmm_wgrad(qqHandle_t h, const WgradArgs& a, void* stream);
qqStatus_t quantized_matmul(qqHandle_t h, const MatmulArgs& a, void* stream);
// The decode layout (cuda/qmmp.cu): the conversion waits for `stream` once (to
// report a scale that cannot be encoded); the matmul needs compute capability
// 9.0+, bf16 x of at most kDecMaxM (64) rows with 16-byte aligned rows (NOT_SUPPORTED,
// with a message, otherwise).
qqStatus_t to_decode_layout(qqHandle_t h, const DecodeLayoutArgs& a, void* stream);
qqStatus_t decode_matmul(qqHandle_t h, const DecodeMatmulArgs& a, void* stream);
qqStatus_t create_handle(qqHandle_t* h, int device);
qqStatus_t destroy_handle(qqHandle_t h);
qqStatus_t device_alloc(int device, size_t bytes, void** ptr, void* stream);
qqStatus_t device_free(int device, void* ptr, void* stream);
qqStatus_t stream_synchronize(int device, void* stream);
// Copies `bytes` from device memory to the host after the work queued on
// `stream` (waits for the stream).
qqStatus_t copy_to_host(int device, const void* src, size_t bytes, void* dst, void* stream);
// Fills every field of `info` after struct_size (qqGetCudaInfo, api_core.cpp):
// the strings are static.
void cuda_info(qqCudaInfo_t* info);
}  // namespace cuda

}  // namespace qq

// route.cpp: exported for the test suite only (see there); not part of qq.h.
extern "C" QQ_API qqStatus_t qqInternalSetTestHook(const char* name, int value, int* old);

#endif  // QQ_INTERNAL_H_
