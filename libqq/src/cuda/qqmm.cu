// cuda/qqmm.cu - y = alpha * q(x) @ q(w)^T (+ bias), both operands quantized.
//
// Routes (qqRoute_t; docs/api.md, "How the matmuls run on the GPU"), tried in
// this order by AUTO, each falling through to the next when it refuses:
// - BLOCKSCALED (compute capability 10.x/11.0/12.x, cuBLASLt >= 12.8): the
//   block-scaled tensor cores through cuBLASLt - fp4/fp8 operands with their
//   blocked scales (VEC16_UE4M3 for nvfp4, VEC32_UE8M0 for mxfp8-e4m3), alpha
//   from the global scales on the device. What it refuses and why: the
//   comment above blockscaled_arch.
// - QMMA, QMV (weight-only kernels, small M) and EXACT, below.
// A requested route (params.route) runs alone or fails with the reason.
// - Everywhere else (Hopper, Ampere): the exact path. Quantized values are
//   exact in bf16 (E2M1 x E4M3 needs 6 significant bits, E4M3/E5M2 x 2^k at
//   most 4), so q(x) and q(w) are written as bf16 and a bf16 tensor-core GEMM
//   with fp32 accumulation computes the same function as the hardware path up
//   to accumulation order. The global scales stay out of the operands (their
//   product is alpha, applied in the GEMM's epilogue). A float x is quantized
//   and dequantized in one kernel (qdq_kernel: one read of x, one bf16 write).
//   For small and medium M with a packed w, a weight-only kernel runs instead
//   on q(x): qmma (tensor cores, q(x) in bf16, M <= kQmmaMaxM) or qmv (q(x)
//   in fp32, M <= kQmvMaxM); it reads the packed weight once instead of
//   writing and reading a bf16 copy of it.
// Exactness caveat, documented in docs/formats.md: an element whose value
// lies outside bf16's range (an mxfp8 element times a scale near 2^+-127) is
// not representable; real data never gets there.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cub/block/block_scan.cuh>
#include <stdio.h>
#include <string.h>

#include <string>
#include <type_traits>
#include <vector>

#include "../codec.h"
#include "../validate.h"
#include "common.cuh"
#include "grouped_gemm.h"
#include "ops.cuh"
#include "qdq.cuh"
#include "quant.cuh"  // fp8x2_code, e2m1x8_code
#include "vec.cuh"

namespace qq {
namespace cuda {
namespace {

// (kThreads, 256 threads a block of the 1D launches: quant.cuh's)

// q(x) for one group of G elements per thread: the quantize kernel's scale
// and element math (codec.h, bit for bit), then decode * scale - without the
// global scale, which the caller folds into alpha (or, for the fp32 output
// of the small-M route, multiplies in here: post = gs_post / 2688).
// x: [B, M, K] via Mat, read with 16-byte loads when kVecIn (rows aligned);
// out: compact [B*M, K], written with 16-byte stores.
// kElem: the element format at compile time, or -1 (q.elem at run time).
template <typename T, typename TO, int G, bool kVecIn, int kElem = -1>
__global__ void __launch_bounds__(kThreads)
    qdq_kernel(Mat x, QSpec q, const float* gs, int64_t gs_stride, const float* gs_post, TO* out, int64_t ng,
               int64_t total) {
  const int64_t t = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (t >= total) return;
  const int64_t row = t / ng, g = t - row * ng;
  const int64_t b = row / x.rows, r = row - b * x.rows;
  const T* src = x.at<T>(b, r) + g * G;
  float v[G];
  if (kVecIn) {
#pragma unroll
    for (int i = 0; i < G; i += 8) load8<T>(src + i, v + i);
  } else {
#pragma unroll
    for (int i = 0; i < G; ++i) v[i] = load1<T>(src + i);
  }
  // nvfp4 is the only group of 16
  qdq_group<G, kElem>(v, q, (G == 16 && gs) ? nvfp4_enc(gs[b * gs_stride]) : 1.0f, gs_post);
  TO* dst = out + row * (ng * G) + g * G;
  if constexpr (std::is_same<TO, __nv_bfloat16>::value && kElem == ELEM_E2M1) {
    // one conversion instruction a pair (round to nearest even, as store8's)
#pragma unroll
    for (int i = 0; i < G; i += 8) *reinterpret_cast<uint4*>(dst + i) = bf16x8_bits(v + i);
  } else {
#pragma unroll
    for (int i = 0; i < G; i += 8) store8<TO>(dst + i, v + i);
  }
}

// {alpha_0 .. alpha_{n-1}, 0}: alpha_i = (gx / 2688) * (gw[i] / 2688), a
// missing scale counting 1 (n = 1 for qqmm, one per expert for grouped_qqmm);
// the 0 is beta for cuBLASLt's device pointer mode.
__global__ void alpha_kernel(const float* gx, const float* gw, int gw_stride, int n, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = nvfp4_alpha(gx, gw ? gw + i * gw_stride : nullptr);
  if (i == n) out[n] = 0.0f;
}

// The device pair {alpha, 0} of one product from its two global scales (either
// may be missing), in scratch; nullptr when neither is given (alpha = 1).
qqStatus_t alpha_pair(const char* op, const float* g1, const float* g2, Scratch& scratch, cudaStream_t st,
                      float** alpha) {
  *alpha = nullptr;
  if (!g1 && !g2) return QQ_STATUS_SUCCESS;
  QQ_TRY(scratch.get(op, 2 * sizeof(float), alpha));
  alpha_kernel<<<1, 32, 0, st>>>(g1, g2, 0, 1, *alpha);
  return check_launch(op);
}

// Rows (start, pitch, batch strides) on 16-byte boundaries.
bool rows_aligned(const Mat& m) {
  const int64_t es = dtype_size(m.dt);
  bool ok = ((uintptr_t)m.ptr % 16) == 0 && (m.rows <= 1 || (m.ld * es) % 16 == 0);
  for (int i = 0; i < m.nb; ++i) ok = ok && (m.bstride[i] * es) % 16 == 0;
  return ok;
}

template <typename T, typename TO>
qqStatus_t launch_qdq_t(const Mat& x, const QSpec& q, const float* gs, int64_t gs_stride, const float* gs_post,
                        TO* out, cudaStream_t st) {
  const int64_t ng = x.cols / q.group, total = x.batch() * x.rows * ng;
  const unsigned grid = (unsigned)((total + kThreads - 1) / kThreads);
  const bool vec = rows_aligned(x);
  // bf16 out of the fp4 formats from aligned rows (the GEMM's operand: the large
  // calls) with the format at compile time: nvfp4 259 -> 222 us, mxfp4 236 -> 194
  // for two 16384 x 4096 bf16 operands (H100, one run); the fp8 formats measured
  // 184 -> 204 that way, so they keep the format read at run time.
  if constexpr (std::is_same<TO, __nv_bfloat16>::value) {
    if (vec && q.elem == ELEM_E2M1) {
      if (q.group == 16)
        qdq_kernel<T, TO, 16, true, ELEM_E2M1><<<grid, kThreads, 0, st>>>(x, q, gs, gs_stride, gs_post, out, ng, total);
      else
        qdq_kernel<T, TO, 32, true, ELEM_E2M1><<<grid, kThreads, 0, st>>>(x, q, gs, gs_stride, gs_post, out, ng, total);
      return check_launch("qqmm");
    }
  }
  if (q.group == 16) {
    if (vec) qdq_kernel<T, TO, 16, true><<<grid, kThreads, 0, st>>>(x, q, gs, gs_stride, gs_post, out, ng, total);
    else qdq_kernel<T, TO, 16, false><<<grid, kThreads, 0, st>>>(x, q, gs, gs_stride, gs_post, out, ng, total);
  } else {
    if (vec) qdq_kernel<T, TO, 32, true><<<grid, kThreads, 0, st>>>(x, q, gs, gs_stride, gs_post, out, ng, total);
    else qdq_kernel<T, TO, 32, false><<<grid, kThreads, 0, st>>>(x, q, gs, gs_stride, gs_post, out, ng, total);
  }
  return check_launch("qqmm");
}

// gs_stride: gs[b * gs_stride] is batch entry b's global scale (0: one for all;
// grouped_qqmm's per-expert scales: 1).
template <typename TO>
qqStatus_t qdq(const Mat& x, const QSpec& q, const float* gs, const float* gs_post, TO* out, cudaStream_t st,
               int64_t gs_stride = 0) {
  switch (x.dt) {
    case DType::F32: return launch_qdq_t<float, TO>(x, q, gs, gs_stride, gs_post, out, st);
    case DType::F16: return launch_qdq_t<__half, TO>(x, q, gs, gs_stride, gs_post, out, st);
    default: return launch_qdq_t<__nv_bfloat16, TO>(x, q, gs, gs_stride, gs_post, out, st);
  }
}

// A prepared operand (q's values in f32/f16, or a bf16 one that is not one
// [rows, cols] matrix with row pitch ld) as compact bf16: exact, the values
// are on the quantization grid.
// out: compact [B, rows, cols] (B = w's batch: grouped_qqmm's experts).
template <typename T>
__global__ void to_bf16_kernel(Mat w, __nv_bfloat16* out, int64_t total) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / w.cols, k = i - r * w.cols, b = r / w.rows;
  out[i] = __ushort_as_bfloat16(f_to_bf16(load1<T>(w.at<T>(b, r - b * w.rows) + k)));
}

qqStatus_t prepared_to_bf16(const Mat& w, __nv_bfloat16* out, cudaStream_t st) {
  const int64_t total = w.batch() * w.rows * w.cols;
  const unsigned grid = (unsigned)((total + kThreads - 1) / kThreads);
  if (w.dt == DType::F32) to_bf16_kernel<float><<<grid, kThreads, 0, st>>>(w, out, total);
  else if (w.dt == DType::F16) to_bf16_kernel<__half><<<grid, kThreads, 0, st>>>(w, out, total);
  else to_bf16_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(w, out, total);  // strided or batched
  return check_launch("qqmm");
}

// A compact [B..., rows, cols] Mat over `ptr` with the batch shape of `like`.
Mat compact_like(const Mat& like, void* ptr, DType dt, int64_t rows, int64_t cols) {
  Mat m = like;
  m.ptr = ptr;
  m.dt = dt;
  m.rows = rows;
  m.cols = cols;
  m.ld = cols;
  int64_t st = rows * cols;
  for (int i = m.nb - 1; i >= 0; --i) {
    m.bstride[i] = st;
    st *= m.bshape[i];
  }
  return m;
}

// The bf16 values of one operand, compact [B*rows, K]: dequantized (packed)
// or quantized-dequantized on the fly (float; gs_stride as in qdq).
qqStatus_t operand_bf16(qqContext* c, const Mat& m, const Mat& scales, bool packed, int blocked, const QSpec& q0,
                        const float* gs, int64_t rows, int64_t K, __nv_bfloat16* out, cudaStream_t st,
                        int64_t gs_stride = 0) {
  if (!packed) return qdq<__nv_bfloat16>(m, q0, gs, nullptr, out, st, gs_stride);
  DequantizeArgs d{};
  d.data = m;
  d.scales = scales;
  d.biases.ptr = nullptr;
  d.out = compact_like(m, out, DType::BF16, rows, K);
  d.gs = nullptr;  // the global scale goes into alpha
  d.q = q0;
  d.q.blocked = blocked;
  return dequantize(c, d, st);
}

// q(w)'s bf16 values, compact [B*N, K], of the entries of w (scales alike; gw
// the nvfp4 global scale of entry b at gw[b * gw_stride]): a prepared f16/f32 w
// converted, a packed w dequantized, a float w quantized on the fly. (A prepared
// bf16 w is used as it is, by the callers.)
qqStatus_t weight_bf16(qqContext* c, const MatmulArgs& a, const Mat& w, const Mat& scales, const float* gw,
                       int64_t gw_stride, __nv_bfloat16* out, cudaStream_t st) {
  if (a.w_prepared) return prepared_to_bf16(w, out, st);
  return operand_bf16(c, w, scales, a.w_packed, a.w_blocked, a.q, gw, a.N, a.K, out, st, gw_stride);
}

// ---------------------------------------------------------------------------
// Blackwell: cuBLASLt block-scaled GEMM
// ---------------------------------------------------------------------------
// What cuBLASLt documents, and so what this path relies on (cuBLAS docs,
// "cublasLtMatmul" > the block-scaled (FP8 / FP4) type tables, and "1D Block
// Scaling Factors Layout"):
//  - E2M1 operands with VEC16_UE4M3 scales (nvfp4); E4M3 operands with
//    VEC32_UE8M0 scales (mxfp8). E5M2 is listed only against an E4M3 other
//    operand, never E5M2 x E5M2, and E2M1 with VEC32_UE8M0 (mxfp4) is not
//    listed at all: qqmm quantizes both operands alike, so mxfp4 and
//    mxfp8-e5m2 take the exact path, decided here without asking cuBLASLt.
//  - TN only: its A transposed (our w [N, K]), its B not (our x [M, K]).
//  - Scales in the 128x4-tile blocked layout, each tensor 16-byte aligned.
//  - Bias: the output type for bf16 / fp16 D; bf16 for fp32 D (no fp32
//    bias, which every plain-GEMM bias here is).
// blockscaled_cc (internal.h) decides; the force_blockscaled test hook makes
// any GPU try (cuBLASLt refuses on Hopper: a test of the descriptors and of
// every fallback).
bool blockscaled_arch(int cc) { return blockscaled_cc(cc) || test_hook(HOOK_FORCE_BLOCKSCALED); }

// The epilogue's bias type for output type `d` (see above).
DType blockscaled_bias_type(DType d) { return d == DType::F16 ? DType::F16 : DType::BF16; }

// x's batch entries (a batch folded into rows) lie rows * ld apart in order.
bool foldable(const Mat& m) {
  int64_t expect = m.rows * m.ld;
  for (int i = m.nb - 1; i >= 0; --i) {
    if (m.bshape[i] != 1 && m.bstride[i] != expect) return false;
    expect *= m.bshape[i];
  }
  return true;
}

// bias [N] (any float dtype) -> `to` (bf16 / fp16), for the epilogue; called
// only where that is exact (the same type).
__global__ void bias_cast_kernel(Mat b, DType to, uint16_t* out, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (i >= n) return;
  const float v = b.dt == DType::F32 ? ((const float*)b.ptr)[i]
                  : (b.dt == DType::BF16 ? bf16_to_f(((const uint16_t*)b.ptr)[i])
                                         : fp16_to_f(((const uint16_t*)b.ptr)[i]));
  out[i] = to == DType::BF16 ? f_to_bf16(v) : f_to_fp16(v);
}

// out[r, n] = y[r, n] + bias[n], rounded once to out's dtype; y fp32 compact
// [rows, N], possibly out itself (fp32 out: in place, element-wise).
__global__ void bias_add_kernel(const float* y, const float* bias, DType odt, void* out, int64_t N, int64_t total) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (i >= total) return;
  const float v = y[i] + bias[i % N];
  if (odt == DType::F32) ((float*)out)[i] = v;
  else if (odt == DType::BF16) ((uint16_t*)out)[i] = f_to_bf16(v);
  else ((uint16_t*)out)[i] = f_to_fp16(v);
}

#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120800
#define QQ_HAVE_BLOCKSCALED 1

// How one operand reaches the GEMM: its packed data and blocked scales, used
// in place or produced into scratch.
struct BsOperand {
  const Mat* m;
  const Mat* scales;
  bool packed;
  int blocked;
  const float* gs;
  int64_t rows;        // the GEMM rows this operand gives (x: its batch folded in)
  const uint8_t* data = nullptr;
  const uint8_t* sc = nullptr;
  int64_t ld = 0;      // elements, for cuBLASLt
  enum { kInPlace, kCopyScales, kSwizzle, kQuantize } how = kInPlace;
};

// Why `o` cannot be a block-scaled operand as it is (nullptr: it can). These
// cases are routed to the exact path, which honours any strides; passing them
// with ld = K would give wrong numbers.
const char* bs_operand_refusal(const BsOperand& o, const char* name) {
  const Mat& m = *o.m;
  static thread_local char buf[256];
  if (o.packed) {
    if (o.blocked && m.batch() > 1)
      return snprintf(buf, sizeof buf, "a batched packed '%s' with blocked scales (each entry is padded to 128 "
                      "rows, so the entries are not one GEMM operand)", name), buf;
    if (!foldable(m))
      return snprintf(buf, sizeof buf, "the batch entries of the packed '%s' are not evenly spaced rows", name),
             buf;
    if (!o.blocked && !foldable(*o.scales))
      return snprintf(buf, sizeof buf, "the batch entries of the linear scales of '%s' are not evenly spaced rows",
                      name), buf;
    return nullptr;
  }
  // float: quantized into scratch by the quantize kernel, which needs 16-byte rows
  const int64_t es = dtype_size(m.dt);
  bool aligned = (uintptr_t)m.ptr % 16 == 0 && (m.rows <= 1 || (m.ld * es) % 16 == 0);
  for (int i = 0; i < m.nb; ++i) aligned = aligned && (m.bstride[i] * es) % 16 == 0;
  if (!aligned)
    return snprintf(buf, sizeof buf, "the float '%s' is not 16-byte aligned (start, row and batch strides), which "
                    "quantizing it on the fly needs", name), buf;
  if (!foldable(m))
    return snprintf(buf, sizeof buf, "the batch entries of '%s' are not evenly spaced rows", name), buf;
  return nullptr;
}

// Allocates the scratch `o` needs and says where its data and scales will be.
qqStatus_t bs_operand_place(qqContext* c, BsOperand& o, const QSpec& q, int64_t K, Scratch& scratch) {
  const int64_t c4 = roundup(K / q.group, 4), sbytes = roundup(o.rows, 128) * c4;
  const Mat& m = *o.m;
  if (o.packed) {
    o.data = (const uint8_t*)m.ptr;
    o.ld = m.ld * 8 / q.bits;  // the real row pitch: a row-strided view is fine
    // blocked scales are compact (the API checks); cuBLASLt wants them 16-byte aligned
    const bool aligned = (uintptr_t)o.scales->ptr % 16 == 0;
    o.how = o.blocked ? (aligned ? BsOperand::kInPlace : BsOperand::kCopyScales) : BsOperand::kSwizzle;
    if (o.how == BsOperand::kInPlace) {
      o.sc = (const uint8_t*)o.scales->ptr;
      return QQ_STATUS_SUCCESS;
    }
  } else {
    uint8_t* d = nullptr;
    QQ_TRY(scratch.get("qqmm", (size_t)(o.rows * q.packed_cols(K)), &d));
    o.data = d;
    o.ld = K;
    o.how = BsOperand::kQuantize;
  }
  uint8_t* sc = nullptr;
  QQ_TRY(scratch.get("qqmm", (size_t)sbytes, &sc));
  o.sc = sc;
  return QQ_STATUS_SUCCESS;
}

// Writes o's scratch (scales copied or swizzled; or data and scales quantized).
qqStatus_t bs_operand_fill(qqContext* c, const BsOperand& o, const QSpec& q0, int64_t K, cudaStream_t st) {
  const Mat& m = *o.m;
  const int64_t c4 = roundup(K / q0.group, 4);
  Mat sb{};  // the blocked scales of all o.rows rows, one matrix
  sb.ptr = (void*)o.sc;
  sb.dt = DType::U8;
  sb.device = m.device;
  sb.rows = roundup(o.rows, 128);
  sb.cols = c4;
  sb.ld = c4;
  switch (o.how) {
    case BsOperand::kInPlace: return QQ_STATUS_SUCCESS;
    case BsOperand::kCopyScales:
      QQ_CUDA_TRY(cudaMemcpyAsync((void*)o.sc, o.scales->ptr, (size_t)(sb.rows * c4), cudaMemcpyDeviceToDevice, st),
                  "qqmm");
      return QQ_STATUS_SUCCESS;
    case BsOperand::kSwizzle: {  // linear scales, batch folded into rows (foldable: checked)
      Mat lin = *o.scales;
      lin.nb = 0;
      lin.rows = o.rows;
      if (o.rows <= 1) lin.ld = lin.cols;
      return swizzle(c, lin, sb, true, st);
    }
    case BsOperand::kQuantize: {
      QuantizeArgs qa{};
      qa.x = m;
      qa.x.nb = 0;  // folded (checked), rows o.rows at pitch m.ld
      qa.x.rows = o.rows;
      qa.data = compact_like(qa.x, (void*)o.data, DType::U8, o.rows, q0.packed_cols(K));
      qa.scales = sb;
      qa.gs = o.gs;
      qa.q = q0;
      qa.q.blocked = 1;
      return quantize(c, qa, st);
    }
  }
  return QQ_STATUS_SUCCESS;
}

// The block-scaled route: SUCCESS, or NOT_SUPPORTED with the reason in the
// message (the caller falls back or reports it), or another error. Order:
// everything that can refuse without work first (the documented
// combinations, the operands' layout, then the plan cache - asking cuBLASLt
// once per key), and only then the quantization and the GEMM.
qqStatus_t qqmm_blockscaled(qqContext* c, const MatmulArgs& a, const float* alpha_dev, int64_t Mtot,
                            cudaStream_t st) {
  const char* why = nullptr;
  if (a.q.mode == QQ_MODE_MXFP4)
    why = "mxfp4 (E2M1 elements with UE8M0 scales) is not among cuBLASLt's documented block-scaled combinations "
          "(cuBLAS docs, 'cublasLtMatmul' type tables: E2M1 goes with VEC16_UE4M3 only)";
  else if (a.q.elem == ELEM_E5M2)
    why = "mxfp8 with e5m2 on both operands is not among cuBLASLt's documented block-scaled combinations (E5M2 is "
          "listed only against E4M3)";
  else if (a.w_prepared)
    why = "a prepared w (q(w)'s float values) has no packed form; pass the QuantizedArray instead";
  else if (a.x_prepared)
    why = "a prepared x (q(x)'s float values) has no packed form; pass x itself (quantized on the fly)";
  BsOperand x{&a.x, &a.x_scales, a.x_packed, a.x_blocked, a.gs_x, Mtot};
  BsOperand w{&a.w, &a.w_scales, a.w_packed, a.w_blocked, a.gs_w, a.N};
  if (!why) why = bs_operand_refusal(x, "x");
  if (!why) why = bs_operand_refusal(w, "w");
  if (why) return set_error(QQ_STATUS_NOT_SUPPORTED, "qqmm: the block-scaled route does not take this call: %s", why);

  Scratch scratch(c, st);  // its own: freed (stream-ordered) before a fallback allocates
  QQ_TRY(bs_operand_place(c, x, a.q, a.K, scratch));
  QQ_TRY(bs_operand_place(c, w, a.q, a.K, scratch));
  // Bias: in the epilogue where that is exact (the bias already has the type
  // the table allows); otherwise the GEMM writes fp32 and one pass adds the
  // fp32 bias and rounds once, as the exact path does.
  const DType bt = blockscaled_bias_type(a.out.dt);
  const bool bias_in_epilogue = a.bias.ptr && a.bias.dt == bt;
  const bool bias_after = a.bias.ptr && !bias_in_epilogue;
  uint16_t* bias_lt = nullptr;
  if (bias_in_epilogue) QQ_TRY(scratch.get("qqmm", (size_t)a.N * 2, &bias_lt));
  float* y = nullptr;  // fp32 product when the bias comes after (out itself when out is fp32)
  float* bias_f32 = nullptr;
  if (bias_after) {
    if (a.out.dt == DType::F32) y = (float*)a.out.ptr;
    else QQ_TRY(scratch.get("qqmm", (size_t)(Mtot * a.N) * 4, &y));
    QQ_TRY(scratch.get("qqmm", (size_t)a.N * 4, &bias_f32));
  }
  Gemm g;
  g.M = Mtot;
  g.N = a.N;
  g.K = a.K;
  g.d = bias_after ? DType::F32 : a.out.dt;
  g.A = x.data;
  g.lda = x.ld;
  g.B = w.data;
  g.ldb = w.ld;
  g.b_trans = true;
  g.D = bias_after ? (void*)y : a.out.ptr;
  g.ldd = a.N;
  g.bias = bias_lt;
  g.bias_dt = bt;
  g.alpha_dev = alpha_dev;
  g.lt_ab = (int)(a.q.bits == 4 ? CUDA_R_4F_E2M1 : CUDA_R_8F_E4M3);
  g.scale_mode = (int)(a.q.mode == QQ_MODE_NVFP4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3
                                                 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0);
  g.a_scale = x.sc;
  g.b_scale = w.sc;
  bool ok = false;
  QQ_TRY(gemm_blockscaled_plan(c, g, &ok));
  if (!ok) {
    const std::string msg = qqGetLastErrorMessage();
    return set_error(QQ_STATUS_NOT_SUPPORTED, "qqmm: the block-scaled route does not take this call: %s on this GPU "
                     "(compute capability %d.%d)", msg.c_str(), c->cc / 10, c->cc % 10);
  }
  QQ_TRY(bs_operand_fill(c, x, a.q, a.K, st));
  QQ_TRY(bs_operand_fill(c, w, a.q, a.K, st));
  if (bias_lt) {
    bias_cast_kernel<<<(unsigned)((a.N + kThreads - 1) / kThreads), kThreads, 0, st>>>(a.bias, bt, bias_lt, a.N);
    QQ_TRY(check_launch("qqmm"));
  }
  const qqStatus_t s = gemm_blockscaled(c, g, st);
  if (s == QQ_STATUS_NOT_SUPPORTED) {
    const std::string msg = qqGetLastErrorMessage();
    return set_error(s, "qqmm: the block-scaled route failed: %s", msg.c_str());
  }
  QQ_TRY(s);
  if (bias_after) {
    QQ_TRY(to_f32("qqmm", a.bias, a.N, bias_f32, st));
    const int64_t total = Mtot * a.N;
    bias_add_kernel<<<(unsigned)((total + kThreads - 1) / kThreads), kThreads, 0, st>>>(y, bias_f32, a.out.dt,
                                                                                        a.out.ptr, a.N, total);
    QQ_TRY(check_launch("qqmm"));
  }
  return QQ_STATUS_SUCCESS;
}
#else
#define QQ_HAVE_BLOCKSCALED 0
#endif

// out = y + beta * C, one rounding to out's dtype; y is the fp32 product (+
// bias), compact like out. Element-wise, so C may be out itself.
__global__ void beta_c_kernel(const float* y, Mat cm, float beta, Mat out, int64_t total) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t per = out.rows * out.cols, b = i / per, r = (i % per) / out.cols, col = i % out.cols;
  const int64_t ci = cm.offset(b) + r * cm.ld + col;
  const float cv = cm.dt == DType::F32 ? ((const float*)cm.ptr)[ci]
                   : (cm.dt == DType::BF16 ? bf16_to_f(((const uint16_t*)cm.ptr)[ci])
                                           : fp16_to_f(((const uint16_t*)cm.ptr)[ci]));
  const float v = fmaf(beta, cv, y[i]);
  const int64_t oi = out.offset(b) + r * out.ld + col;
  if (out.dt == DType::F32) ((float*)out.ptr)[oi] = v;
  else if (out.dt == DType::BF16) ((uint16_t*)out.ptr)[oi] = f_to_bf16(v);
  else ((uint16_t*)out.ptr)[oi] = f_to_fp16(v);
}

qqStatus_t qqmm_core(qqHandle_t h, const MatmulArgs& a, void* stream);

}  // namespace

// beta * C: every path (Blackwell's included) writes the product into an fp32
// buffer, and one element-wise pass adds beta * C and rounds once to out's
// dtype - exact to one rounding whatever out's dtype, and safe when C is out.
qqStatus_t qqmm(qqHandle_t h, const MatmulArgs& a, void* stream) {
  if (!a.c.ptr || a.beta == 0.0f) return qqmm_core(h, a, stream);
  qqContext* c = nullptr;
  QQ_TRY(resolve_handle("qqmm", h, a.out.device, &c));
  return on_device(c->device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    Scratch scratch(c, st);
    const int64_t total = a.out.batch() * a.out.rows * a.out.cols;
    float* y = nullptr;
    QQ_TRY(scratch.get("qqmm", (size_t)total * 4, &y));
    MatmulArgs b = a;
    b.c = Mat{};
    b.beta = 0.0f;
    b.out = compact_like(a.out, y, DType::F32, a.out.rows, a.out.cols);
    QQ_TRY(qqmm_core(h, b, stream));
    beta_c_kernel<<<(unsigned)((total + kThreads - 1) / kThreads), kThreads, 0, st>>>(y, a.c, a.beta, a.out, total);
    return check_launch("qqmm");
  });
}

namespace {

// qqmm as a weight-only product: q(x) (already in the float buffer xq, compact
// [Mtot, K], batch folded into rows) times the packed w, as qmma / qmv take it.
MatmulArgs weight_only_args(const MatmulArgs& a, void* xq, DType dt, int64_t Mtot) {
  MatmulArgs b = a;
  b.x = compact_like(a.x, xq, dt, Mtot, a.K);
  b.x.nb = 0;
  b.out.nb = 0;
  b.out.rows = Mtot;
  b.M = Mtot;
  b.x_packed = false;
  b.transpose = true;
  b.q.blocked = a.w_blocked;
  return b;
}

// With both forms of w (w_values next to the packed w): true when this call
// runs on the values (the GEMM route), false when on the packed w (the
// block-scaled and weight-only routes, which read only the packed form).
bool use_w_values(const MatmulArgs& a, int64_t Mtot, int cc) {
  switch (a.route) {
    case QQ_ROUTE_EXACT: return true;
    case QQ_ROUTE_AUTO: break;
    default: return false;  // blockscaled, qmma, qmv
  }
  // The hardware's answer, not the force_blockscaled hook's: on a GPU without block-scaled
  // tensor cores the values exist (qq.prepare_weight made them) and the GEMM on them is
  // this call's fastest route, hook or not.
  if (blockscaled_cc(cc)) return false;
  const bool chunk16 = (a.K * a.q.bits / 8) % 16 == 0;
  return !(Mtot <= kQmvMaxM || (Mtot <= kPackedOverValuesMaxM && chunk16));
}

qqStatus_t qqmm_core(qqHandle_t h, const MatmulArgs& a, void* stream) {
  qqContext* c = nullptr;
  QQ_TRY(resolve_handle("qqmm", h, a.out.device, &c));
  if (a.w_values.ptr) {
    MatmulArgs b = a;
    b.w_values = Mat{};
    if (use_w_values(a, a.x.batch() * a.M, c->cc)) {
      b.w = a.w_values;
      b.w_scales = Mat{};
      b.w_packed = false;
      b.w_blocked = 0;
      b.w_prepared = true;
    }
    return qqmm_core(h, b, stream);
  }
  return on_device(c->device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    Scratch scratch(c, st);
    const int64_t M = a.M, N = a.N, K = a.K, Mtot = a.x.batch() * M;
    // alpha (the nvfp4 global scales' factor) as a device scalar for the GEMM routes,
    // made once when one of them runs; the weight-only kernels read the two scales
    // themselves (a launch and a scratch allocation fewer per small-M call).
    float* alpha = nullptr;
    bool have_alpha = false;
    const auto gemm_alpha = [&]() -> qqStatus_t {
      if (!have_alpha) QQ_TRY(alpha_pair("qqmm", a.gs_x, a.gs_w, scratch, st, &alpha));
      have_alpha = true;
      return QQ_STATUS_SUCCESS;
    };
    // The routes in AUTO's order; a requested one runs alone or fails saying why.
    const qqRoute_t want = a.route;
    const bool any = want == QQ_ROUTE_AUTO;
    if (want == QQ_ROUTE_BLOCKSCALED && !blockscaled_arch(c->cc))
      return set_error(QQ_STATUS_ARCH_MISMATCH, "qqmm: route 'blockscaled' needs block-scaled tensor cores "
                       "through cuBLASLt (compute capability 10.x, 11.0 or 12.x); device %d is %d.%d; use route "
                       "'auto' or 'exact'", c->device, c->cc / 10, c->cc % 10);
    if (want == QQ_ROUTE_BLOCKSCALED || (any && blockscaled_arch(c->cc))) {
#if QQ_HAVE_BLOCKSCALED
      QQ_TRY(gemm_alpha());
      const qqStatus_t s = qqmm_blockscaled(c, a, alpha, Mtot, st);
#else
      const qqStatus_t s = set_error(QQ_STATUS_NOT_SUPPORTED, "qqmm: the block-scaled route does not take this "
                                     "call: this libqq was built against cuBLASLt older than 12.8, which has no "
                                     "block-scaled GEMM; rebuild with CUDA 12.8 or newer");
#endif
      if (s == QQ_STATUS_SUCCESS) return routed(s, QQ_ROUTE_BLOCKSCALED);
      if (s != QQ_STATUS_NOT_SUPPORTED || !any) return s;
      clear_error();  // refused (it said why): the next route below
    }
    // The weight-only routes take a float x (quantized here) and a packed w.
    const bool wonly = a.w_packed && !a.x_packed && !a.x_prepared;
    if ((want == QQ_ROUTE_QMMA || want == QQ_ROUTE_QMV) && !wonly)
      return set_error(QQ_STATUS_NOT_SUPPORTED, "qqmm: route '%s' needs a float x and a packed w (got %s x, %s "
                       "w); use route 'auto' or 'exact'", qqGetRouteString(want),
                       a.x_packed ? "a packed" : (a.x_prepared ? "a prepared" : "a float"),
                       a.w_packed ? "a packed" : (a.w_prepared ? "a prepared" : "a float"));
    if ((want == QQ_ROUTE_QMMA && Mtot > kQmmaMaxM) || (want == QQ_ROUTE_QMV && Mtot > kQmvMaxM))
      return set_error(QQ_STATUS_NOT_SUPPORTED, "qqmm: route '%s' takes M <= %d rows (batch folded in); got %lld; "
                       "use route 'auto' or 'exact'", qqGetRouteString(want),
                       want == QQ_ROUTE_QMMA ? kQmmaMaxM : kQmvMaxM, (long long)Mtot);
    // x quantized inside the weight-only kernel's own launch (ops.cuh, QX): one launch and
    // no scratch; else a qdq kernel first. qqmm offers it (float x, packed w, M <= 8); the
    // kernels decide whether they take it (q(x) within their shared memory, the work bound:
    // qmma.cu's plan, qmv.cu).
    QX qx;
    const bool fuse = wonly && Mtot <= 8 && !test_hook(HOOK_UNFUSED_QX);
    if (fuse) {
      qx.on = true;
      qx.x = a.x;
      qx.q = a.q;
      qx.gs = a.gs_x;
      qx.rows = (int)Mtot;
      qx.pitch = K + 8;
      qx.vec = rows_aligned(a.x);
    }
    // Small and medium M, stored weight: the tensor-core weight-only kernel
    // on q(x) in bf16 (exact), alpha = nvfp4_alpha(gs_x, gs_w) applied to its
    // fp32 sums by the kernel.
    if ((any || want == QQ_ROUTE_QMMA) && Mtot <= kQmmaMaxM && wonly) {
      const MatmulArgs b0 = weight_only_args(a, nullptr, DType::BF16, Mtot);
      if (fuse && qmma_takes(b0, &qx)) return routed(qmma(b0, nullptr, st, nullptr, &qx), QQ_ROUTE_QMMA);
      if (qmma_takes(b0)) {  // asked first: x is quantized only for the route that runs
        __nv_bfloat16* xq = nullptr;
        QQ_TRY(scratch.get("qqmm", (size_t)(Mtot * K) * 2, &xq));
        const MatmulArgs b = weight_only_args(a, xq, DType::BF16, Mtot);
        QQ_TRY(qdq<__nv_bfloat16>(a.x, a.q, a.gs_x, nullptr, xq, st));
        return routed(qmma(b, nullptr, st), QQ_ROUTE_QMMA);
      }
      if (!any)
        return set_error(QQ_STATUS_NOT_SUPPORTED, "qqmm: route 'qmma' does not take this call: it needs w's rows "
                         "to be whole 16-byte chunks (K * bits / 8 %% 16 == 0) on 16-byte aligned rows, and mxfp8 at "
                         "M = 1 goes to qmv; use route 'auto'");
    }
    // Small M otherwise: the CUDA-core weight-only kernel on q(x) (fp32,
    // gx/2688 applied), w's global scale applied by qmv as dequantize does.
    if ((any || want == QQ_ROUTE_QMV) && Mtot <= kQmvMaxM && wonly) {
      if (fuse) {
        const qqStatus_t s = qmv(weight_only_args(a, nullptr, DType::BF16, Mtot), st, &qx);
        if (s != QQ_STATUS_NOT_SUPPORTED) return routed(s, QQ_ROUTE_QMV);
      }
      float* xq = nullptr;
      QQ_TRY(scratch.get("qqmm", (size_t)(Mtot * K) * 4, &xq));
      QQ_TRY(qdq<float>(a.x, a.q, a.gs_x, a.gs_x, xq, st));
      const MatmulArgs b = weight_only_args(a, xq, DType::F32, Mtot);
      const qqStatus_t s = qmv(b, st);
      if (s != QQ_STATUS_NOT_SUPPORTED) return routed(s, QQ_ROUTE_QMV);
      if (!any)
        return set_error(QQ_STATUS_NOT_SUPPORTED, "qqmm: route 'qmv' does not take this call; use route 'auto'");
    }
    // A prepared operand in bf16 that is one matrix (transposed views
    // included: the GEMM reads them with op T) is used where it lies; other
    // prepared ones are converted, compact, in their stored orientation.
    const auto one_bf16 = [](const Mat& m) { return m.dt == DType::BF16 && (m.nb == 0 || m.batch() == 1); };
    __nv_bfloat16 *xb = nullptr, *wb = nullptr;
    int64_t ldx = K, ldw = K;
    if (a.x_prepared && one_bf16(a.x)) {
      xb = (__nv_bfloat16*)a.x.at<__nv_bfloat16>(0);
      ldx = a.x.ld;
    } else {
      QQ_TRY(scratch.get("qqmm", (size_t)(Mtot * K) * 2, &xb));
      if (a.x_prepared) {
        QQ_TRY(prepared_to_bf16(a.x, xb, st));
        ldx = a.x.cols;
      } else {
        QQ_TRY(operand_bf16(c, a.x, a.x_scales, a.x_packed, a.x_blocked, a.q, a.gs_x, M, K, xb, st));
      }
    }
    if (a.w_prepared && one_bf16(a.w)) {  // the caller keeps q(w) in bf16: no work per call
      wb = (__nv_bfloat16*)a.w.ptr;
      ldw = a.w.ld;
    } else {
      QQ_TRY(scratch.get("qqmm", (size_t)(N * K) * 2, &wb));
      QQ_TRY(weight_bf16(c, a, a.w, a.w_scales, a.gs_w, 0, wb, st));
      if (a.w_prepared) ldw = a.w.cols;
    }
    Gemm g;
    g.M = Mtot;
    g.N = N;
    g.K = K;
    g.ab = DType::BF16;
    g.d = a.out.dt;
    g.A = xb;
    g.lda = ldx;
    g.a_trans = a.x_trans;
    g.B = wb;
    g.ldb = ldw;
    g.b_trans = !a.w_trans;
    g.D = a.out.ptr;
    g.ldd = N;
    QQ_TRY(gemm_bias("qqmm", a.bias, &g, scratch, st));
    QQ_TRY(gemm_alpha());
    g.alpha_dev = alpha;
    return routed(gemm(c, g, st), QQ_ROUTE_EXACT);
  });
}

}  // namespace

#if !QQ_HAVE_GROUPED_SM90
// Built without CUTLASS's headers or without sm_90a (CMakeLists.txt): never asked to run.
bool grouped_gemm_sm90_built() { return false; }
size_t grouped_gemm_sm90_scratch(const GroupedGemmSm90&) { return 0; }
const char* grouped_gemm_sm90(const GroupedGemmSm90&, void*, cudaStream_t) { return "not built"; }
#endif

// Packed or float expert weights are converted to bf16 per call, as many
// experts at a time as fit in this much scratch (one grouped GEMM per chunk:
// E = 128 experts of 4096 x 7168 take 2). Prepared bf16 weights need none.
constexpr int64_t kGroupedBf16WeightBytes = 4ll << 30;

// Mat m restricted to batch entries [e0, e0 + n) of its one batch dim.
Mat batch_slice(const Mat& m, int64_t e0, int64_t n) {
  Mat r = m;
  r.ptr = (char*)m.ptr + e0 * m.bstride[0] * dtype_size(m.dt);
  r.bshape[0] = n;
  return r;
}

// ---------------------------------------------------------------------------
// grouped_qqmm on Blackwell: every expert in one cuBLASLt grouped block-scaled GEMM
// ---------------------------------------------------------------------------
// The packed operands go to the block-scaled tensor cores, as qqmm's block-scaled route does
// for one product (gemm.cu, gemm_grouped_blockscaled: what cuBLASLt documents for its grouped
// mode). What only the device knows, each expert's rows, stays there: one small kernel
// (grouped_bs_args_kernel) derives every per-expert pointer, shape and alpha from the group
// ends. x's data needs no per-expert copy (expert e's rows start at row ends[e-1]); its
// scales do: cuBLASLt reads an expert's scales from that expert's own pointer as a blocked
// [roundup(n_e, 128), C4] matrix, so seg_swizzle_kernel writes expert e's linear scales into
// blocked tiles of their own from row P_e = 128 * sum_{j<e} ceil(n_j / 128) of one buffer (at
// most T + 127 E rows; padding zero). Launches: x's quantization (float x), the args kernel,
// the swizzle, the GEMM, and a NaN fill that writes only when the ends were bad - a fixed
// number whatever E is, no host synchronization. Built everywhere, never run on Blackwell
// here (docs/blackwell.md): on other GPUs the force_blockscaled hook sends calls here, where
// cuBLASLt refuses and the call takes the next route, which tests the refusal path.
namespace {

// Groups the args kernel takes (one block; its prefix over the experts is serial).
constexpr int64_t kGroupedBsMaxE = 4096;

struct GroupedBsArgs {
  const int32_t* ends = nullptr;
  int E = 0;
  int64_t T = 0, N = 0, K = 0, c4 = 0;
  const uint8_t* x = nullptr;  // packed q(x) rows, x_pitch bytes apart
  int64_t x_pitch = 0, x_ld = 0;
  const uint8_t* xs = nullptr;  // x's blocked scales, P_e rows of c4 bytes for expert e
  const uint8_t* w = nullptr;   // packed w[e] at w + e * w_stride bytes, rows w_ld elements apart
  int64_t w_stride = 0, w_ld = 0;
  const uint8_t* ws = nullptr;  // w[e]'s blocked scales at ws + e * ws_stride
  int64_t ws_stride = 0;
  uint8_t* out = nullptr;  // out rows, out_pitch bytes apart, out_ld elements
  int64_t out_pitch = 0, out_ld = 0;
  const float* gs_x = nullptr;
  const float* gs_w = nullptr;
  int gw_stride = 0;
  GroupedLtGemm g;              // the arrays written here
  float* alpha_vals = nullptr;  // [E + 1]: alpha_e, then 0 (beta)
  int64_t* pstart = nullptr;    // [E]: P_e
  int* bad = nullptr;           // 1: the ends are not non-decreasing in [0, T] ending at T
};

__global__ void grouped_bs_args_kernel(GroupedBsArgs a) {
  __shared__ int bad;
  if (threadIdx.x == 0) {  // the prefix P_e and the check of the ends (E <= kGroupedBsMaxE)
    int b = 0;
    int64_t prev = 0, p = 0;
    for (int e = 0; e < a.E; ++e) {
      const int64_t end = a.ends[e];
      if (group_end_bad(a.ends, e, a.E, a.T)) b = 1;
      a.pstart[e] = p;
      if (!b) p += roundup(end - prev, 128);
      prev = end;
    }
    bad = b;
    *a.bad = b;
    a.alpha_vals[a.E] = 0.0f;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < a.E; e += blockDim.x) {
    // bad ends: every group empty (nothing read or written past the buffers), then all NaN
    const int64_t r0 = bad || e == 0 ? 0 : a.ends[e - 1];
    const int64_t n = bad ? 0 : a.ends[e] - r0;
    a.g.a_ptr[e] = (void*)(a.x + r0 * a.x_pitch);
    a.g.b_ptr[e] = (void*)(a.w + e * a.w_stride);
    a.g.d_ptr[e] = (void*)(a.out + r0 * a.out_pitch);
    a.g.a_scale[e] = (void*)(a.xs + a.pstart[e] * a.c4);
    a.g.b_scale[e] = (void*)(a.ws + e * a.ws_stride);
    a.alpha_vals[e] = nvfp4_alpha(a.gs_x, a.gs_w ? a.gs_w + (int64_t)e * a.gw_stride : nullptr);
    a.g.alpha[e] = (void*)(a.alpha_vals + e);
    a.g.beta[e] = (void*)(a.alpha_vals + a.E);
    a.g.rows_k[e] = a.K;
    a.g.cols_n[e] = a.N;
    a.g.cols_m[e] = n;
    a.g.ld_a[e] = a.x_ld;
    a.g.ld_b[e] = a.w_ld;
    a.g.ld_d[e] = a.out_ld;
  }
}

// Linear scales lin [T, cols] (row pitch ld) -> each expert's blocked tiles at row P_e of
// `blk` (c4 bytes a row); one thread a scale byte. Nothing when the ends were bad.
__global__ void seg_swizzle_kernel(const uint8_t* lin, int64_t ld, int64_t T, int64_t cols, const int32_t* ends,
                                   int E, const int64_t* pstart, const int* bad, uint8_t* blk, int64_t c4) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (i >= T * cols || *bad) return;
  const int64_t t = i / cols, j = i - t * cols;
  int lo = 0, hi = E;  // the expert of token t: the first e with ends[e] > t
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (ends[mid] > t) hi = mid;
    else lo = mid + 1;
  }
  const int64_t r0 = lo == 0 ? 0 : ends[lo - 1];
  blk[pstart[lo] * c4 + blocked_offset(t - r0, j, c4)] = lin[t * ld + j];
}

// out's element oi (float32, bfloat16 or float16) set to NaN or to zero.
__device__ __forceinline__ void put_nan_or_zero(const Mat& out, int64_t oi, bool nan) {
  if (out.dt == DType::F32) ((uint32_t*)out.ptr)[oi] = nan ? 0x7fc00000u : 0u;
  else if (out.dt == DType::BF16) ((uint16_t*)out.ptr)[oi] = nan ? 0x7fc0 : 0;
  else ((uint16_t*)out.ptr)[oi] = nan ? 0x7e00 : 0;
}

// out [T, N] all NaN when the ends were bad (the grouped GEMM then wrote nothing).
__global__ void nan_if_bad_kernel(const int* bad, Mat out, int64_t total) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (i >= total || !*bad) return;
  const int64_t r = i / out.cols, col = i - r * out.cols;
  put_nan_or_zero(out, r * out.ld + col, true);
}

// The emulate_grouped_blockscaled test hook's stand-in for cuBLASLt's grouped GEMM: D_e =
// alpha_e * A_e @ B_e^T from the same device arrays, read as cuBLASLt is told to read them
// (pointers, int64 shapes and pitches, each group's blocked scales: [*, roundup(K_e / group,
// 4)] for the group's own K_e), one thread an output, fp32 sums per scale group. Slow; for
// tests of everything around the GEMM (grouped_qqmm's and grouped_qqmm_wgrad's routes).
__global__ void grouped_bs_emulate_kernel(GroupedLtGemm g, int bits, int group, bool nvfp4) {
  const int e = blockIdx.y;
  const int64_t m_e = g.cols_m[e], N = g.cols_n[e], K = g.rows_k[e], c4 = roundup(K / group, 4);
  const uint8_t* sa = (const uint8_t*)g.a_scale[e];
  const uint8_t* sb = (const uint8_t*)g.b_scale[e];
  const float alpha = *(const float*)g.alpha[e];
  const int dsize = g.d == DType::F32 ? 4 : 2;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m_e * N; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t m = i / N, n = i - m * N;
    const uint8_t* ra = (const uint8_t*)g.a_ptr[e] + m * g.ld_a[e] * bits / 8;
    const uint8_t* rb = (const uint8_t*)g.b_ptr[e] + n * g.ld_b[e] * bits / 8;
    float acc = 0.0f;
    for (int64_t kg = 0; kg < K / group; ++kg) {
      const uint8_t ca = sa[blocked_offset(m, kg, c4)], cb = sb[blocked_offset(n, kg, c4)];
      const float s = nvfp4 ? e4m3_decode(ca) * e4m3_decode(cb) : ue8m0_decode(ca) * ue8m0_decode(cb);
      float part = 0.0f;
      for (int64_t k = kg * group; k < (kg + 1) * group; ++k) {
        const float va = bits == 8 ? e4m3_decode(ra[k]) : e2m1_decode((uint8_t)((ra[k / 2] >> (4 * (k & 1))) & 15));
        const float vb = bits == 8 ? e4m3_decode(rb[k]) : e2m1_decode((uint8_t)((rb[k / 2] >> (4 * (k & 1))) & 15));
        part = fmaf(va, vb, part);
      }
      acc = fmaf(part, s, acc);
    }
    const float v = acc * alpha;
    uint8_t* d = (uint8_t*)g.d_ptr[e] + (m * g.ld_d[e] + n) * dsize;
    if (g.d == DType::F32) *(float*)d = v;
    else if (g.d == DType::BF16) *(uint16_t*)d = f_to_bf16(v);
    else *(uint16_t*)d = f_to_fp16(v);
  }
}

// Compute capabilities whose cuBLASLt documents the grouped block-scaled GEMM (10.x, 11.0;
// not 12.x), or any GPU under the force_blockscaled or emulate_grouped_blockscaled hooks.
bool grouped_bs_arch(int cc) {
  return cc / 10 == 10 || cc / 10 == 11 || test_hook(HOOK_FORCE_BLOCKSCALED) || test_hook(HOOK_EMULATE_GROUPED);
}

// What both grouped block-scaled routes (grouped_qqmm's, grouped_qqmm_wgrad's) need of a call
// whatever its shapes: nullptr, or why cuBLASLt's grouped GEMM cannot take it.
const char* grouped_bs_refusal(const QSpec& q, DType out) {
  const bool nvfp4 = q.mode == QQ_MODE_NVFP4;
  if (!nvfp4 && !(q.mode == QQ_MODE_MXFP8 && q.elem == ELEM_E4M3))
    return "only nvfp4 and mxfp8 (e4m3) have grouped block-scaled GEMMs in cuBLASLt";
  if (cublaslt_version() < (nvfp4 ? 130400u : 130300u) && !test_hook(HOOK_FORCE_BLOCKSCALED) &&
      !test_hook(HOOK_EMULATE_GROUPED))
    return nvfp4 ? "cuBLASLt's grouped nvfp4 GEMM needs cuBLASLt 13.4 or newer at run time"
                 : "cuBLASLt's grouped mxfp8 GEMM needs cuBLASLt 13.3 or newer at run time";
  if (out == DType::F16 && nvfp4) return "cuBLASLt has no float16 result for fp4 operands";
  return nullptr;
}

// The smallest power of two >= v (at least lo, at most 2^30): the heuristic's hint for a size
// only the device knows, and part of the plan's key, so that sizes that change every step
// reuse a few plans instead of making one each.
int64_t pow2_hint(int64_t v, int64_t lo) {
  int64_t p = lo;
  while (p < v && p < (1ll << 30)) p *= 2;
  return p;
}

#if QQ_HAVE_BLOCKSCALED
// lt's 7 pointer and 6 int64 arrays [E] carved from `meta` (16-byte pieces), and its types
// for mode q with an `out` result; returns the bytes the arrays take.
int64_t grouped_bs_layout(uint8_t* meta, int64_t E, const QSpec& q, DType out, GroupedLtGemm& lt) {
  const int64_t e16 = roundup(E, 2) * 8;
  void*** ptrs[] = {&lt.a_ptr, &lt.b_ptr, &lt.d_ptr, &lt.a_scale, &lt.b_scale, &lt.alpha, &lt.beta};
  for (int i = 0; i < 7; ++i) *ptrs[i] = (void**)(meta + i * e16);
  int64_t** ints[] = {&lt.rows_k, &lt.cols_n, &lt.cols_m, &lt.ld_a, &lt.ld_b, &lt.ld_d};
  for (int i = 0; i < 6; ++i) *ints[i] = (int64_t*)(meta + (7 + i) * e16);
  lt.E = E;
  lt.d = out;
  const bool nvfp4 = q.mode == QQ_MODE_NVFP4;
  lt.lt_ab = (int)(nvfp4 ? CUDA_R_4F_E2M1 : CUDA_R_8F_E4M3);
  lt.scale_mode = (int)(nvfp4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0);
  return 13 * e16;
}

// The grouped GEMM of lt's arrays (written by then), or under the emulate_grouped_blockscaled
// hook its stand-in; per_group: outputs of a typical group (the stand-in's grid).
qqStatus_t run_grouped_bs(qqContext* c, const GroupedLtGemm& lt, const QSpec& q, int64_t per_group, cudaStream_t st,
                          const char* op) {
  if (!test_hook(HOOK_EMULATE_GROUPED)) return gemm_grouped_blockscaled(c, lt, true, st);
  const unsigned blocks = (unsigned)std::min<int64_t>(256, (per_group + kThreads - 1) / kThreads + 1);
  grouped_bs_emulate_kernel<<<dim3(blocks, (unsigned)lt.E), kThreads, 0, st>>>(lt, q.bits, q.group,
                                                                               q.mode == QQ_MODE_NVFP4);
  return check_launch(op);
}
#endif

// SUCCESS (the product is in a.out), NOT_SUPPORTED with the reason (nothing written: the caller
// takes another route), or another error.
qqStatus_t grouped_qqmm_blockscaled(qqContext* c, const MatmulArgs& a, int64_t gw_stride, const int32_t* ends,
                                    int64_t E, cudaStream_t st) {
#if !QQ_HAVE_BLOCKSCALED
  return set_error(QQ_STATUS_NOT_SUPPORTED, "grouped_qqmm: libqq was built against a cuBLASLt without block-scaled "
                   "GEMMs");
#else
  const int64_t T = a.M, N = a.N, K = a.K;
  const QSpec& q = a.q;
  const char* why = grouped_bs_refusal(q, a.out.dt);
  if (why) {
  } else if (E < 1 || E > kGroupedBsMaxE)
    why = "the number of experts is outside 1 .. 4096";
  else if (a.w_prepared || a.x_prepared || a.w_trans || a.x_trans || a.x.nb != 0)
    why = "a prepared or transposed operand has no packed form";
  else if (!rows_aligned(a.out) || (K * q.bits / 8) % 16 != 0)
    why = "out's rows, or the packed rows of K elements, are not 16-byte aligned";
  else if (a.x_packed ? (a.x_blocked || (uintptr_t)a.x.ptr % 16 || a.x.ld % 16) : !rows_aligned(a.x))
    why = "x is not 16-byte aligned, or its scales are blocked over all tokens (pass linear ones)";
  else if (a.w_packed && (!a.w.nb || (uintptr_t)a.w.ptr % 16 || a.w.ld % 16 || a.w.bstride[0] % 16))
    why = "the packed experts' rows are not 16-byte aligned";
  else if (a.w_packed && a.w_blocked && ((uintptr_t)a.w_scales.ptr % 16 || a.w_scales.bstride[0] % 16 ||
                                         a.w_scales.ld != a.w_scales.cols))
    why = "the experts' blocked scales are not compact and 16-byte aligned";
  else if (!a.w_packed && !rows_aligned(a.w))
    why = "float experts are quantized here in one pass, which needs 16-byte rows";
  if (why) return set_error(QQ_STATUS_NOT_SUPPORTED, "grouped_qqmm: the block-scaled route does not take this call: %s",
                            why);

  const int64_t cK = K / q.group, c4 = roundup(cK, 4), R128 = roundup(N, 128);
  const int64_t prows = roundup(T + 127 * E, 128);  // x's blocked scale rows, P_E at most
  Scratch scratch(c, st);
  // the arrays: lt's [E], P [E], alpha [E + 1], the flag (16-byte pieces)
  const int64_t e16 = roundup(E, 2) * 8, a16 = roundup((E + 1) * 4, 16);
  uint8_t* meta = nullptr;
  QQ_TRY(scratch.get("grouped_qqmm", (size_t)(14 * e16 + a16 + 16), &meta));
  GroupedBsArgs g;
  GroupedLtGemm& lt = g.g;
  const int64_t used = grouped_bs_layout(meta, E, q, a.out.dt, lt);
  g.pstart = (int64_t*)(meta + used);
  g.alpha_vals = (float*)(meta + used + e16);
  g.bad = (int*)(meta + used + e16 + a16);
  lt.N = N;
  lt.K = K;
  lt.avg_m = pow2_hint(T / E, 1);
  if (!test_hook(HOOK_EMULATE_GROUPED))
    QQ_TRY(gemm_grouped_blockscaled(c, lt, false, st));  // refused (with the reason) before any work

  // x: packed rows and linear scales (the caller's, or quantized here)
  const int64_t xrow = q.packed_cols(K);
  const uint8_t* xd = (const uint8_t*)a.x.ptr;
  const uint8_t* xl = (const uint8_t*)a.x_scales.ptr;
  int64_t x_pitch = a.x.ld, xl_ld = a.x_scales.ld;
  if (!a.x_packed) {
    uint8_t *d = nullptr, *sl = nullptr;
    QQ_TRY(scratch.get("grouped_qqmm", (size_t)(T * xrow), &d));
    QQ_TRY(scratch.get("grouped_qqmm", (size_t)(T * cK), &sl));
    QuantizeArgs qa{};
    qa.x = a.x;
    qa.data = compact_like(a.x, d, DType::U8, T, xrow);
    qa.scales = compact_like(a.x, sl, DType::U8, T, cK);
    qa.gs = a.gs_x;
    qa.q = q;
    qa.q.blocked = 0;
    QQ_TRY(quantize(c, qa, st));
    xd = d;
    xl = sl;
    x_pitch = xrow;
    xl_ld = cK;
  }
  uint8_t* xs = nullptr;
  QQ_TRY(scratch.get("grouped_qqmm", (size_t)(prows * c4), &xs));
  QQ_CUDA_TRY(cudaMemsetAsync(xs, 0, (size_t)(prows * c4), st), "grouped_qqmm");
  // w: packed data with blocked scales [E] x [R128, C4] (the caller's, swizzled, or quantized here)
  const uint8_t* wd = (const uint8_t*)a.w.ptr;
  const uint8_t* wsc = (const uint8_t*)a.w_scales.ptr;
  int64_t w_stride = a.w.nb ? a.w.bstride[0] : 0, w_pitch = a.w.ld, ws_stride = a.w_scales.nb ? a.w_scales.bstride[0] : 0;
  Mat wblk{};
  wblk.dt = DType::U8;
  wblk.device = a.w.device;
  wblk.nb = 1;
  wblk.bshape[0] = E;
  wblk.bstride[0] = R128 * c4;
  wblk.rows = R128;
  wblk.cols = c4;
  wblk.ld = c4;
  if (!a.w_packed || !a.w_blocked) {
    uint8_t* sb = nullptr;
    QQ_TRY(scratch.get("grouped_qqmm", (size_t)(E * R128 * c4), &sb));
    wblk.ptr = sb;
    wsc = sb;
    ws_stride = R128 * c4;
  }
  if (!a.w_packed) {
    uint8_t* d = nullptr;
    QQ_TRY(scratch.get("grouped_qqmm", (size_t)(E * N * xrow), &d));
    QuantizeArgs qa{};
    qa.x = a.w;
    qa.data = compact_like(a.w, d, DType::U8, N, xrow);
    qa.scales = wblk;
    qa.gs = a.gs_w;  // expert e's at gs_w[e * gw_stride]
    qa.gs_stride = gw_stride;
    qa.q = q;
    qa.q.blocked = 1;
    QQ_TRY(quantize(c, qa, st));
    wd = d;
    w_stride = N * xrow;
    w_pitch = xrow;
  } else if (!a.w_blocked) {
    QQ_TRY(swizzle(c, a.w_scales, wblk, true, st));
  }

  g.ends = ends;
  g.E = (int)E;
  g.T = T;
  g.N = N;
  g.K = K;
  g.c4 = c4;
  g.x = xd;
  g.x_pitch = x_pitch;
  g.x_ld = x_pitch * 8 / q.bits;
  g.xs = xs;
  g.w = wd;
  g.w_stride = w_stride;
  g.w_ld = w_pitch * 8 / q.bits;
  g.ws = wsc;
  g.ws_stride = ws_stride;
  g.out = (uint8_t*)a.out.ptr;
  g.out_pitch = a.out.ld * dtype_size(a.out.dt);
  g.out_ld = a.out.ld;
  g.gs_x = a.gs_x;
  g.gs_w = a.gs_w;
  g.gw_stride = (int)gw_stride;
  grouped_bs_args_kernel<<<1, 256, 0, st>>>(g);
  QQ_TRY(check_launch("grouped_qqmm"));
  if (T * cK > 0) {
    seg_swizzle_kernel<<<(unsigned)((T * cK + kThreads - 1) / kThreads), kThreads, 0, st>>>(
        xl, xl_ld, T, cK, ends, (int)E, g.pstart, g.bad, xs, c4);
    QQ_TRY(check_launch("grouped_qqmm"));
  }
  QQ_TRY(run_grouped_bs(c, lt, q, T / E * N, st, "grouped_qqmm"));
  const int64_t total = T * N;
  if (total > 0) {
    Mat o = a.out;
    nan_if_bad_kernel<<<(unsigned)((total + kThreads - 1) / kThreads), kThreads, 0, st>>>(g.bad, o, total);
    QQ_TRY(check_launch("grouped_qqmm"));
  }
  return routed(QQ_STATUS_SUCCESS, QQ_ROUTE_BLOCKSCALED);
#endif
}

}  // namespace

qqStatus_t grouped_qqmm(qqHandle_t h, const MatmulArgs& a, int64_t gw_stride, const int32_t* ends, int64_t E,
                        void* stream, bool* taken) {
  *taken = false;
  qqContext* c = nullptr;
  QQ_TRY(resolve_handle("grouped_qqmm", h, a.out.device, &c));
  // Blackwell: one grouped block-scaled GEMM where cuBLASLt takes the call; where it refuses,
  // the next route (Hopper under the force_blockscaled hook: the one below; Blackwell: the
  // caller's per-expert loop of block-scaled qqmm calls).
  if ((a.route == QQ_ROUTE_AUTO || a.route == QQ_ROUTE_BLOCKSCALED) && grouped_bs_arch(c->cc)) {
    const qqStatus_t s = on_device(c->device, [&]() {
      return grouped_qqmm_blockscaled(c, a, gw_stride, ends, E, (cudaStream_t)stream);
    });
    if (s != QQ_STATUS_NOT_SUPPORTED) {
      *taken = s == QQ_STATUS_SUCCESS;
      return s;
    }
  }
  if (!grouped_gemm_sm90_built()) return QQ_STATUS_SUCCESS;
  // Hopper's exact path: CUTLASS's sm90 grouped GEMM.
  if (c->cc / 10 != 9 || (a.route != QQ_ROUTE_AUTO && a.route != QQ_ROUTE_EXACT)) return QQ_STATUS_SUCCESS;
  const int64_t T = a.M, N = a.N, K = a.K;
  const bool w_bf16 = a.w_prepared && a.w.dt == DType::BF16;
  // CUTLASS's int shapes, TMA's 16-byte rows, a bf16 result.
  if (a.out.dt != DType::BF16 || a.x.nb != 0 || E > (1 << 30) || T >= (1ll << 31) || N >= (1ll << 31) ||
      K >= (1ll << 31) || K % 8 || N % 8 || !rows_aligned(a.out))
    return QQ_STATUS_SUCCESS;
  if (w_bf16 && !rows_aligned(a.w)) return QQ_STATUS_SUCCESS;
  // prepared experts given transposed (w.transpose(1, 2) of [E, N, K] values): bf16 ones are read as
  // stored by the transposed-B GEMM; other dtypes go to the per-expert loop
  if (a.w_trans && !w_bf16) return QQ_STATUS_SUCCESS;
  *taken = true;
  return on_device(c->device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    Scratch scratch(c, st);
    float* alpha = nullptr;
    if (a.gs_x || a.gs_w) {
      QQ_TRY(scratch.get("grouped_qqmm", (size_t)(E + 1) * sizeof(float), &alpha));
      alpha_kernel<<<(unsigned)((E + 1 + 127) / 128), 128, 0, st>>>(a.gs_x, a.gs_w, (int)gw_stride, (int)E, alpha);
      QQ_TRY(check_launch("grouped_qqmm"));
    }
    // q(x) for every token at once: x's blocks run along K, within a token.
    __nv_bfloat16 *xb = nullptr, *wb = nullptr;
    QQ_TRY(scratch.get("grouped_qqmm", (size_t)(T * K) * 2, &xb));
    QQ_TRY(operand_bf16(c, a.x, a.x_scales, a.x_packed, a.x_blocked, a.q, a.gs_x, T, K, xb, st));
    GroupedGemmSm90 g;
    g.A = xb;
    g.lda = K;
    g.ldb = K;
    g.b_stride = N * K;
    g.D = a.out.ptr;
    g.ldd = a.out.ld;
    g.ends = ends;
    g.alpha = alpha;
    g.E_all = (int)E;
    g.T = T;
    g.N = N;
    g.K = K;
    g.device = c->device;
    g.sm_count = sm_count(c->device);
    // Experts per grouped GEMM: all of them with bf16 weights, else as many as
    // kGroupedBf16WeightBytes holds once converted.
    const int64_t chunk = w_bf16 ? E : std::max<int64_t>(1, std::min<int64_t>(E, kGroupedBf16WeightBytes / (N * K * 2)));
    if (w_bf16) {
      wb = (__nv_bfloat16*)a.w.ptr;
      g.ldb = a.w.ld;  // (a.w_trans: a.w is the stored [K, N] matrix, ld its pitch)
      g.b_stride = a.w.nb ? a.w.bstride[0] : 0;
      g.b_trans = a.w_trans;
    } else {
      QQ_TRY(scratch.get("grouped_qqmm", (size_t)(chunk * N * K) * 2, &wb));
    }
    g.B = wb;
    g.E = (int)chunk;
    void* buf = nullptr;
    QQ_TRY(scratch.get("grouped_qqmm", grouped_gemm_sm90_scratch(g), &buf));
    for (int64_t e0 = 0; e0 < E; e0 += chunk) {
      const int64_t ne = std::min(chunk, E - e0);
      if (!w_bf16) {
        const Mat wc = batch_slice(a.w, e0, ne);
        const Mat sc = a.w_scales.ptr ? batch_slice(a.w_scales, e0, ne) : a.w_scales;
        QQ_TRY(weight_bf16(c, a, wc, sc, a.gs_w ? a.gs_w + e0 * gw_stride : nullptr, gw_stride, wb, st));
      }
      g.e0 = (int)e0;
      g.E = (int)ne;
      if (const char* why = grouped_gemm_sm90(g, buf, st))
        return set_error(QQ_STATUS_CUDA_ERROR, "grouped_qqmm: %s", why);
    }
    return routed(check_launch("grouped_qqmm"), QQ_ROUTE_EXACT);
  });
}

// ---------------------------------------------------------------------------
// grouped_qqmm_wgrad: out[e] = alpha * q(x_e)^T q(dy_e), blocks along the
// tokens of each expert
// ---------------------------------------------------------------------------
// Both operands go through the same two kernels: seg_plan_kernel turns the
// group ends into each expert's first 32-token block in a padded token space
// (expert e owns blocks [blk[e], blk[e+1]): its tokens, the last block
// zero-padded), and seg_qdq_kernel writes q(x)'s values transposed into it:
// xt [K, Tp] with Tp = 32 * (number of blocks). A block never crosses an
// expert (nvfp4's blocks of 16 sit two to a 32-token block), and every
// expert's tokens start on a 64-byte boundary, as TMA wants. Then one GEMM
// per expert, out[e] = xt[:, expert e] @ dyt[:, expert e]^T: one grouped GEMM
// on Hopper, else a loop after a host read of the ends.
namespace {

constexpr int kSegThreads = 1024;

// blk[0..E]: the exclusive prefix of ceil(n_e / 32); bad ends (as grouped_gemm.h
// defines them) give blk = 0 everywhere: no block is quantized, and the GEMM's
// own check fills out with NaN. One block. Blackwell's block-scaled route
// (grouped_wgrad_blockscaled) also takes sblk[0..E], the exclusive prefix of
// roundup(spb * nb_e, 4) (expert e's scale columns, spb a block, padded to the
// blocked layout's 4: where its scale tiles start), and *bad_out.
__global__ void __launch_bounds__(kSegThreads) seg_plan_kernel(const int32_t* ends, int E, int64_t T, int32_t* blk,
                                                               int32_t* sblk = nullptr, int spb = 0,
                                                               int* bad_out = nullptr) {
  using Scan = cub::BlockScan<int32_t, kSegThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int bad_s;
  if (threadIdx.x == 0) bad_s = 0;
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kSegThreads)
    if (group_end_bad(ends, e, E, T)) atomicOr(&bad_s, 1);
  __syncthreads();
  const bool bad = bad_s;
  int32_t carry = 0, scarry = 0;
  for (int base = 0; base < E; base += kSegThreads) {
    const int e = base + threadIdx.x;
    const int32_t n = (e < E && !bad) ? wgrad_span<int32_t>(ends[e] - (e ? ends[e - 1] : 0)) / 32 : 0;
    int32_t off, total;
    Scan(tmp).ExclusiveSum(n, off, total);
    if (e < E) blk[e] = carry + off;
    carry += total;
    __syncthreads();  // tmp is reused by the next chunk's scan
    if (sblk) {
      Scan(tmp).ExclusiveSum((n * spb + 3) / 4 * 4, off, total);
      if (e < E) sblk[e] = scarry + off;
      scarry += total;
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) {
    blk[E] = carry;
    if (sblk) sblk[E] = scarry;
    if (bad_out) *bad_out = bad;
  }
}

// Tile (jt, c0): the 4 padded token blocks j0 = 4 jt .. j0+3 (block j of expert
// e: blk[e] <= j < blk[e+1]; the 4 may belong to different experts, their
// places in xt are contiguous anyway) x 64 columns c0 ... The 128 x 64 tile is
// read row-wise into shared memory (16-byte loads, a warp reads 4 rows of 128
// bytes, when kVec: rows aligned and 8 | cols), zero past each expert's last
// token and for blocks past the last; each thread then quantizes one column of
// one block (its 32 values, in groups of G along the tokens) and puts the bf16
// values back into shared memory, from where rows of 128 values (256 bytes)
// are stored at xt[c, 32 j0].
// A block of threads takes the token tiles jt = blockIdx.x + n gridDim.x, n <
// kSegTilesPerCta, of its 64 columns in turn, and (kVec) loads tile n + 1's raw
// bytes into registers before it quantizes and stores tile n, so that its loads
// are in flight during its compute and stores (with a tile a block the loads
// waited alone, the H200 at ~0.62 of copy: moe_qdq_kernel's lesson, 2b70705).
// The element-wise kernel (unaligned rows, 8 not dividing cols: a fallback) keeps a
// tile a block: in a loop the compiler holds its run-time format's constants across
// tiles, 80 registers and spills where one tile needs 48-64.
constexpr int kSegCols = 64, kSegBlocks = 4, kSegRows = 32 * kSegBlocks;
constexpr int kSegPitch = kSegCols + 4;       // floats per tile row: 16-byte aligned, column reads conflict-free
constexpr int kSegOutPitch = kSegRows + 8;    // bf16 per output row: 16-byte aligned
static_assert(kSegCols * kSegBlocks == kThreads, "one column of one block per thread");
static_assert(kSegCols * kSegOutPitch * 2 <= kSegRows * kSegPitch * 4, "the output tile reuses the input tile");
static_assert(kSegRows * kSegCols / 8 == kSegBlocks * kThreads, "kVec: a 16-byte row piece of each block per thread");
// Tiles a block takes at most (kVec): 4 amortizes a block's first load (the one not
// overlapped by its own work) and its expert look-ups over 4 tiles, and still
// leaves several waves at the MoE step's sizes (T = 16384, E = 32: 136 token
// tiles, 34 blocks a column tile; N = 2048's 32 column tiles give 1088 blocks,
// ~2.7 waves of 396) where 8 would leave 1.4 (a tail of a third of a wave).
// Small inputs take fewer a block (launch_seg_qdq_t) so that the grid still fills
// the GPU.
constexpr int kSegTilesPerCta = 4;
// Blocks an SM: 24 warps at <= 80 registers (the prefetched bytes live through
// the quantization), as moe_qdq_kernel (f77ff5c: 0.73 -> 0.79 of copy there); fp32
// input, whose prefetch is twice the registers (32), at 16 warps and <= 128
// registers instead of spilling at 80 (still more bytes in flight an SM: 64 KB to 48).
// The element-wise kernel: 0, no minimum (__launch_bounds__(kThreads) as before).
template <typename T> constexpr int seg_ctas_per_sm() { return sizeof(T) == 4 ? 2 : 3; }

__device__ __forceinline__ int seg_expert(const int32_t* blk, int E, int64_t j) {
  int lo = 0, hi = E - 1;  // the last e with blk[e] <= j (empty experts share their successor's blk)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (blk[mid] <= j) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// kCodes (Blackwell's block-scaled route, grouped_wgrad_blockscaled): the same tiles and
// blocks, but the codes and scale bytes are written in place of q(x)'s values - codes
// [cols, tp] at `codes` (row pitch tp * bits / 8 bytes: 32-token blocks are whole
// 16-byte pieces in both formats), and the scales of expert e's blocks in blocked tiles
// of their own, [r128, c4_e] at scales + r128 * sblk[e] (c4_e = sblk[e + 1] - sblk[e];
// the caller zeroed the buffer for the padding). The codes are the ones whose values
// the kCodes = false form writes (one rule: fp_group_scale, then each pair's encoder).
struct SegCodes {
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  const int32_t* sblk = nullptr;
  int64_t r128 = 0;  // roundup(cols, 128): the scale tiles' rows
};
constexpr int kSegCodePitch = kSegRows + 16;  // bytes per staged code row (fp8's 128 + 16: 16-byte aligned)
static_assert(kSegCols * kSegCodePitch <= kSegRows * kSegPitch * 4, "the code tile reuses the input tile");

template <typename T, int G, bool kVec, int kElem, bool kCodes = false>
__global__ void __launch_bounds__(kThreads, kVec ? seg_ctas_per_sm<T>() : 0)
    seg_qdq_kernel(Mat x, const int32_t* ends, const int32_t* blk, int E, QSpec q, const float* gs,
                   __nv_bfloat16* xt, int64_t tp, SegCodes sc) {
  constexpr int kU4 = sizeof(T) / 2;                        // uint4s per 8 elements
  constexpr int kTiles = kVec ? kSegTilesPerCta : 1;         // tiles of a block at most
  __shared__ __align__(16) float tile[kSegRows * kSegPitch];
  // the first token and the end of block k of tile n at [n * kSegBlocks + k]
  __shared__ int64_t tok0_s[kTiles * kSegBlocks], end_s[kTiles * kSegBlocks];
  __shared__ int exp_s[kCodes ? kTiles * kSegBlocks : 1];  // kCodes: the block's expert (-1: none)
  // token tiles holding a block (4 jt < nblk); the later ones (tp is the host's
  // bound on nblk) are not touched, as before
  const int64_t nblk = blk[E], ntt = (nblk + kSegBlocks - 1) / kSegBlocks;
  const int64_t jt0 = blockIdx.x, step = gridDim.x;
  if (jt0 >= ntt) return;  // the whole block
  const int64_t left = (ntt - jt0 + step - 1) / step;  // tiles of this block (the launch makes it <= kTiles)
  const int nt = (kTiles == 1 || left >= kTiles) ? kTiles : (int)left;  // (left >= 1)
  if (threadIdx.x < nt * kSegBlocks) {
    const int64_t j = (jt0 + (threadIdx.x / kSegBlocks) * step) * kSegBlocks + threadIdx.x % kSegBlocks;
    int64_t t0 = 0, t1 = 0;  // no tokens: past the last block
    int ex = -1;
    if (j < nblk) {
      const int e = seg_expert(blk, E, j);
      t0 = (e ? ends[e - 1] : 0) + (j - blk[e]) * 32;
      t1 = ends[e];
      ex = e;
    }
    tok0_s[threadIdx.x] = t0;
    end_s[threadIdx.x] = t1;
    if constexpr (kCodes) exp_s[threadIdx.x] = ex;
  }
  __syncthreads();
  const int64_t c0 = (int64_t)blockIdx.y * kSegCols;
  // kVec: this thread's 16-byte row piece of each block k: row lr, columns lc .. lc+7
  // (chunk id = threadIdx.x + k kThreads of the tile: row id / 8 = 32 k + lr)
  const int lr = threadIdx.x / (kSegCols / 8), lc = (threadIdx.x % (kSegCols / 8)) * 8;
  uint4 raw[kSegBlocks][kU4];  // tile n + 1's bytes (zero where nothing is read: +0.0 in any T)
  auto fetch = [&](int n) {
#pragma unroll
    for (int k = 0; k < kSegBlocks; ++k) {
      const int64_t tok = tok0_s[n * kSegBlocks + k] + lr;
      const bool ok = tok < end_s[n * kSegBlocks + k] && c0 + lc < x.cols;
      const uint4* src = reinterpret_cast<const uint4*>(x.at<T>(0, ok ? tok : 0) + c0 + lc);
#pragma unroll
      for (int i = 0; i < kU4; ++i) raw[k][i] = ok ? __ldg(src + i) : make_uint4(0, 0, 0, 0);
    }
  };
  if constexpr (kVec) fetch(0);
  const int cc = threadIdx.x % kSegCols, b = threadIdx.x / kSegCols;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(tile);
  for (int n = 0; n < nt; ++n) {
    const int64_t j0 = (jt0 + n * step) * kSegBlocks;
    if (n) __syncthreads();  // the last tile's stores have read the output tile
    if constexpr (kVec) {
#pragma unroll
      for (int k = 0; k < kSegBlocks; ++k) {
        float v[8];
        if constexpr (kU4 == 1) {
          unpack8<T>(raw[k][0], v);
        } else {
          const float* f = reinterpret_cast<const float*>(raw[k]);
#pragma unroll
          for (int i = 0; i < 8; ++i) v[i] = f[i];
        }
        float4* d = reinterpret_cast<float4*>(tile + (32 * k + lr) * kSegPitch + lc);
        d[0] = make_float4(v[0], v[1], v[2], v[3]);
        d[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    } else {
      for (int id = threadIdx.x; id < kSegRows * kSegCols; id += kThreads) {
        const int r = id / kSegCols, cl = id % kSegCols, k = n * kSegBlocks + r / 32;
        const int64_t tok = tok0_s[k] + r % 32, c = c0 + cl;
        tile[r * kSegPitch + cl] = (tok < end_s[k] && c < x.cols) ? load1<T>(x.at<T>(0, tok) + c) : 0.0f;
      }
    }
    __syncthreads();
    if constexpr (kVec) {
      if (n + 1 < nt) fetch(n + 1);  // in flight while this tile is quantized and stored
    }
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = tile[(b * 32 + i) * kSegPitch + cc];
    const float enc = (G == 16 && gs) ? nvfp4_enc(*gs) : 1.0f;
    if constexpr (kCodes) {
      // this thread's column of one block: 32 codes (fp8: 8 words; fp4: the first 4) and
      // 32 / G scale bytes, as qdq_scaled's values encode them
      const int elem = kElem >= 0 ? kElem : q.elem;
      const bool fp4 = G == 16 || elem == ELEM_E2M1;
      uint32_t w[8];
      uint8_t sbyte[32 / G];
#pragma unroll
      for (int g = 0; g < 32; g += G) {
        const FpGroupScale gsc = fp_group_scale(u2f(abs_bits_max<G>(v + g)), G == 16, enc, elem, q.floor_rounding);
        sbyte[g / G] = gsc.code;
        const float f = gsc.factor;
#pragma unroll
        for (int i = 0; i < G; i += 8) {
          float y[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) y[k] = v[g + i + k] * f;
          if (fp4) {
            w[(g + i) / 8] = e2m1x8_code(y, gsc.nan_group);
          } else {
            w[(g + i) / 4] = fp8x2_code(elem, y[0], y[1], gsc.nan_group) | fp8x2_code(elem, y[2], y[3], gsc.nan_group) << 16;
            w[(g + i) / 4 + 1] = fp8x2_code(elem, y[4], y[5], gsc.nan_group) | fp8x2_code(elem, y[6], y[7], gsc.nan_group) << 16;
          }
        }
      }
      __syncthreads();  // the input tile is read: its memory now holds the code tile
      uint8_t* outc = reinterpret_cast<uint8_t*>(tile);
      const int bb = fp4 ? 16 : 32;  // code bytes of a block
      uint4* d = reinterpret_cast<uint4*>(outc + cc * kSegCodePitch + b * bb);
      d[0] = make_uint4(w[0], w[1], w[2], w[3]);
      if (!fp4) d[1] = make_uint4(w[4], w[5], w[6], w[7]);
      // the scale bytes, straight to expert e's tiles (1/16 or 1/32 of the bytes)
      const int e = exp_s[n * kSegBlocks + b];
      const int64_t col = c0 + cc;
      if (e >= 0 && col < x.cols) {
        const int64_t c4e = sc.sblk[e + 1] - sc.sblk[e], s0 = (j0 + b - blk[e]) * (32 / G);
        uint8_t* se = sc.scales + sc.r128 * sc.sblk[e];
#pragma unroll
        for (int k = 0; k < 32 / G; ++k) se[blocked_offset(col, s0 + k, c4e)] = sbyte[k];
      }
      __syncthreads();
      // rows of up to kSegRows codes (64 or 128 bytes) in 16-byte pieces; blocks past the
      // last are not stored (codes end at tp)
      const int64_t cols_left = tp - j0 * 32, nrow = cols_left < kSegRows ? cols_left : kSegRows;
      const int64_t pitch = tp * (fp4 ? 4 : 8) / 8, nbytes = nrow * (fp4 ? 4 : 8) / 8;
      const int per_row = kSegRows * (fp4 ? 4 : 8) / 8 / 16;
      for (int id = threadIdx.x; id < kSegCols * per_row; id += kThreads) {
        const int r = id / per_row, k16 = (id % per_row) * 16;
        const int64_t c = c0 + r;
        if (c < x.cols && k16 < nbytes)
          *reinterpret_cast<uint4*>(sc.codes + c * pitch + j0 * 32 * (fp4 ? 4 : 8) / 8 + k16) =
              *reinterpret_cast<const uint4*>(outc + r * kSegCodePitch + k16);
      }
    } else {
#pragma unroll
      for (int g = 0; g < 32; g += G) qdq_group<G, kElem>(v + g, q, enc, nullptr);
      __syncthreads();  // the input tile is read: its memory now holds the output tile
#pragma unroll
      for (int i = 0; i < 32; i += 8)  // bf16 values already: one conversion a pair rounds nothing
        *reinterpret_cast<uint4*>(out + cc * kSegOutPitch + b * 32 + i) = bf16x8_bits(v + i);
      __syncthreads();
      // Rows of kSegRows values: 16 threads per row, 16 bytes each; blocks past
      // the last are not stored (xt ends at tp).
      const int64_t cols_left = tp - j0 * 32, nrow = cols_left < kSegRows ? cols_left : kSegRows;
      for (int id = threadIdx.x; id < kSegCols * (kSegRows / 8); id += kThreads) {
        const int r = id / (kSegRows / 8), k8 = (id % (kSegRows / 8)) * 8;
        const int64_t c = c0 + r;
        if (c < x.cols && k8 < nrow)
          *reinterpret_cast<uint4*>(xt + c * tp + j0 * 32 + k8) =
              *reinterpret_cast<const uint4*>(out + r * kSegOutPitch + k8);
      }
    }
  }
}

// The compile-time form of a token-wise qdq kernel (seg_qdq_kernel, colqdq_kernel) for
// this call: f(G, kVec, kElem) with integral constants - the vector kernel per element
// format (no branch a pair), the element-wise one with the format read at run time (-1).
template <typename F>
void qdq_form(const QSpec& q, bool vec, F&& f) {
  using std::integral_constant;
  if (!vec && q.group == 16) f(integral_constant<int, 16>{}, std::false_type{}, integral_constant<int, -1>{});
  else if (!vec) f(integral_constant<int, 32>{}, std::false_type{}, integral_constant<int, -1>{});
  else if (q.group == 16) f(integral_constant<int, 16>{}, std::true_type{}, integral_constant<int, ELEM_E2M1>{});
  else if (q.elem == ELEM_E2M1) f(integral_constant<int, 32>{}, std::true_type{}, integral_constant<int, ELEM_E2M1>{});
  else if (q.elem == ELEM_E4M3) f(integral_constant<int, 32>{}, std::true_type{}, integral_constant<int, ELEM_E4M3>{});
  else f(integral_constant<int, 32>{}, std::true_type{}, integral_constant<int, ELEM_E5M2>{});
}

template <typename T>
qqStatus_t launch_seg_qdq_t(const Mat& x, const int32_t* ends, const int32_t* blk, int E, const QSpec& q,
                            const float* gs, __nv_bfloat16* xt, int64_t tp, cudaStream_t st, const SegCodes* sc) {
  // Token tiles tp / 128 (rounded up; the kernel skips those past blk[E]) over grid.x blocks,
  // each taking every grid.x-th: at most kSegTilesPerCta a block (kVec; the element-wise
  // kernel one), fewer where that would leave less than a full wave of blocks
  // (seg_ctas_per_sm on every SM). The kernel's tiles must number <= its kTiles.
  const bool vec = rows_aligned(x) && x.cols % 8 == 0;
  const int64_t ntt = (tp / 32 + kSegBlocks - 1) / kSegBlocks, ncol = (x.cols + kSegCols - 1) / kSegCols;
  int64_t gx = ntt;
  if (vec) {
    const int64_t wave = (int64_t)seg_ctas_per_sm<T>() * sm_count(x.device);
    gx = std::max((ntt + kSegTilesPerCta - 1) / kSegTilesPerCta, std::min(ntt, (wave + ncol - 1) / ncol));
  }
  const dim3 grid((unsigned)std::max<int64_t>(1, gx), (unsigned)ncol);
  qdq_form(q, vec, [&](auto G, auto kVec, auto kElem) {
    // the codes form only for the formats its one caller takes (nvfp4, mxfp8 e4m3): fewer kernels to build
    constexpr bool kCodeForm = G == 16 || (kElem != ELEM_E2M1 && kElem != ELEM_E5M2);
    if constexpr (kCodeForm) {
      if (sc) {
        seg_qdq_kernel<T, G, kVec, kElem, true><<<grid, kThreads, 0, st>>>(x, ends, blk, E, q, gs, xt, tp, *sc);
        return;
      }
    }
    seg_qdq_kernel<T, G, kVec, kElem><<<grid, kThreads, 0, st>>>(x, ends, blk, E, q, gs, xt, tp, SegCodes{});
  });
  return check_launch("grouped_qqmm_wgrad");
}

// q(x)'s values into xt [cols, tp] bf16, or (sc) its codes and scales as SegCodes says.
qqStatus_t seg_qdq(const Mat& x, const int32_t* ends, const int32_t* blk, int E, const QSpec& q, const float* gs,
                   __nv_bfloat16* xt, int64_t tp, cudaStream_t st, const SegCodes* sc = nullptr) {
  if (sc && q.mode != QQ_MODE_NVFP4 && !(q.mode == QQ_MODE_MXFP8 && q.elem == ELEM_E4M3))
    return set_error(QQ_STATUS_INTERNAL_ERROR, "grouped_qqmm_wgrad: no code form of the token-wise quantizer for "
                     "this mode (a bug in libqq: please report it)");
  switch (x.dt) {
    case DType::F32: return launch_seg_qdq_t<float>(x, ends, blk, E, q, gs, xt, tp, st, sc);
    case DType::F16: return launch_seg_qdq_t<__half>(x, ends, blk, E, q, gs, xt, tp, st, sc);
    default: return launch_seg_qdq_t<__nv_bfloat16>(x, ends, blk, E, q, gs, xt, tp, st, sc);
  }
}

// One expert (a dense weight gradient): q(x)'s values
// along the tokens are written in x's own orientation, xq [T, C] bf16 compact,
// and the GEMM reads them transposed (cuBLASLt's op T) - no transpose here, no
// per-expert padding, no shared memory; a ragged last block counts its
// missing rows as zeros, as the general path's padding does. The end is read
// on the device: one other than T makes every value NaN, as the grouped
// GEMM's check makes the result. A thread owns 8 bytes of columns of one
// 32-row block: all 32 loads in flight before the first group is reduced,
// whole 256-byte row pieces per warp load and store.
// Columns 2p and 2p + 1 of an 8-byte row piece as floats (p = 0 only for fp32,
// whose piece holds two columns): 16-bit formats in the word's low, high half.
template <typename T> __device__ __forceinline__ void unpack2(const uint2& r, int p, float& a, float& b);
template <> __device__ __forceinline__ void unpack2<float>(const uint2& r, int, float& a, float& b) {
  a = u2f(r.x);
  b = u2f(r.y);
}
template <> __device__ __forceinline__ void unpack2<__nv_bfloat16>(const uint2& r, int p, float& a, float& b) {
  const uint32_t w = p ? r.y : r.x;
  a = u2f(w << 16);
  b = u2f(w & 0xffff0000u);
}
template <> __device__ __forceinline__ void unpack2<__half>(const uint2& r, int p, float& a, float& b) {
  const uint32_t w = p ? r.y : r.x;
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
  a = f.x;
  b = f.y;
}

// kRows (vector forms only; x.cols a multiple of G): q(x)'s values along the
// rows too, into rows_out [rows, cols] compact, from the same registers
// (qqQuantizeDequantize with both outputs: one read of x instead of two). A
// row group's G columns lie on G / C lanes; computing its scale on each of them
// (an amax exchange per row) made the kernel 1.9x slower than the two passes
// for nvfp4 (H100), so the groups are regrouped through shared memory.
template <typename T, int G, bool kVec, int kElem, bool kRows = false>
__global__ void __launch_bounds__(kThreads)
    colqdq_kernel(Mat x, const int32_t* end_p, QSpec q, const float* gs, __nv_bfloat16* out,
                  __nv_bfloat16* rows_out = nullptr) {
  constexpr int C = 8 / sizeof(T);  // columns per thread: 4 of a 16-bit input, 2 of fp32
  constexpr int EB = 8 * sizeof(T);
  static_assert(!kRows || kVec, "the row-wise values need whole 8-byte row pieces");
  const int64_t r0 = (int64_t)blockIdx.x * 32;
  const int64_t c0 = ((int64_t)blockIdx.y * kThreads + threadIdx.x) * C;
  const bool in = c0 < x.cols;
  if (!kRows && !in) return;  // (kRows: every lane of a warp takes part in the exchanges)
  const bool bad = end_p && group_end_bad(end_p, 0, 1, x.rows);
  const int64_t rows = x.rows - r0 < 32 ? x.rows - r0 : 32, live = (bad || !in) ? 0 : rows;  // rows read
  uint2 raw[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    raw[i] = make_uint2(0u, 0u);
    if (i < live) {
      const T* p = x.at<T>(0, r0 + i) + c0;
      if (kVec) {
        raw[i] = ld_stream8(p);
      } else {
#pragma unroll
        for (int c = 0; c < C; ++c) {
          if (c0 + c < x.cols) {
            const uint32_t b = EB == 16 ? (uint32_t)*reinterpret_cast<const uint16_t*>(p + c)
                                        : *reinterpret_cast<const uint32_t*>(p + c);
            const int bit = (c * EB) % 32;
            if (c * EB < 32) raw[i].x |= b << bit;
            else raw[i].y |= b << bit;
          }
        }
      }
    }
  }
  const float enc = (G == 16 && gs) ? nvfp4_enc(*gs) : 1.0f;
  if constexpr (kRows) {
    // The row groups through shared memory, 16 rows at a time: the warp's 8-byte pieces
    // go in as they were read, each lane then takes whole groups (G consecutive values of
    // one row: one scale computation per group, as qdq_kernel's), writes their bf16 values
    // back in place (an fp32 piece's 2 values into its first 4 bytes), and the pieces go
    // out as they came in - whole 256-byte row pieces per warp store. Row pitch 34 pieces:
    // the 8 lanes of a 16-byte access phase read 8 rows of one group, on distinct banks.
    constexpr int L = G / C;         // pieces per row group
    constexpr int GPR = 32 / L;      // row groups per warp row
    constexpr int kPitch = 34;       // uint2 pieces per tile row
    __shared__ __align__(16) uint2 tile[kThreads / 32][16][kPitch];
    const int lane = threadIdx.x & 31;
    uint2 (*t)[kPitch] = tile[threadIdx.x >> 5];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 16; ++i) t[i][lane] = raw[16 * h + i];
      __syncwarp();
#pragma unroll
      for (int k = 0; k < GPR / 2; ++k) {
        const int idx = k * 32 + lane, row = idx % 8 + 8 * (idx / (8 * GPR)), g = (idx / 8) % GPR;
        const T* src = reinterpret_cast<const T*>(&t[row][g * L]);
        float v[G];
#pragma unroll
        for (int i = 0; i < G; i += 8) load8_generic<T>(src + i, v + i);
        qdq_group<G, kElem>(v, q, enc, nullptr);
        if constexpr (C == 4) {
#pragma unroll
          for (int i = 0; i < G; i += 8)
            *reinterpret_cast<uint4*>(reinterpret_cast<__nv_bfloat16*>(&t[row][g * L]) + i) = bf16x8_bits(v + i);
        } else {
#pragma unroll
          for (int i = 0; i < G; i += 2) t[row][g * L + i / 2].x = bf16x2_bits(v[i], v[i + 1]);
        }
      }
      __syncwarp();
      if (in) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          if (16 * h + i >= rows) break;
          __nv_bfloat16* d = rows_out + (r0 + 16 * h + i) * x.cols + c0;
          if (C == 4) *reinterpret_cast<uint2*>(d) = t[i][lane];
          else *reinterpret_cast<uint32_t*>(d) = t[i][lane].x;
        }
      }
      __syncwarp();
    }
    if (!in) return;
  }
  uint32_t o[32][C / 2];  // bf16 pairs of columns (2p, 2p + 1), per row
#pragma unroll
  for (int p = 0; p < C / 2; ++p) {
    float v0[32], v1[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) unpack2<T>(raw[i], p, v0[i], v1[i]);
#pragma unroll
    for (int g = 0; g < 32; g += G) {
      qdq_group<G, kElem>(v0 + g, q, enc, nullptr);
      qdq_group<G, kElem>(v1 + g, q, enc, nullptr);
    }
    // bf16 values already (docs/formats.md's range caveat aside): one
    // conversion instruction a pair, which rounds nothing
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const uint32_t w = bf16x2_bits(v0[i], v1[i]);
      o[i][p] = bad ? 0x7fc07fc0u : w;
    }
  }
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    if (i >= rows) break;
    __nv_bfloat16* d = out + (r0 + i) * x.cols + c0;
    if (kVec) {
      if (C == 4) *reinterpret_cast<uint2*>(d) = make_uint2(o[i][0], o[i][C / 2 - 1]);
      else *reinterpret_cast<uint32_t*>(d) = o[i][0];
    } else {
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (c0 + c < x.cols) reinterpret_cast<uint16_t*>(d)[c] = (uint16_t)(o[i][c / 2] >> (16 * (c % 2)));
    }
  }
}

// rows_out (quantize_dequantize, end == nullptr): the row-wise values too - from
// the same read for the fp8 elements where x's rows are whole 8-byte pieces,
// else by qdq_kernel after.
template <typename T>
qqStatus_t launch_colqdq_t(const Mat& x, const int32_t* end, const QSpec& q, const float* gs, __nv_bfloat16* out,
                           __nv_bfloat16* rows_out, const char* op, cudaStream_t st) {
  constexpr int C = 8 / sizeof(T);
  const dim3 grid((unsigned)((x.rows + 31) / 32), (unsigned)((x.cols + (int64_t)kThreads * C - 1) / (kThreads * C)));
  const bool vec = x.cols % C == 0 && x.ld % C == 0 && (uintptr_t)x.ptr % 8 == 0;
  // The fused form for the fp8 elements only: with E2M1's software encoder the one
  // kernel (2 CTAs an SM at 128 registers) ran 1.6x slower than the two passes
  // (nvfp4, 16384 x 4096 bf16, H100: 369 us against 124 + 112); mxfp8 148 against 192.
  bool fused = false;
  qdq_form(q, vec, [&](auto G, auto kVec, auto kElem) {
    if constexpr (decltype(kVec)::value && decltype(kElem)::value != ELEM_E2M1) {
      if (rows_out) {
        colqdq_kernel<T, G, true, kElem, true><<<grid, kThreads, 0, st>>>(x, end, q, gs, out, rows_out);
        fused = true;
        return;
      }
    }
    colqdq_kernel<T, G, kVec, kElem><<<grid, kThreads, 0, st>>>(x, end, q, gs, out);
  });
  QQ_TRY(check_launch(op));
  if (rows_out && !fused) return qdq<__nv_bfloat16>(x, q, gs, nullptr, rows_out, st);
  return QQ_STATUS_SUCCESS;
}

qqStatus_t colqdq(const Mat& x, const int32_t* end, const QSpec& q, const float* gs, __nv_bfloat16* out,
                  cudaStream_t st, __nv_bfloat16* rows_out = nullptr, const char* op = "grouped_qqmm_wgrad") {
  switch (x.dt) {
    case DType::F32: return launch_colqdq_t<float>(x, end, q, gs, out, rows_out, op, st);
    case DType::F16: return launch_colqdq_t<__half>(x, end, q, gs, out, rows_out, op, st);
    default: return launch_colqdq_t<__nv_bfloat16>(x, end, q, gs, out, rows_out, op, st);
  }
}

// MoE expert weights w [E, D1, D2] as q's bf16 values with one UE8M0 scale per
// 32x32 tile (qqQuantizeMoe's QQ_MOE_32X32 rule: the values are dequantize of its
// codes) - what the grouped GEMMs read on the exact path, both orientations from
// one read. A warp per tile; lane (rq, cq) = (lane / 4, lane % 4) holds columns
// 8cq..8cq+7 of rows rq + 8k, so every load and the out store cover whole 64-byte
// row pieces from consecutive lanes (a row per lane, the first version, wrote
// half sectors per instruction: 0.43 of copy). The tile amax is a warp max; out_t
// [E, D2, D1] goes through shared memory (pitch 34 halfwords, kT only), 8 rows of a
// column per lane.
// Each warp takes kMoeTilesPerWarp tiles in turn and loads the next tile's raw bytes
// before it works on the current one: with a tile a warp (and the warp gone after it)
// the loads waited alone. H200, E = 32 experts' two weights of bench_moe (3.2 GB read and
// written): 1476 us (one tile a warp, 64 registers, 32 warps an SM) -> 1050 (eight in turn,
// 96 registers, 16 warps) -> 965 (the same at 80 registers, 24 warps), 0.79 of copy
// (bench/results/moe-h200-notes.md).
constexpr int kMoeTilesPerWarp = 8;

template <typename T, int kElem, bool kT>
__global__ void __launch_bounds__(kThreads, 3)  // 24 warps an SM (80 registers, a few bytes spilled)
    moe_qdq_kernel(Mat w, QSpec q, __nv_bfloat16* out, __nv_bfloat16* out_t, bool vec) {
  constexpr int kPitch = 34, kU4 = sizeof(T) / 2;  // uint4s a lane loads per 8 elements
  __shared__ __align__(16) uint16_t tile[kT ? kThreads / 32 : 1][32][kPitch];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, rq = lane >> 2, cq = lane & 3;
  const int64_t tc = w.cols / 32, ntiles = (w.rows / 32) * tc, b = blockIdx.y;
  const int64_t step = (int64_t)gridDim.x * (kThreads / 32);
  int64_t t = (int64_t)blockIdx.x * (kThreads / 32) + warp;
  if (t >= ntiles) return;  // the whole warp
  uint4 raw[4][kU4];
  auto fetch = [&](int64_t tt) {  // tile tt's bytes of this lane (vec: 16-byte aligned rows)
    const int64_t r0 = (tt / tc) * 32, c0 = (tt % tc) * 32 + cq * 8;
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int j = 0; j < kU4; ++j) raw[k][j] = __ldg(reinterpret_cast<const uint4*>(w.at<T>(b, r0 + rq + 8 * k) + c0) + j);
  };
  if (vec) fetch(t);
  for (; t < ntiles; t += step) {
    const int64_t r0 = (t / tc) * 32, c0 = (t % tc) * 32 + cq * 8;
    float v[32];
    if (vec) {  // (a uniform branch: one kernel for aligned and unaligned rows)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (kU4 == 1) {
          unpack8<T>(raw[k][0], v + 8 * k);
        } else {
          const float* f = reinterpret_cast<const float*>(raw[k]);
#pragma unroll
          for (int i = 0; i < 8; ++i) v[8 * k + i] = f[i];
        }
      }
      if (t + step < ntiles) fetch(t + step);  // in flight while this tile is worked on
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const T* src = w.at<T>(b, r0 + rq + 8 * k) + c0;
#pragma unroll
        for (int i = 0; i < 8; ++i) v[8 * k + i] = load1<T>(src + i);
      }
    }
    uint32_t ab = abs_bits_max<32>(v);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) ab = max(ab, __shfl_xor_sync(0xffffffffu, ab, o));  // the tile's amax
    qdq_scaled<32, 32, kElem>(v, ab, q, 1.0f, nullptr);  // one scale for the whole tile
    if (out) {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        *reinterpret_cast<uint4*>(out + (b * w.rows + r0 + rq + 8 * k) * w.cols + c0) = bf16x8_bits(v + 8 * k);
    }
    if constexpr (kT) {
      uint16_t(*tl)[kPitch] = tile[warp];
      __syncwarp();  // (the previous tile's reads of tl are done)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t* d = reinterpret_cast<uint32_t*>(&tl[rq + 8 * k][cq * 8]);
#pragma unroll
        for (int i = 0; i < 8; i += 2) d[i / 2] = bf16x2_bits(v[8 * k + i], v[8 * k + i + 1]);
      }
      __syncwarp();
      // out_t row c0' + c (tile column c = rq + 8k), its rows 8cq..8cq+7 of the tile
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int c = rq + 8 * k;
        uint32_t p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          p[i] = (uint32_t)tl[cq * 8 + 2 * i][c] | ((uint32_t)tl[cq * 8 + 2 * i + 1][c] << 16);
        *reinterpret_cast<uint4*>(out_t + (b * w.cols + (c0 - cq * 8) + c) * w.rows + r0 + cq * 8) =
            make_uint4(p[0], p[1], p[2], p[3]);
      }
    }
  }
}

template <typename T>
qqStatus_t launch_moe_qdq_t(const QdqArgs& a, cudaStream_t st) {
  const Mat& w = a.x;
  const int64_t tiles = (w.rows / 32) * (w.cols / 32), per_block = (kThreads / 32) * kMoeTilesPerWarp;
  const dim3 grid((unsigned)std::max<int64_t>(1, (tiles + per_block - 1) / per_block), (unsigned)w.batch());
  __nv_bfloat16 *o = (__nv_bfloat16*)a.out.ptr, *ot = (__nv_bfloat16*)a.out_t.ptr;
  const bool vec = rows_aligned(w);
  auto go = [&](auto kElem, auto kT) {
    moe_qdq_kernel<T, decltype(kElem)::value, decltype(kT)::value><<<grid, kThreads, 0, st>>>(w, a.q, o, ot, vec);
  };
  using E4 = std::integral_constant<int, ELEM_E4M3>;
  using E5 = std::integral_constant<int, ELEM_E5M2>;
  if (a.q.elem == ELEM_E4M3) ot ? go(E4{}, std::true_type{}) : go(E4{}, std::false_type{});
  else ot ? go(E5{}, std::true_type{}) : go(E5{}, std::false_type{});
  return check_launch("quantize_dequantize_moe");
}

qqStatus_t moe_qdq(const QdqArgs& a, cudaStream_t st) {
  switch (a.x.dt) {
    case DType::F32: return launch_moe_qdq_t<float>(a, st);
    case DType::F16: return launch_moe_qdq_t<__half>(a, st);
    default: return launch_moe_qdq_t<__nv_bfloat16>(a, st);
  }
}

// grouped_qqmm_wgrad with E = 1: out [K, N] = xq^T @ dyq (colqdq above), one
// cuBLASLt GEMM with x's values read transposed.
qqStatus_t dense_wgrad(qqContext* c, const WgradArgs& a, cudaStream_t st) {
  const int64_t T = a.T, K = a.K, N = a.N;
  if (T == 0) {  // no tokens: zeros (out is compact)
    QQ_CUDA_TRY(cudaMemsetAsync(a.out.ptr, 0, (size_t)(K * N * dtype_size(a.out.dt)), st), "grouped_qqmm_wgrad");
    return QQ_STATUS_SUCCESS;
  }
  Scratch scratch(c, st);
  __nv_bfloat16 *xq = nullptr, *dyq = nullptr;
  float* alpha = nullptr;
  QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(T * K) * 2, &xq));
  QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(T * N) * 2, &dyq));
  QQ_TRY(colqdq(a.x, a.ends, a.q, a.gs_x, xq, st));
  QQ_TRY(colqdq(a.dy, a.ends, a.q, a.gs_dy, dyq, st));
  QQ_TRY(alpha_pair("grouped_qqmm_wgrad", a.gs_x, a.gs_dy, scratch, st, &alpha));
  Gemm g;
  g.M = K;
  g.N = N;
  g.K = T;
  g.ab = DType::BF16;
  g.d = a.out.dt;
  g.A = xq;
  g.lda = K;
  g.a_trans = true;
  g.B = dyq;
  g.ldb = N;
  g.b_trans = false;
  g.D = a.out.ptr;
  g.ldd = a.out.ld;
  g.alpha_dev = alpha;
  return gemm(c, g, st);
}

}  // namespace

qqStatus_t quantize_dequantize(qqHandle_t h, const QdqArgs& a, void* stream) {
  const char* op = a.tile32 ? "quantize_dequantize_moe" : "quantize_dequantize";
  // The kernels store whole 8- and 16-byte pieces (the rows of these compact outputs are
  // multiples of 16 bytes wherever they do): the outputs' start is the caller's to align.
  for (const Mat* m : {&a.out, &a.out_t})
    if (m->ptr && (uintptr_t)m->ptr % 16)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: on the GPU, argument '%s' must start on a 16-byte boundary; "
                       "pass a freshly allocated tensor", op, m == &a.out ? "out" : "out_t");
  qqContext* c = nullptr;
  QQ_TRY(resolve_handle(op, h, a.x.device, &c));
  return on_device(c->device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    if (a.tile32) return moe_qdq(a, st);
    __nv_bfloat16* rows = (__nv_bfloat16*)a.out.ptr;
    if (!a.out_t.ptr) return qdq<__nv_bfloat16>(a.x, a.q, a.gs, nullptr, rows, st);
    return colqdq(a.x, nullptr, a.q, a.gs, (__nv_bfloat16*)a.out_t.ptr, st, rows, "quantize_dequantize");
  });
}

// ---------------------------------------------------------------------------
// grouped_qqmm_wgrad on Blackwell: every expert in one cuBLASLt grouped block-scaled GEMM
// ---------------------------------------------------------------------------
// The forward route's GEMM (gemm_grouped_blockscaled) with the tokens as the reduction:
// expert e's product is out[e] = xt_e [K, len_e] @ dyt_e [N, len_e]^T, len_e its tokens
// padded to 32-token blocks as the exact path pads them (seg_plan_kernel), so each group
// has its own reduction length. x and dy are quantized along the tokens by seg_qdq's code
// form: codes [K, tp] / [N, tp], and each expert's scales in blocked tiles of their own,
// [roundup(K, 128), c4_e] with c4_e = roundup(len_e / group, 4) (sblk). Launches: the plan,
// the two quantizations, the args kernel, the GEMM and one fill (NaN everywhere for bad
// ends, zeros for the empty experts, which get no rows in the GEMM) - a fixed number
// whatever E is, no host read. Built everywhere, never run on Blackwell here
// (docs/blackwell.md); the forward route's hooks (emulate_grouped_blockscaled,
// force_blockscaled) test it on other GPUs.
namespace {

struct WgradBsArgs {
  const int32_t* blk = nullptr;   // [E + 1]: each expert's first 32-token block
  const int32_t* sblk = nullptr;  // [E + 1]: each expert's first scale column (padded to 4)
  int E = 0, bits = 0;
  int64_t K = 0, N = 0, tp = 0;
  const uint8_t* xc = nullptr;   // codes [K, tp], rows tp * bits / 8 bytes
  const uint8_t* dyc = nullptr;  // codes [N, tp]
  const uint8_t* xs = nullptr;   // blocked scales, expert e's at xs + r128k * sblk[e]
  const uint8_t* dys = nullptr;
  int64_t r128k = 0, r128n = 0;
  uint8_t* out = nullptr;  // out[e] at out + e * out_pitch bytes, rows out_ld elements
  int64_t out_pitch = 0, out_ld = 0;
  const float* gs_x = nullptr;
  const float* gs_dy = nullptr;
  GroupedLtGemm g;
  float* alpha_vals = nullptr;  // [E + 1]: alpha, then 0 (beta)
};

__global__ void wgrad_bs_args_kernel(WgradBsArgs a) {
  if (blockIdx.x == 0 && threadIdx.x == 0) a.alpha_vals[a.E] = 0.0f;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < a.E; e += gridDim.x * blockDim.x) {
    const int64_t b0 = a.blk[e], nb = a.blk[e + 1] - b0;  // bad ends: blk = 0, every expert empty
    const int64_t off = b0 * 32 * a.bits / 8;
    a.g.a_ptr[e] = (void*)(a.xc + off);
    a.g.b_ptr[e] = (void*)(a.dyc + off);
    a.g.d_ptr[e] = (void*)(a.out + e * a.out_pitch);
    a.g.a_scale[e] = (void*)(a.xs + a.r128k * a.sblk[e]);
    a.g.b_scale[e] = (void*)(a.dys + a.r128n * a.sblk[e]);
    a.alpha_vals[e] = nvfp4_alpha(a.gs_x, a.gs_dy);
    a.g.alpha[e] = (void*)(a.alpha_vals + e);
    a.g.beta[e] = (void*)(a.alpha_vals + a.E);
    // an empty expert: no rows, nothing read or written (a nonzero reduction all the same:
    // the tp bound leaves a block of room past the last expert's); wgrad_fill_kernel zeroes it
    a.g.rows_k[e] = nb ? nb * 32 : 32;
    a.g.cols_n[e] = a.N;
    a.g.cols_m[e] = nb ? a.K : 0;
    a.g.ld_a[e] = a.tp;
    a.g.ld_b[e] = a.tp;
    a.g.ld_d[e] = a.out_ld;
  }
}

// out[e] [K, N] (rows ld elements, experts pitch elements apart): NaN everywhere when the
// ends were bad, zeros for an empty expert; the GEMM's experts are left alone. grid.y: e.
__global__ void wgrad_fill_kernel(const int32_t* blk, const int* bad, Mat out, int64_t pitch, int64_t K, int64_t N) {
  const int e = blockIdx.y;
  const bool nan = *bad != 0;
  if (!nan && blk[e + 1] != blk[e]) return;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < K * N; i += (int64_t)gridDim.x * kThreads) {
    const int64_t r = i / N;
    put_nan_or_zero(out, e * pitch + r * out.ld + (i - r * N), nan);
  }
}

// SUCCESS (the product is in a.out), NOT_SUPPORTED with the reason (nothing written: the
// caller takes another route), or another error.
qqStatus_t grouped_wgrad_blockscaled(qqContext* c, const WgradArgs& a, cudaStream_t st) {
#if !QQ_HAVE_BLOCKSCALED
  (void)c, (void)a, (void)st;
  return set_error(QQ_STATUS_NOT_SUPPORTED, "grouped_qqmm_wgrad: libqq was built against a cuBLASLt without "
                   "block-scaled GEMMs");
#else
  const int64_t E = a.E, T = a.T, K = a.K, N = a.N;
  const QSpec& q = a.q;
  const int64_t es = dtype_size(a.out.dt), pitch = a.out.nb ? a.out.bstride[0] : K * N;
  const char* why = grouped_bs_refusal(q, a.out.dt);
  if (why) {
  } else if (E < 2 || E > kGroupedBsMaxE)
    why = "the number of experts is outside 2 .. 4096";
  else if (!rows_aligned(a.out) || (pitch * es) % 16 != 0)
    why = "out's rows are not 16-byte aligned";
  else if (T >= (1ll << 31) - 32 * E || K >= (1ll << 31) || N >= (1ll << 31))
    why = "T + 32 E, K or N is 2^31 or more";
  if (why)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "grouped_qqmm_wgrad: the block-scaled route does not take this call: %s",
                     why);

  const int spb = 32 / q.group;  // scale columns a 32-token block
  // At most T / 32 + E blocks (sum of ceil(n_e / 32)); scale columns at most spb of each
  // plus 3 of padding an expert.
  const int64_t nblk = (T + 31) / 32 + E, tp = 32 * nblk, smax = spb * nblk + 3 * E;
  const int64_t r128k = roundup(K, 128), r128n = roundup(N, 128), bytes_row = tp * q.bits / 8;
  Scratch scratch(c, st);
  // the arrays: 7 of pointers and 6 of int64 [E], alpha [E + 1], blk and sblk [E + 1], the flag
  const int64_t e16 = roundup(E, 2) * 8, i16 = roundup((E + 1) * 4, 16);
  uint8_t* meta = nullptr;
  QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(13 * e16 + 3 * i16 + 16), &meta));
  WgradBsArgs w;
  GroupedLtGemm& lt = w.g;
  const int64_t used = grouped_bs_layout(meta, E, q, a.out.dt, lt);
  w.alpha_vals = (float*)(meta + used);
  int32_t* blk = (int32_t*)(meta + used + i16);
  int32_t* sblk = (int32_t*)(meta + used + 2 * i16);
  int* bad = (int*)(meta + used + 3 * i16);
  lt.N = N;
  lt.kind = 1;
  lt.K = pow2_hint(T / E, 32);  // the reduction per group is on the device: its average is the hint
  lt.avg_m = K;
  if (!test_hook(HOOK_EMULATE_GROUPED))
    QQ_TRY(gemm_grouped_blockscaled(c, lt, false, st));  // refused (with the reason) before any work

  uint8_t *xc = nullptr, *dyc = nullptr, *xs = nullptr, *dys = nullptr;
  QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(K * bytes_row), &xc));
  QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(N * bytes_row), &dyc));
  QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(r128k * smax), &xs));
  QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(r128n * smax), &dys));
  QQ_CUDA_TRY(cudaMemsetAsync(xs, 0, (size_t)(r128k * smax), st), "grouped_qqmm_wgrad");
  QQ_CUDA_TRY(cudaMemsetAsync(dys, 0, (size_t)(r128n * smax), st), "grouped_qqmm_wgrad");
  seg_plan_kernel<<<1, kSegThreads, 0, st>>>(a.ends, (int)E, T, blk, sblk, spb, bad);
  QQ_TRY(check_launch("grouped_qqmm_wgrad"));
  const SegCodes sx{xc, xs, sblk, r128k}, sdy{dyc, dys, sblk, r128n};
  QQ_TRY(seg_qdq(a.x, a.ends, blk, (int)E, q, a.gs_x, nullptr, tp, st, &sx));
  QQ_TRY(seg_qdq(a.dy, a.ends, blk, (int)E, q, a.gs_dy, nullptr, tp, st, &sdy));

  w.blk = blk;
  w.sblk = sblk;
  w.E = (int)E;
  w.bits = q.bits;
  w.K = K;
  w.N = N;
  w.tp = tp;
  w.xc = xc;
  w.dyc = dyc;
  w.xs = xs;
  w.dys = dys;
  w.r128k = r128k;
  w.r128n = r128n;
  w.out = (uint8_t*)a.out.ptr;
  w.out_pitch = pitch * es;
  w.out_ld = a.out.ld;
  w.gs_x = a.gs_x;
  w.gs_dy = a.gs_dy;
  wgrad_bs_args_kernel<<<(unsigned)((E + 255) / 256), 256, 0, st>>>(w);
  QQ_TRY(check_launch("grouped_qqmm_wgrad"));
  QQ_TRY(run_grouped_bs(c, lt, q, K * N, st, "grouped_qqmm_wgrad"));
  const unsigned fb = (unsigned)std::min<int64_t>(64, (K * N + kThreads - 1) / kThreads);
  wgrad_fill_kernel<<<dim3(fb, (unsigned)E), kThreads, 0, st>>>(blk, bad, a.out, pitch, K, N);
  QQ_TRY(check_launch("grouped_qqmm_wgrad"));
  return routed(QQ_STATUS_SUCCESS, QQ_ROUTE_BLOCKSCALED);
#endif
}

}  // namespace

qqStatus_t grouped_qqmm_wgrad(qqHandle_t h, const WgradArgs& a, void* stream) {
  qqContext* c = nullptr;
  QQ_TRY(resolve_handle("grouped_qqmm_wgrad", h, a.out.device, &c));
  const int64_t E = a.E, T = a.T, K = a.K, N = a.N;
  const bool f32 = a.out.dt == DType::F32;
  // Hopper, CUTLASS built, TMA's 16-byte rows, a result type the grouped GEMM writes.
  const bool one_launch = grouped_gemm_sm90_built() && c->cc / 10 == 9 && K % 8 == 0 && N % 8 == 0 &&
                          (f32 || a.out.dt == DType::BF16) && rows_aligned(a.out) && E < (1 << 30) &&
                          K < (1ll << 31) && N < (1ll << 31) && T < (1ll << 31) - 32 * E;
  return on_device(c->device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    // one expert, on every GPU: its end stays on the device (a bad one gives NaN)
    if (E == 1) return routed(dense_wgrad(c, a, st), QQ_ROUTE_EXACT);
    // Blackwell: one grouped block-scaled GEMM where cuBLASLt takes the call; where it
    // refuses, the routes below (Hopper under the force_blockscaled hook: its grouped GEMM)
    if (grouped_bs_arch(c->cc)) {
      const qqStatus_t s = grouped_wgrad_blockscaled(c, a, st);
      if (s != QQ_STATUS_NOT_SUPPORTED) return s;
    }
    std::vector<int32_t> ends;
    if (!one_launch) {  // read and check the ends first: a bad one is refused before any work
      ends.resize(E);
      QQ_TRY(copy_to_host(c->device, a.ends, E * sizeof(int32_t), ends.data(), stream));
      QQ_TRY(check_group_ends("grouped_qqmm_wgrad", ends.data(), E, T));
    }
    Scratch scratch(c, st);
    // At most T / 32 + E blocks: sum of ceil(n_e / 32) <= sum (n_e / 32 + 1).
    const int64_t nblk = (T + 31) / 32 + E, tp = 32 * nblk;
    int32_t* blk = nullptr;
    __nv_bfloat16 *xt = nullptr, *dyt = nullptr;
    float* alpha = nullptr;
    QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(E + 1) * 4, &blk));
    QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(K * tp) * 2, &xt));
    QQ_TRY(scratch.get("grouped_qqmm_wgrad", (size_t)(N * tp) * 2, &dyt));
    seg_plan_kernel<<<1, kSegThreads, 0, st>>>(a.ends, (int)E, T, blk);
    QQ_TRY(check_launch("grouped_qqmm_wgrad"));
    QQ_TRY(seg_qdq(a.x, a.ends, blk, (int)E, a.q, a.gs_x, xt, tp, st));
    QQ_TRY(seg_qdq(a.dy, a.ends, blk, (int)E, a.q, a.gs_dy, dyt, tp, st));
    QQ_TRY(alpha_pair("grouped_qqmm_wgrad", a.gs_x, a.gs_dy, scratch, st, &alpha));
    const int64_t es = dtype_size(a.out.dt), pitch = a.out.nb ? a.out.bstride[0] : K * N;
    if (one_launch) {
      GroupedGemmSm90 g;
      g.split = kSplitReduction;
      g.A = xt;
      g.lda = tp;
      g.B = dyt;
      g.ldb = tp;
      g.D = a.out.ptr;
      g.ldd = a.out.ld;
      g.d_stride = pitch;
      g.d_f32 = f32;
      g.ends = a.ends;
      g.seg_blocks = blk;
      g.alpha = alpha;
      g.alpha_stride = 0;
      g.E_all = g.E = (int)E;
      g.T = T;
      g.N = N;
      g.K = K;
      g.device = c->device;
      g.sm_count = sm_count(c->device);
      void* buf = nullptr;
      QQ_TRY(scratch.get("grouped_qqmm_wgrad", grouped_gemm_sm90_scratch(g), &buf));
      if (const char* why = grouped_gemm_sm90(g, buf, st))
        return set_error(QQ_STATUS_CUDA_ERROR, "grouped_qqmm_wgrad: %s", why);
      return routed(check_launch("grouped_qqmm_wgrad"), QQ_ROUTE_EXACT);
    }
    int64_t b0 = 0;  // expert e's first block, as seg_plan_kernel computes it
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = ends[e] - (e ? ends[e - 1] : 0), len = wgrad_span(n);
      char* out_e = (char*)a.out.ptr + e * pitch * es;
      if (n == 0) {  // out is compact (the C entry point checks)
        QQ_CUDA_TRY(cudaMemsetAsync(out_e, 0, (size_t)(K * N * es), st), "grouped_qqmm_wgrad");
        continue;
      }
      Gemm g;
      g.M = K;
      g.N = N;
      g.K = len;
      g.ab = DType::BF16;
      g.d = a.out.dt;
      g.A = xt + b0 * 32;
      g.lda = tp;
      g.B = dyt + b0 * 32;
      g.ldb = tp;
      g.b_trans = true;
      g.D = out_e;
      g.ldd = a.out.ld;
      g.alpha_dev = alpha;
      QQ_TRY(gemm(c, g, st));
      b0 += len / 32;
    }
    return routed(QQ_STATUS_SUCCESS, QQ_ROUTE_EXACT);
  });
}

}  // namespace cuda
}  // namespace qq
