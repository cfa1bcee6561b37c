// cuda/qqmm.cu - y = alpha * q(x) @ q(w)^T (+ bias), both operands quantized.
//
// Two paths (DESIGN.md section 5):
// - Blackwell (sm_100/103/110/120/121, cuBLASLt >= 12.8): the block-scaled
//   tensor cores through cuBLASLt - fp4/fp8 operands with their blocked
//   scales (VEC16_UE4M3 for nvfp4, VEC32_UE8M0 for mx), alpha from the
//   global scales on the device. If cuBLASLt refuses, the exact path runs.
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
#include <stdlib.h>
#include <string.h>

#include "../codec.h"
#include "common.cuh"
#include "ops.cuh"
#include "vec.cuh"

namespace qq {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// Decoded values of a pair of codes (lo in the low byte/nibble). fp8 uses the
// hardware conversion to half2 on sm_89+ (exact: every E4M3/E5M2 value is an
// fp16 value); E2M1 and older GPUs the codec.
__device__ __forceinline__ float2 decode2(int elem, uint32_t pr) {
  if (elem == ELEM_E2M1) return make_float2(e2m1_decode(pr & 0xf), e2m1_decode((pr >> 4) & 0xf));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pr, elem == ELEM_E4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half22float2(__half2(h));
#else
  return make_float2(elem_decode(elem, pr & 0xff), elem_decode(elem, pr >> 8));
#endif
}

// q(x) for one group of G elements per thread: the quantize kernel's scale
// and element math (codec.h, bit for bit), then decode * scale - without the
// global scale, which the caller folds into alpha (or, for the fp32 output
// of the small-M route, multiplies in here: post = gs_post / 2688).
// x: [B, M, K] via Mat, read with 16-byte loads when kVecIn (rows aligned);
// out: compact [B*M, K], written with 16-byte stores.
template <typename T, typename TO, int G, bool kVecIn>
__global__ void __launch_bounds__(kThreads)
    qdq_kernel(Mat x, QSpec q, const float* gs, const float* gs_post, TO* out, int64_t ng, int64_t total) {
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
  uint32_t ab = 0;
#pragma unroll
  for (int i = 0; i < G; ++i) ab = max(ab, f2u(v[i]) & 0x7fffffffu);
  const float amax = u2f(ab);
  uint8_t sc;
  float f, sdec;
  bool nan_group;
  if (G == 16) {  // nvfp4
    const float enc = gs ? nvfp4_enc(*gs) : 1.0f;
    sc = nvfp4_scale(amax, enc);
    f = nvfp4_elem_factor(sc, enc);
    nan_group = (sc & 0x7f) == 0x7f;
    sdec = e4m3_decode(sc);
  } else {
    sc = mx_scale(amax, q.elem, q.floor_rounding);
    nan_group = sc == 0xff;
    f = nan_group ? 0.0f : ue8m0_inverse(sc);
    sdec = ue8m0_decode(sc);
  }
  if (gs_post) sdec = sdec * nvfp4_dec(*gs_post);  // fp32 route only; one extra rounding, within tolerance
#pragma unroll
  for (int i = 0; i < G; i += 2) {
    uint32_t pr;
    if (q.elem == ELEM_E2M1) pr = nan_group ? 0 : e2m1x2_encode(v[i] * f, v[i + 1] * f);
    else if (q.elem == ELEM_E4M3) pr = nan_group ? 0x7f7f : e4m3x2_encode(v[i] * f, v[i + 1] * f);
    else pr = nan_group ? 0x7f7f : e5m2x2_encode(v[i] * f, v[i + 1] * f);
    const float2 d = decode2(q.elem, pr);
    v[i] = d.x * sdec;
    v[i + 1] = d.y * sdec;
  }
  TO* dst = out + row * (ng * G) + g * G;
#pragma unroll
  for (int i = 0; i < G; i += 8) store8<TO>(dst + i, v + i);
}

// {alpha, 0}: alpha = (gx / 2688) * (gw / 2688), a missing scale counting 1;
// the 0 is beta for cuBLASLt's device pointer mode.
__global__ void alpha_kernel(const float* gx, const float* gw, float* out) {
  out[0] = (gx ? nvfp4_dec(*gx) : 1.0f) * (gw ? nvfp4_dec(*gw) : 1.0f);
  out[1] = 0.0f;
}

// Rows (start, pitch, batch strides) on 16-byte boundaries.
bool rows_aligned(const Mat& m) {
  const int64_t es = dtype_size(m.dt);
  bool ok = ((uintptr_t)m.ptr % 16) == 0 && (m.rows <= 1 || (m.ld * es) % 16 == 0);
  for (int i = 0; i < m.nb; ++i) ok = ok && (m.bstride[i] * es) % 16 == 0;
  return ok;
}

template <typename T, typename TO>
qqStatus_t launch_qdq_t(const Mat& x, const QSpec& q, const float* gs, const float* gs_post, TO* out,
                        cudaStream_t st) {
  const int64_t ng = x.cols / q.group, total = x.batch() * x.rows * ng;
  const unsigned grid = (unsigned)((total + kThreads - 1) / kThreads);
  const bool vec = rows_aligned(x);
  if (q.group == 16) {
    if (vec) qdq_kernel<T, TO, 16, true><<<grid, kThreads, 0, st>>>(x, q, gs, gs_post, out, ng, total);
    else qdq_kernel<T, TO, 16, false><<<grid, kThreads, 0, st>>>(x, q, gs, gs_post, out, ng, total);
  } else {
    if (vec) qdq_kernel<T, TO, 32, true><<<grid, kThreads, 0, st>>>(x, q, gs, gs_post, out, ng, total);
    else qdq_kernel<T, TO, 32, false><<<grid, kThreads, 0, st>>>(x, q, gs, gs_post, out, ng, total);
  }
  return check_launch("qqmm");
}

template <typename TO>
qqStatus_t qdq(const Mat& x, const QSpec& q, const float* gs, const float* gs_post, TO* out, cudaStream_t st) {
  switch (x.dt) {
    case DType::F32: return launch_qdq_t<float, TO>(x, q, gs, gs_post, out, st);
    case DType::F16: return launch_qdq_t<__half, TO>(x, q, gs, gs_post, out, st);
    default: return launch_qdq_t<__nv_bfloat16, TO>(x, q, gs, gs_post, out, st);
  }
}

// A prepared w (q(w)'s values in f16/f32) as compact bf16: exact, the values
// are on the quantization grid.
template <typename T>
__global__ void to_bf16_kernel(Mat w, __nv_bfloat16* out, int64_t total) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / w.cols, k = i - r * w.cols;
  out[i] = __ushort_as_bfloat16(f_to_bf16(load1<T>(w.at<T>(0, r) + k)));
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
// or quantized-dequantized on the fly (float).
qqStatus_t operand_bf16(qqContext* c, const Mat& m, const Mat& scales, bool packed, int blocked, const QSpec& q0,
                        const float* gs, int64_t rows, int64_t K, __nv_bfloat16* out, cudaStream_t st) {
  if (!packed) return qdq<__nv_bfloat16>(m, q0, gs, nullptr, out, st);
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

// ---------------------------------------------------------------------------
// Blackwell: cuBLASLt block-scaled GEMM
// ---------------------------------------------------------------------------
// True on the architectures whose tensor cores take block-scaled fp4/fp8
// through cuBLASLt: sm_100/103 (B200/B300), sm_110, sm_120/121 (RTX 50, DGX
// Spark). QQ_QQMM_FORCE_BLOCKSCALED=1 makes any device try it (a test of the
// descriptor setup and of the fallback on GPUs that refuse).
bool blockscaled_arch(int cc) {
  static const bool force = [] {
    const char* e = getenv("QQ_QQMM_FORCE_BLOCKSCALED");
    return e && e[0] == '1';
  }();
  return force || cc == 100 || cc == 103 || cc == 110 || cc == 120 || cc == 121;
}

#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120800
#define QQ_HAVE_BLOCKSCALED 1
// The block-scaled GEMM on packed operands with blocked scales, through
// gemm.cu's plan cache (descriptors and algorithm built once per shape,
// format, output type and alignment; a refusal is remembered too). Returns
// NOT_SUPPORTED (no message) when cuBLASLt has no algorithm, so the caller
// falls back to the exact path.
qqStatus_t blockscaled_gemm(qqContext* c, const MatmulArgs& a, const uint8_t* xd, const uint8_t* xs,
                            const uint8_t* wd, const uint8_t* ws_, const float* alpha_dev, const float* bias,
                            int64_t Mtot, cudaStream_t st, Scratch& scratch) {
  (void)scratch;  // the plan's workspace comes from gemm's own scratch on this stream
  Gemm g;
  g.M = Mtot;
  g.N = a.N;
  g.K = a.K;
  g.d = a.out.dt;
  g.A = xd;
  g.lda = a.K;
  g.B = wd;
  g.ldb = a.K;
  g.b_trans = true;
  g.D = a.out.ptr;
  g.ldd = a.N;
  g.bias = bias;
  g.alpha_dev = alpha_dev;
  g.lt_ab = (int)(a.q.bits == 4 ? CUDA_R_4F_E2M1 : (a.q.elem == ELEM_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2));
  g.scale_mode = (int)(a.q.mode == QQ_MODE_NVFP4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3
                                                 : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0);
  g.a_scale = xs;
  g.b_scale = ws_;
  return gemm_blockscaled(c, g, st);
}

// Both operands packed with blocked scales, in scratch where they were not
// already, then the block-scaled GEMM.
qqStatus_t qqmm_blockscaled(qqContext* c, const MatmulArgs& a, const float* alpha_dev, const float* bias,
                            int64_t Mtot, cudaStream_t st, Scratch& scratch) {
  const int64_t K = a.K, N = a.N, ng = K / a.q.group;
  const int64_t c4 = roundup(ng, 4), pk = a.q.packed_cols(K);
  // x: quantized on the fly (or swizzled) into [Mtot, K] + blocked scales of Mtot rows
  const uint8_t *xd, *xs, *wd, *ws;
  auto prep = [&](const Mat& m, const Mat& scales, bool packed, int blocked, const float* gs, int64_t rows,
                  const uint8_t** d_out, const uint8_t** s_out) -> qqStatus_t {
    const bool compact = m.nb == 0 || m.batch() == 1;
    if (packed && blocked && compact) {
      *d_out = (const uint8_t*)m.ptr;
      *s_out = (const uint8_t*)scales.ptr;
      return QQ_STATUS_SUCCESS;
    }
    uint8_t *d = nullptr, *s = nullptr;
    QQ_TRY(scratch.get("qqmm", (size_t)(roundup(rows, 128) * c4), &s));
    Mat sb{};
    sb.ptr = s;
    sb.dt = DType::U8;
    sb.device = m.device;
    sb.rows = roundup(rows, 128);
    sb.cols = c4;
    sb.ld = c4;
    if (packed) {  // linear scales, or batched x: a blocked matrix over all rows
      if (blocked) return QQ_STATUS_NOT_SUPPORTED;  // batched blocked x: per-entry padding; use the exact path
      Mat lin = scales;
      lin.nb = 0;
      lin.rows = rows;
      lin.ld = lin.cols;
      QQ_TRY(swizzle(c, lin, sb, true, st));
      *d_out = (const uint8_t*)m.ptr;
    } else {
      QQ_TRY(scratch.get("qqmm", (size_t)(rows * pk), &d));
      QuantizeArgs q{};
      q.x = m;
      q.data = compact_like(m, d, DType::U8, m.rows, pk);
      q.scales = sb;
      q.scales.nb = 0;
      q.gs = gs;
      q.q = a.q;
      q.q.blocked = 1;
      if (m.nb) {  // fold the batch into rows (x is quantized row by row)
        q.x.nb = 0;
        q.x.rows = rows;
        q.data.nb = 0;
        q.data.rows = rows;
        bool flat = true;
        int64_t expect = m.rows * m.ld;
        for (int i = m.nb - 1; i >= 0; --i) {
          flat = flat && (m.bshape[i] == 1 || m.bstride[i] == expect);
          expect *= m.bshape[i];
        }
        if (!flat) return QQ_STATUS_NOT_SUPPORTED;
      }
      QQ_TRY(quantize(c, q, st));
      *d_out = d;
    }
    *s_out = s;
    return QQ_STATUS_SUCCESS;
  };
  QQ_TRY(prep(a.x, a.x_scales, a.x_packed, a.x_blocked, a.gs_x, Mtot, &xd, &xs));
  QQ_TRY(prep(a.w, a.w_scales, a.w_packed, a.w_blocked, a.gs_w, N, &wd, &ws));
  return blockscaled_gemm(c, a, xd, xs, wd, ws, alpha_dev, bias, Mtot, st, scratch);
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

qqStatus_t qqmm_core(qqHandle_t h, const MatmulArgs& a, void* stream) {
  qqContext* c = nullptr;
  QQ_TRY(resolve_handle("qqmm", h, a.out.device, &c));
  return on_device(c->device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    Scratch scratch(c, st);
    const int64_t M = a.M, N = a.N, K = a.K, Mtot = a.x.batch() * M;
    float* bias = nullptr;
    if (a.bias.ptr) {
      QQ_TRY(scratch.get("qqmm", (size_t)N * 4, &bias));
      QQ_TRY(to_f32("qqmm", a.bias, N, bias, st));
    }
    float* alpha = nullptr;
    if (a.gs_x || a.gs_w) {
      QQ_TRY(scratch.get("qqmm", 2 * sizeof(float), &alpha));
      alpha_kernel<<<1, 1, 0, st>>>(a.gs_x, a.gs_w, alpha);
      QQ_TRY(check_launch("qqmm"));
    }
#if QQ_HAVE_BLOCKSCALED
    if (blockscaled_arch(c->cc) && !a.w_prepared) {
      const qqStatus_t s = qqmm_blockscaled(c, a, alpha, bias, Mtot, st, scratch);
      if (s != QQ_STATUS_NOT_SUPPORTED) return s;
      set_error(QQ_STATUS_SUCCESS, "%s", "");  // refused: the exact path below
    }
#endif
    // Small and medium M, stored weight: the tensor-core weight-only kernel
    // on q(x) in bf16 (exact), alpha applied to its fp32 sums.
    if (Mtot <= kQmmaMaxM && a.w_packed && !a.x_packed) {
      __nv_bfloat16* xq = nullptr;
      QQ_TRY(scratch.get("qqmm", (size_t)(Mtot * K) * 2, &xq));
      QQ_TRY(qdq<__nv_bfloat16>(a.x, a.q, a.gs_x, nullptr, xq, st));
      MatmulArgs b = a;
      b.x = compact_like(a.x, xq, DType::BF16, Mtot, K);
      b.x.nb = 0;
      b.out.nb = 0;
      b.out.rows = Mtot;
      b.M = Mtot;
      b.x_packed = false;
      b.transpose = true;
      b.q.blocked = a.w_blocked;
      const qqStatus_t s = qmma(b, alpha, st);
      if (s != QQ_STATUS_NOT_SUPPORTED) return s;
    }
    // Small M otherwise: the CUDA-core weight-only kernel on q(x) (fp32,
    // gx/2688 applied), w's global scale applied by qmv as dequantize does.
    if (Mtot <= kQmvMaxM && a.w_packed && !a.x_packed) {
      float* xq = nullptr;
      QQ_TRY(scratch.get("qqmm", (size_t)(Mtot * K) * 4, &xq));
      QQ_TRY(qdq<float>(a.x, a.q, a.gs_x, a.gs_x, xq, st));
      MatmulArgs b = a;
      b.x = compact_like(a.x, xq, DType::F32, Mtot, K);
      b.x.nb = 0;
      b.out.nb = 0;
      b.out.rows = Mtot;
      b.M = Mtot;
      b.x_packed = false;
      b.transpose = true;
      b.q.blocked = a.w_blocked;
      const qqStatus_t s = qmv(b, st);
      if (s != QQ_STATUS_NOT_SUPPORTED) return s;
    }
    __nv_bfloat16 *xb = nullptr, *wb = nullptr;
    int64_t ldw = K;
    QQ_TRY(scratch.get("qqmm", (size_t)(Mtot * K) * 2, &xb));
    QQ_TRY(operand_bf16(c, a.x, a.x_scales, a.x_packed, a.x_blocked, a.q, a.gs_x, M, K, xb, st));
    if (a.w_prepared && a.w.dt == DType::BF16) {  // the caller keeps q(w) in bf16: no work per call
      wb = (__nv_bfloat16*)a.w.ptr;
      ldw = a.w.ld;
    } else if (a.w_prepared) {
      QQ_TRY(scratch.get("qqmm", (size_t)(N * K) * 2, &wb));
      const unsigned grid = (unsigned)((N * K + kThreads - 1) / kThreads);
      if (a.w.dt == DType::F32) to_bf16_kernel<float><<<grid, kThreads, 0, st>>>(a.w, wb, N * K);
      else to_bf16_kernel<__half><<<grid, kThreads, 0, st>>>(a.w, wb, N * K);
      QQ_TRY(check_launch("qqmm"));
    } else {
      QQ_TRY(scratch.get("qqmm", (size_t)(N * K) * 2, &wb));
      QQ_TRY(operand_bf16(c, a.w, a.w_scales, a.w_packed, a.w_blocked, a.q, a.gs_w, N, K, wb, st));
    }
    Gemm g;
    g.M = Mtot;
    g.N = N;
    g.K = K;
    g.ab = DType::BF16;
    g.d = a.out.dt;
    g.A = xb;
    g.lda = K;
    g.B = wb;
    g.ldb = ldw;
    g.b_trans = true;
    g.D = a.out.ptr;
    g.ldd = N;
    g.bias = bias;
    g.alpha_dev = alpha;
    return gemm(c, g, st);
  });
}

}  // namespace

}  // namespace cuda
}  // namespace qq
