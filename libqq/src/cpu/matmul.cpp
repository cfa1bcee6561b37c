// cpu/matmul.cpp - qqmm and quantized_matmul on the CPU.
//
// Both reduce to: dequantize the operands to fp32 with the row helpers of
// cpu/quantize.cpp (so the values are exactly what quantize + dequantize give),
// then C = alpha * A @ B^T (+ bias) with fp32 accumulation, then one rounding
// to the output dtype. The dot products keep 16 independent partial sums so
// that the compiler vectorizes them without -ffast-math. Both hold x as fp32 up
// to kQmmRows rows at a time and make w's values block by block inside the
// threads that multiply them (qmm_rows, qqmm), never the whole fp32 weight.
#include <string.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "../codec.h"
#include "../decode_layout.h"
#include "../group_ends.h"
#include "../internal.h"
#include "rows.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace qq {
namespace cpu {
namespace {

// The 16 sums of dot: sum j takes the products a[i] * b[i] of i % 16 == j in order, then
// the pairwise combine in a fixed order: the same result on every run.
float dot_generic(const float* a, const float* b, int64_t k) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  for (; i < k; ++i) acc[i & 15] += a[i] * b[i];
  // pairwise combine: fixed order, same result on every run
  for (int w = 8; w >= 1; w >>= 1)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The same sums with AVX2: sums 0..7 and 8..15 in two registers, each product added to its
// own sum in the same order, the combine as four vector adds (w = 8: the two registers; 4:
// their halves; 2, 1: within one). The compiler's vectorized copy of dot_generic spilled the
// sums to memory for a scalar combine: ~107 instructions a dot of 32, ~a sixth of a tiny
// quantized_matmul.
__attribute__((target("avx2"))) float dot_avx2(const float* a, const float* b, int64_t k) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8)));
  }
  if (i < k) {  // a ragged end (k not a multiple of 16): sum j takes a[i] * b[i], i % 16 == j
    float acc[16];
    _mm256_storeu_ps(acc, lo);
    _mm256_storeu_ps(acc + 8, hi);
    for (; i < k; ++i) acc[i & 15] += a[i] * b[i];
    lo = _mm256_loadu_ps(acc);
    hi = _mm256_loadu_ps(acc + 8);
  }
  const __m256 s8 = _mm256_add_ps(lo, hi);  // acc[j] + acc[j + 8]
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));  // + acc[j + 4]
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                 // + acc[j + 2]
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                         // + acc[1]
}
#endif

using DotFn = float (*)(const float*, const float*, int64_t);

// dot for the CPU at hand, picked once: the baseline's (SSE2, the 16 sums in four 4-wide
// registers) or AVX2's. Both add each sum's products in the same order: the same bits.
DotFn dot_kernel() {
  static const DotFn d = [] {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return &dot_avx2;
#endif
    return &dot_generic;
  }();
  return d;
}

// Rows of x that quantized_matmul and qqmm hold as fp32 at a time (then the weight's blocks
// are dequantized again for the next rows: 1/64 of the products' multiply-adds).
constexpr int64_t kQmmRows = 64;

struct GemmJob {
  const float* A;  // [M, K]
  const float* B;  // [N, K]
  const float* bias;  // [N] fp32 or nullptr
  float alpha;
  int64_t M, N, K;
  float* C;  // [M, N]
};

// C[m, n] = alpha * dot(A row m, B row n - n0) + bias[n] for m < M, n in [n0, n1): the one
// home of the matmuls' sums (B holds rows n0 .. n1 - 1; C's rows are N apart).
void block_dots(const float* A, int64_t M, const float* B, int64_t n0, int64_t n1, int64_t K, int64_t N,
                float alpha, const float* bias, float* C) {
  const DotFn dot = dot_kernel();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float v = alpha * dot(A + m * K, B + (n - n0) * K, K);
      if (bias) v += bias[n];
      C[m * N + n] = v;
    }
}

void gemm_range(void* ctx, int64_t nb0, int64_t nb1) {
  const GemmJob& j = *(const GemmJob*)ctx;
  const int64_t n0 = nb0 * 16, n1 = nb1 * 16 < j.N ? nb1 * 16 : j.N;
  block_dots(j.A, j.M, j.B + n0 * j.K, n0, n1, j.K, j.N, j.alpha, j.bias, j.C);
}

// C[M, N] = alpha * A[M, K] @ B[N, K]^T + bias, threads over blocks of 16 columns.
void gemm_nt(const float* A, int64_t M, const float* B, int64_t N, int64_t K, float alpha, const float* bias,
             float* C) {
  GemmJob j{A, B, bias, alpha, M, N, K, C};
  parallel_for((N + 15) / 16, 16 * M * K, gemm_range, &j);
}

std::vector<float> bias_f32(const Mat& bias, int64_t n) {
  std::vector<float> v;
  if (!bias.ptr) return v;
  v.resize(n);
  load_row(bias.ptr, bias.dt, n, v.data());
  return v;
}

// Row m of out's entry b = c (N fp32 values, rounded to out's dtype).
void store_out_row(const Mat& out, int64_t b, int64_t m, const float* c, int64_t N) {
  store_row(c, N, out.dt, (char*)out.ptr + (out.offset(b) + m * out.ld) * dtype_size(out.dt));
}

void store_out(const Mat& out, int64_t b, const float* c, int64_t M, int64_t N) {
  for (int64_t m = 0; m < M; ++m) store_out_row(out, b, m, c + m * N, N);
}

// fp32 [rows, K] of a float operand, quantized and dequantized on the fly
// (qdq) with the global scale g (or nullptr). Dequantization leaves out the
// global factor: it goes into alpha.
void qdq_rows(const Mat& x, int64_t b, const QSpec& q, const float* g, float* out) {
  const int64_t K = x.cols, ng = K / q.group;
  const float enc = g ? nvfp4_enc(*g) : 1.0f;
  // the row, then its codes and scale bytes (one Scratch: three vectors were ~10 % of a
  // qqmm of [1, 32])
  Scratch buf((size_t)(K + (q.packed_cols(K) + ng + 3) / 4));
  float* row = buf.data();
  uint8_t* packed = (uint8_t*)(row + K);
  uint8_t* sc = packed + q.packed_cols(K);
  for (int64_t r = 0; r < x.rows; ++r) {
    load_row((const char*)x.ptr + (x.offset(b) + r * x.ld) * dtype_size(x.dt), x.dt, K, row);
    quantize_row(row, K, q, enc, packed, sc, nullptr, nullptr, x.dt);
    dequantize_row(packed, K, q, sc, nullptr, nullptr, 1.0f, out + r * K);
  }
}

// fp32 [R, C] of a prepared operand (q's values already): the rows of entry b
// of m, or, for a transposed view (trans: m is the stored [C, R]), its columns.
void load_values(const Mat& m, bool trans, int64_t b, int64_t R, int64_t C, float* out) {
  const int es = dtype_size(m.dt);
  const char* base = (const char*)m.ptr + m.offset(b) * es;
  if (!trans && m.ld == C) {  // compact rows: one conversion (a call a row was half its cost at C = 32)
    load_row(base, m.dt, R * C, out);
    return;
  }
  if (!trans) {
    for (int64_t r = 0; r < R; ++r) load_row(base + r * m.ld * es, m.dt, C, out + r * C);
    return;
  }
  std::vector<float> row(R);
  for (int64_t c = 0; c < C; ++c) {
    load_row(base + c * m.ld * es, m.dt, R, row.data());
    for (int64_t r = 0; r < R; ++r) out[r * C + c] = row[r];
  }
}

// q(m)'s values along the tokens for rows t0 .. t0 + n of m [T, C]: fp32
// [C, wgrad_span(n)] (m's rows transposed, zero-padded to whole blocks of
// 32), quantized row-wise - blocks of q.group tokens from row t0.
std::vector<float> qdq_tokens(const Mat& m, int64_t t0, int64_t n, const QSpec& q, const float* g) {
  const int64_t C = m.cols, len = wgrad_span(n);
  std::vector<float> row(C), t(C * len, 0.0f), vals(C * len);
  for (int64_t r = 0; r < n; ++r) {
    load_row((const char*)m.ptr + (t0 + r) * m.ld * dtype_size(m.dt), m.dt, C, row.data());
    for (int64_t k = 0; k < C; ++k) t[k * len + r] = row[k];
  }
  Mat tm{};
  tm.ptr = t.data();
  tm.dt = DType::F32;
  tm.rows = C;
  tm.cols = tm.ld = len;
  qdq_rows(tm, 0, q, g, vals.data());
  return vals;
}

}  // namespace

// q(x)'s values along K (rows) and along M (columns: blocks of q.group rows
// from row 0, the ragged last one zero-padded), in x's orientation.
qqStatus_t quantize_dequantize(const QdqArgs& a) {
  const int64_t M = a.x.rows, K = a.x.cols;
  if (a.tile32) {  // per entry: 32x32 tile amaxes, then each row quantized with its tiles' amaxes
    std::vector<float> w(M * K), tamax((M / 32) * (K / 32)), v(K);
    std::vector<uint8_t> codes(K), sc(K / 32);
    for (int64_t b = 0; b < a.x.batch(); ++b) {
      const int es = dtype_size(a.x.dt);
      for (int64_t r = 0; r < M; ++r)
        load_row((const char*)a.x.ptr + (a.x.offset(b) + r * a.x.ld) * es, a.x.dt, K, &w[r * K]);
      tile32_amax(w.data(), M, K, tamax.data());
      for (int64_t r = 0; r < M; ++r) {
        quantize_row(&w[r * K], K, a.q, 1.0f, codes.data(), sc.data(), nullptr, nullptr, a.x.dt,
                     &tamax[(r / 32) * (K / 32)]);
        dequantize_row(codes.data(), K, a.q, sc.data(), nullptr, nullptr, 1.0f, v.data());
        if (a.out.ptr) store_row(v.data(), K, DType::BF16, (char*)a.out.ptr + (b * M + r) * K * 2);
        if (a.out_t.ptr)
          for (int64_t k = 0; k < K; ++k)
            store_row(&v[k], 1, DType::BF16, (char*)a.out_t.ptr + ((b * K + k) * M + r) * 2);
      }
    }
    return QQ_STATUS_SUCCESS;
  }
  if (a.out.ptr) {
    std::vector<float> v(M * K);
    qdq_rows(a.x, 0, a.q, a.gs, v.data());
    for (int64_t m = 0; m < M; ++m) store_row(v.data() + m * K, K, DType::BF16, (char*)a.out.ptr + m * K * 2);
  }
  if (a.out_t.ptr) {
    const int64_t len = wgrad_span(M);
    const std::vector<float> v = qdq_tokens(a.x, 0, M, a.q, a.gs);  // [K, len]
    std::vector<float> row(K);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) row[k] = v[k * len + m];
      store_row(row.data(), K, DType::BF16, (char*)a.out_t.ptr + m * K * 2);
    }
  }
  return QQ_STATUS_SUCCESS;
}

namespace {

// The rows [r0, r0 + n) of entry b of m as a plain 2-D operand (for a transposed view, trans:
// m is the stored [C, R] and these are its columns r0 ..).
Mat rows_of(const Mat& m, int64_t b, int64_t r0, int64_t n, bool trans) {
  Mat v = m;
  v.ptr = (char*)m.ptr + (m.offset(b) + (trans ? r0 : r0 * m.ld)) * dtype_size(m.dt);
  v.nb = 0;
  if (!trans) v.rows = n;
  return v;
}

// A float w quantized once (its codes and scale bytes, row by row, linear): its values are
// then dequantized by block like a packed w's, where quantizing w again for every chunk of
// x's rows made qqmm of [4096, 1024] x [1024, 1024] take 2x the time (N * K / 2 bytes for
// fp4, an eighth of a whole fp32 copy).
struct QuantizedW {
  std::vector<uint8_t> codes, sc;
  int64_t pc = 0, ng = 0;  // code bytes and scale bytes a row
};

struct QuantizeWJob {
  const MatmulArgs* a;
  QuantizedW* qw;
  float enc;
};

void quantize_w_range(void* ctx, int64_t r0, int64_t r1) {
  const QuantizeWJob& j = *(const QuantizeWJob*)ctx;
  const Mat& w = j.a->w;
  const int64_t K = j.a->K;
  Scratch row((size_t)K);
  for (int64_t r = r0; r < r1; ++r) {
    load_row((const char*)w.ptr + (w.offset(0) + r * w.ld) * dtype_size(w.dt), w.dt, K, row.data());
    quantize_row(row.data(), K, j.a->q, j.enc, j.qw->codes.data() + r * j.qw->pc, j.qw->sc.data() + r * j.qw->ng,
                 nullptr, nullptr, w.dt);
  }
}

// q(w)'s values of w's rows [n0, n0 + n), fp32 [n, K]; nvfp4's global factor is left to alpha.
// qw: a float w quantized (else nullptr).
void qqmm_w_rows(const MatmulArgs& a, const QuantizedW* qw, int64_t n0, int64_t n, float* out) {
  // q(w)'s values already (a prepared w, or w_values next to a packed w): no dequantization
  const Mat* values = a.w_prepared ? &a.w : (a.w_values.ptr ? &a.w_values : nullptr);
  if (values) {
    const bool trans = a.w_prepared && a.w_trans;
    load_values(rows_of(*values, 0, n0, n, trans), trans, 0, n, a.K, out);
  } else if (a.w_packed) {
    dequantize_rows(a.w, a.w_scales, nullptr, a.w_blocked, a.q, 1.0f, 0, n0, n, a.K, out);
  } else {  // as qdq_rows: the codes dequantized without the global factor
    for (int64_t r = n0; r < n0 + n; ++r)
      dequantize_row(qw->codes.data() + r * qw->pc, a.K, a.q, qw->sc.data() + r * qw->ng, nullptr, nullptr, 1.0f,
                     out + (r - n0) * a.K);
  }
}

// q(x)'s values of x's rows [r0, r0 + rows) over its batch entries (M a entry), fp32
// [rows, K]: one call for each run of rows of one entry (a call a row made qdq_rows's
// scratch a row).
void qqmm_x_rows(const MatmulArgs& a, int64_t r0, int64_t rows, float* out) {
  const int64_t M = a.M, K = a.K;
  for (int64_t r = r0; r < r0 + rows;) {
    const int64_t b = r / M, m = r % M, n = std::min(M - m, r0 + rows - r);
    float* o = out + (r - r0) * K;
    if (a.x_prepared)
      load_values(rows_of(a.x, b, m, n, a.x_trans), a.x_trans, 0, n, K, o);
    else if (a.x_packed)
      dequantize_rows(a.x, a.x_scales, nullptr, a.x_blocked, a.q, 1.0f, b, m, n, K, o);
    else
      qdq_rows(rows_of(a.x, b, m, n, false), 0, a.q, a.gs_x, o);
    r += n;
  }
}

struct QqmmJob {
  const MatmulArgs* a;
  const QuantizedW* qw;
  float alpha;
  const float* xd;  // [rows, K]
  int64_t rows;
  const float* bias;
  float* c;         // [rows, N]
};

void qqmm_range(void* ctx, int64_t nb0, int64_t nb1) {
  const QqmmJob& j = *(const QqmmJob*)ctx;
  const MatmulArgs& a = *j.a;
  const int64_t N = a.N, K = a.K;
  Scratch wb((size_t)(16 * K));
  for (int64_t nb = nb0; nb < nb1; ++nb) {
    const int64_t n0 = nb * 16, n1 = std::min(n0 + 16, N);
    qqmm_w_rows(a, j.qw, n0, n1 - n0, wb.data());
    block_dots(j.xd, j.rows, wb.data(), n0, n1, K, N, j.alpha, j.bias, j.c);
  }
}

}  // namespace

// Up to kQmmRows of x's rows (over its batch entries) at a time: q(x)'s values, then w's by
// blocks of 16 rows inside the threads that multiply them (qqmm_range), as quantized_matmul
// (qmm_rows; a float w quantized once first): where whole fp32 copies of w took N * K * 4
// bytes; the same sums.
qqStatus_t qqmm(const MatmulArgs& a) {
  const int64_t M = a.M, N = a.N, K = a.K;
  // alpha = (gx / 2688) * (gw / 2688): the product of the two dequantize factors.
  const float alpha = nvfp4_alpha(a.gs_x, a.gs_w);
  const std::vector<float> bias = bias_f32(a.bias, N);
  QuantizedW qw;
  const bool float_w = !a.w_prepared && !a.w_values.ptr && !a.w_packed;
  if (float_w) {
    qw.pc = a.q.packed_cols(K);
    qw.ng = K / a.q.group;
    qw.codes.resize((size_t)(N * qw.pc));
    qw.sc.resize((size_t)(N * qw.ng));
    QuantizeWJob qj{&a, &qw, a.gs_w ? nvfp4_enc(*a.gs_w) : 1.0f};
    parallel_for(N, K * 4, quantize_w_range, &qj);
  }
  const int64_t total = a.x.batch() * M, chunk = std::min(total, kQmmRows);
  Scratch xd((size_t)(chunk * K)), c((size_t)(chunk * N)), crow((size_t)(a.c.ptr ? N : 0));
  for (int64_t r0 = 0; r0 < total; r0 += chunk) {
    const int64_t rows = std::min(chunk, total - r0);
    qqmm_x_rows(a, r0, rows, xd.data());
    QqmmJob j{&a, float_w ? &qw : nullptr, alpha, xd.data(), rows, bias.empty() ? nullptr : bias.data(), c.data()};
    parallel_for((N + 15) / 16, 16 * rows * K, qqmm_range, &j);
    if (a.c.ptr) {  // + beta * C in fp32, then one rounding (C may alias out: all read before a store)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t b = (r0 + r) / M, m = (r0 + r) % M;
        load_row((const char*)a.c.ptr + (a.c.offset(b) + m * a.c.ld) * dtype_size(a.c.dt), a.c.dt, N, crow.data());
        for (int64_t n = 0; n < N; ++n) c.data()[r * N + n] = std::fma(a.beta, crow.data()[n], c.data()[r * N + n]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) store_out_row(a.out, (r0 + r) / M, (r0 + r) % M, c.data() + r * N, N);
  }
  return QQ_STATUS_SUCCESS;
}

// grouped_qqmm_wgrad: per expert, x_e^T and dy_e^T (tokens along the rows'
// K axis, zero-padded to a multiple of 32) quantized row-wise - blocks along
// the tokens that start at the expert's first - then the fp32 product. The
// ends were checked by the caller.
qqStatus_t grouped_wgrad(const WgradArgs& a) {
  const float alpha = nvfp4_alpha(a.gs_x, a.gs_dy);
  const Mat* ops[2] = {&a.x, &a.dy};
  const float* gs[2] = {a.gs_x, a.gs_dy};
  for (int64_t e = 0; e < a.E; ++e) {
    const int64_t t0 = e ? a.ends[e - 1] : 0, n = a.ends[e] - t0, len = wgrad_span(n);
    std::vector<float> c(a.K * a.N, 0.0f);
    if (n > 0) {
      std::vector<float> vals[2];
      for (int o = 0; o < 2; ++o) vals[o] = qdq_tokens(*ops[o], t0, n, a.q, gs[o]);  // [C, len]
      gemm_nt(vals[0].data(), a.K, vals[1].data(), a.N, len, alpha, nullptr, c.data());
    }
    store_out(a.out, e, c.data(), a.K, a.N);
  }
  return QQ_STATUS_SUCCESS;
}

namespace {

// quantized_matmul: blocks of W's columns (w [N, K]: 16 of its rows; w [K, N]: one group of
// columns, transposed) dequantized into the scratch of the thread that multiplies them with
// a chunk of x's rows (qmm_rows).
struct QmmJob {
  const MatmulArgs* a;
  int64_t e;          // w's batch entry
  float gdec;         // nvfp4's global dequantization factor (1 otherwise)
  const float* xd;    // [rows, K], fp32
  int64_t rows;
  const float* bias;  // [N] or nullptr
  float* c;           // [rows, N]
};

// W's columns a block: 16 rows of w [N, K]; for w [K, N] one group of columns (its scales
// are along N; 64 columns instead of nvfp4's 16 took x [1, 4096] @ [4096, 4096] from 39 to
// 58 ms on a 2-core host: the block's two scratch copies outgrow the L2)
int64_t qmm_block(const MatmulArgs& a) { return a.transpose ? 16 : std::max<int64_t>(16, a.q.group); }

void qmm_range(void* ctx, int64_t nb0, int64_t nb1) {
  const QmmJob& j = *(const QmmJob*)ctx;
  const MatmulArgs& a = *j.a;
  const int64_t N = a.N, K = a.K, bw = qmm_block(a);
  Scratch wb((size_t)(bw * K)), wt(a.transpose ? 0 : (size_t)(bw * K));
  for (int64_t nb = nb0; nb < nb1; ++nb) {
    const int64_t n0 = nb * bw, n1 = std::min(n0 + bw, N);
    if (a.transpose) {
      dequantize_rows(a.w, a.w_scales, &a.w_biases, a.w_blocked, a.q, j.gdec, j.e, n0, n1 - n0, K, wb.data());
    } else {  // W[:, n0:n1] from w's rows, then transposed
      dequantize_block(a.w, a.w_scales, &a.w_biases, false, a.q, j.gdec, j.e, 0, K, n0, n1 - n0, wt.data());
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < n1 - n0; ++n) wb.data()[n * K + k] = wt.data()[k * (n1 - n0) + n];
    }
    block_dots(j.xd, j.rows, wb.data(), n0, n1, K, N, 1.0f, j.bias, j.c);
  }
}

// x's rows (b, m) that multiply weight entry e, up to kQmmRows at a time: converted to fp32,
// multiplied block by block of w's rows (qmm_range, threads over the blocks), stored.
void qmm_rows(const MatmulArgs& a, int64_t e, float gdec, const float* bias, const int64_t* bs, int64_t nb) {
  const int64_t M = a.M, N = a.N, K = a.K, total = nb * M;
  const int64_t chunk = std::min(total, kQmmRows);
  Scratch xd((size_t)(chunk * K)), c((size_t)(chunk * N));
  const int xes = dtype_size(a.x.dt);
  for (int64_t r0 = 0; r0 < total; r0 += chunk) {
    const int64_t rows = std::min(chunk, total - r0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = bs[(r0 + r) / M], m = (r0 + r) % M;
      load_row((const char*)a.x.ptr + (a.x.offset(b) + m * a.x.ld) * xes, a.x.dt, K, xd.data() + r * K);
    }
    QmmJob j{&a, e, gdec, xd.data(), rows, bias, c.data()};
    const int64_t bw = qmm_block(a);
    parallel_for((N + bw - 1) / bw, bw * rows * K, qmm_range, &j);
    for (int64_t r = 0; r < rows; ++r) store_out_row(a.out, bs[(r0 + r) / M], (r0 + r) % M, c.data() + r * N, N);
  }
}

}  // namespace

// The weight is dequantized a block of W's columns at a time inside the threads that
// multiply them (qmm_rows), for all of x's rows that use it: a few MB, where dequantizing it
// whole first took N * K * 4 bytes (1 GiB for 16384^2; twice that for w [K, N], dequantized
// then transposed) and one thread; the same sums (dot, in gemm_range's order).
qqStatus_t quantized_matmul(const MatmulArgs& a) {
  const int64_t N = a.N;
  const float gdec = a.gs_w ? nvfp4_dec(*a.gs_w) : 1.0f;
  const std::vector<float> bias = bias_f32(a.bias, N);
  const float* bp = bias.empty() ? nullptr : bias.data();
  const int64_t B = a.out.batch();
  if (B == 1) {  // one entry, one weight: nothing to group (the vectors and the sort were ~5 % of a [1, 32] call)
    const int64_t b0 = 0;
    qmm_rows(a, weight_entry(a, 0), gdec, bp, &b0, 1);
    return QQ_STATUS_SUCCESS;
  }
  // the batch entries grouped by the weight they use (the same w, scales and biases offsets:
  // a broadcast w, or gather_qmm's entries naming one expert), in entry order
  // (biases too: a w and scales broadcast where the biases are not, as expand() makes them)
  using Key = std::array<int64_t, 3>;
  std::vector<std::pair<Key, int64_t>> order((size_t)B);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t e = weight_entry(a, b);  // gather_qmm's indices were range-checked by the API
    order[(size_t)b] = {Key{a.w.offset(e), a.w_scales.offset(e), a.w_biases.ptr ? a.w_biases.offset(e) : 0}, b};
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& u, const auto& v) { return u.first < v.first; });
  std::vector<int64_t> bs;
  for (size_t i = 0; i < order.size();) {
    size_t k = i;
    bs.clear();
    while (k < order.size() && order[k].first == order[i].first) bs.push_back(order[k++].second);
    qmm_rows(a, weight_entry(a, bs[0]), gdec, bp, bs.data(), (int64_t)bs.size());
    i = k;
  }
  return QQ_STATUS_SUCCESS;
}

// The decode layout (decode_layout.h): the CPU writes and reads it element by
// element through decode_pos / decode_pack_slot, the same functions the GPU's
// conversion uses, so both produce the same bytes.
qqStatus_t to_decode_layout(const DecodeLayoutArgs& a) {
  memset(a.out, 0, (size_t)(a.E * decode_expert_bytes(a)));
  const int fk = dec_fb_k(decode_fmt(a.q));
  const int64_t slots = decode_slots(a), kfb = a.K / fk;
  for (int64_t e = 0; e < a.E; ++e)
  for (int64_t t = 0; t < slots; ++t)
    if (!decode_convert_slot(a, e, t >> 5, (int)(t & 31))) {
      const int64_t lr = (t >> 5) / kfb * 16 + ((t & 31) >> 2);  // the layout's row: w's rows below
      const int64_t row = decode_src_row(a, lr), row8 = decode_src_row(a, lr + 8);
      return set_error(QQ_STATUS_NOT_SUPPORTED, "to_decode_layout: w's rows %lld / %lld near k %lld (expert "
                       "%lld) cannot be encoded in the decode layout (%s); keep the packed weight "
                       "(docs/formats.md, Decode layout)", (long long)row, (long long)row8,
                       (long long)((t >> 5) % kfb * fk), (long long)e, decode_unencodable(a.q));
    }
  return QQ_STATUS_SUCCESS;
}

// One expert's [N, K] weight out of the decode layout into wd (row-major fp32): each element
// through decode_pos, as the layout's writer places it, with the format a template
// argument so that its divisions are shifts and its branches fold (a run-time format
// made this 2-15x slower than dequantizing the packed weight).
template <int FM> void decode_expert(const uint8_t* w, int64_t N, int64_t K, float* wd) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const DecPos p = decode_pos(FM, n, k, K);
      const uint8_t code = (uint8_t)((w[p.byte] >> p.shift) & (dec_bits8(FM) ? 255 : 15));
      float v;
      if (dec_affine(FM)) {  // as dequantize: fma(code, scale, bias)
        v = affine_decode(code, bf16_to_f((uint16_t)(w[p.sbyte] | w[p.sbyte + 1] << 8)),
                          bf16_to_f((uint16_t)(w[p.sbyte + 4] | w[p.sbyte + 5] << 8)));
      } else if (FM == kDecFp8) {  // scale code: the bf16 exponent field of s * 2^111 (0: zero codes)
        const int sc = w[p.sbyte];
        v = sc ? e4m3_decode(code) * exp2i(sc - 238) : 0.0f;  // exact
      } else {
        v = e2m1_decode(code) * decode_scale_value(w[p.sbyte]);  // exact
      }
      wd[n * K + k] = v;
    }
}

qqStatus_t decode_matmul(const DecodeMatmulArgs& a) {
  const int64_t M = a.M, N = a.N, K = a.K;
  const int fmt = decode_fmt(a.q);
  const int64_t per = decode_layout_bytes(N, K, fmt);
  std::vector<float> wd(N * K), xd(M * K), c(M * N), cw;
  std::vector<float> bias = bias_f32(a.bias, N);
  // A gated layout's rows are the weight's in decode_gated_row's order: the bias is
  // permuted into it, the product back out of it (cw, w's order). swiglu: the product
  // rounded to out's dtype (tmp), then qqSwiglu's CPU kernel on it, as the two calls.
  std::vector<uint8_t> tmp;
  if (a.gated) {
    cw.resize(M * N);
    if (!bias.empty()) {
      std::vector<float> bl(N);
      for (int64_t n = 0; n < N; ++n) bl[n] = bias[decode_gated_row(n, a.gated)];
      bias.swap(bl);
    }
    if (a.swiglu) tmp.resize((size_t)(M * N * dtype_size(a.out.dt)));
  }
  // The entries in expert order (stable), so that each expert's layout is decoded once
  // however the entries interleave (decoding costs far more than an entry's product:
  // 4000 entries over 8 experts of 512 x 1024 took 17 s decoding expert by entry).
  std::vector<std::pair<int64_t, int64_t>> order((size_t)a.B);  // (expert, entry): sorted, entry order within an expert
  for (int64_t b = 0; b < a.B; ++b)  // gather: range-checked by the API
    order[(size_t)b] = {a.gidx.ptr ? *((const int32_t*)a.gidx.ptr + a.gidx.offset(b)) : 0, b};
  std::sort(order.begin(), order.end());
  int64_t last = -2;
  for (const auto& eb : order) {
    const int64_t e = eb.first, b = eb.second;
    if (e != last) {
      const uint8_t* w = a.w + e * per;
      switch (fmt) {
        case kDecFp4: decode_expert<kDecFp4>(w, N, K, wd.data()); break;
        case kDecFp8: decode_expert<kDecFp8>(w, N, K, wd.data()); break;
        case kDecAff4: decode_expert<kDecAff4>(w, N, K, wd.data()); break;
        default: decode_expert<kDecAff8>(w, N, K, wd.data()); break;
      }
      last = e;
    }
    const char* xb = (const char*)a.x.ptr + a.x.offset(b) * dtype_size(a.x.dt);
    for (int64_t m = 0; m < M; ++m) load_row(xb + m * a.x.ld * dtype_size(a.x.dt), a.x.dt, K, xd.data() + m * K);
    gemm_nt(xd.data(), M, wd.data(), N, K, a.gs ? nvfp4_dec(*a.gs) : 1.0f, bias.empty() ? nullptr : bias.data(),
            c.data());
    const float* res = c.data();
    if (a.gated) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) cw[m * N + decode_gated_row(n, a.gated)] = c[m * N + n];
      res = cw.data();
    }
    const int64_t No = a.swiglu ? a.gated : N;  // out's columns
    Mat o = a.out;
    o.ptr = (char*)a.out.ptr + b * M * No * dtype_size(a.out.dt);
    if (!a.swiglu) {
      store_out(o, 0, res, M, N);
      continue;
    }
    o.nb = 0;
    o.rows = M;
    o.cols = o.ld = No;
    Mat t = o;  // the [M, 2F] product in out's dtype
    t.ptr = tmp.data();
    t.cols = t.ld = N;
    store_out(t, 0, res, M, N);
    QQ_TRY(swiglu(t, o));
  }
  return QQ_STATUS_SUCCESS;
}

}  // namespace cpu
}  // namespace qq
