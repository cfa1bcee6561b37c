// cuda/qmm.cu - quantized_matmul (weight-only): out = x @ W^T or x @ W,
// W = dequantize(w). The dispatch by M (thresholds in docs/api.md, measured
// in bench/results/qmm-<gpu>.md):
// - M <= kQmmaMaxM, bf16 x, fp modes: qmma.cu (tensor cores, each packed
//   weight byte read once);
// - M <= kQmvMaxM otherwise: qmv.cu (CUDA cores, every mode and dtype);
// - larger M: W dequantized once into x's dtype (bf16/fp16 for those x,
//   fp32 for fp32 x) in scratch, then one cuBLASLt GEMM with fp32
//   accumulation (gemm.cu). fp-mode weights are exact in bf16; affine
//   weights are rounded to x's dtype first, as MLX's GEMM path does (the
//   tests accept either W).
#include "common.cuh"
#include "ops.cuh"

namespace qq {
namespace cuda {
namespace {

// The single matrix of `m` at batch index b, as a Mat without batch dims.
Mat entry(const Mat& m, int64_t b) {
  Mat e = m;
  e.ptr = (char*)m.ptr + m.offset(b) * dtype_size(m.dt);
  e.nb = 0;
  return e;
}

bool same_entry(const Mat& m, int64_t b0, int64_t b1) { return !m.ptr || m.offset(b0) == m.offset(b1); }

// x's batch entries lie M * ld apart in order, so the batch folds into rows.
bool foldable(const Mat& x) {
  int64_t expect = x.rows * x.ld;
  for (int i = x.nb - 1; i >= 0; --i) {
    if (x.bshape[i] != 1 && x.bstride[i] != expect) return false;
    expect *= x.bshape[i];
  }
  return true;
}

}  // namespace

qqStatus_t quantized_matmul(qqHandle_t h, const MatmulArgs& a, void* stream) {
  qqContext* c = nullptr;
  QQ_TRY(resolve_handle("quantized_matmul", h, a.out.device, &c));
  return on_device(c->device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    if (a.M <= kQmmaMaxM) {  // bf16 x, fp modes: the tensor-core kernel
      const qqStatus_t s = qmma(a, nullptr, st, c);
      if (s != QQ_STATUS_NOT_SUPPORTED) return routed(s, QQ_ROUTE_QMMA);
    }
    if (a.M <= kQmvMaxM) {
      const qqStatus_t s = qmv(a, st);
      if (s != QQ_STATUS_NOT_SUPPORTED) return routed(s, QQ_ROUTE_QMV);
    }
    if (a.gidx.ptr) {
      // gather_qmm beyond the tensor-core kernel (other x dtypes, modes or M): qmv
      // over slices of kQmvMaxM rows, ceil(M / 4) launches whatever E is; the
      // dequantize + GEMM route below would need the indices on the host.
      for (int64_t m0 = 0; m0 < a.M; m0 += kQmvMaxM) {
        MatmulArgs part = a;
        part.M = a.M - m0 < kQmvMaxM ? a.M - m0 : kQmvMaxM;
        part.x.ptr = (char*)a.x.ptr + m0 * a.x.ld * dtype_size(a.x.dt);
        part.out.ptr = (char*)a.out.ptr + m0 * a.out.ld * dtype_size(a.out.dt);
        const qqStatus_t s = qmv(part, st);
        if (s == QQ_STATUS_NOT_SUPPORTED)
          return set_error(s, "gather_qmm: no GPU kernel takes this weight (mode %d, %d bits, group %d)",
                           (int)a.q.mode, a.q.bits, a.q.group);
        QQ_TRY(s);
      }
      return routed(QQ_STATUS_SUCCESS, QQ_ROUTE_QMV);
    }
    Scratch scratch(c, st);
    const int64_t M = a.M, N = a.N, K = a.K;
    Gemm eb;  // the epilogue's bias, prepared once for every batch entry
    eb.d = a.out.dt;
    eb.N = N;
    QQ_TRY(gemm_bias("quantized_matmul", a.bias, &eb, scratch, st));
    const DType wt = a.x.dt;  // the GEMM's input type
    void* wd = nullptr;
    QQ_TRY(scratch.get("quantized_matmul", (size_t)(N * K) * dtype_size(wt), &wd));
    const int64_t nbatch = a.out.batch();
    // w broadcast over every batch entry: one dequantize, and x's batch folded
    // into M when its rows lie evenly spaced.
    bool w_shared = true;
    for (int64_t b = 1; b < nbatch && w_shared; ++b)
      w_shared = same_entry(a.w, 0, b) && same_entry(a.w_scales, 0, b) && same_entry(a.w_biases, 0, b);
    const bool fold = w_shared && foldable(a.x);
    for (int64_t b = 0; b < nbatch; ++b) {
      if (b == 0 || !w_shared) {
        DequantizeArgs d{};
        d.data = entry(a.w, b);
        d.scales = entry(a.w_scales, b);
        d.biases = a.w_biases.ptr ? entry(a.w_biases, b) : Mat{};
        const int64_t rows = a.transpose ? N : K, cols = a.transpose ? K : N;
        d.out.ptr = wd;
        d.out.dt = wt;
        d.out.device = a.out.device;
        d.out.rows = rows;
        d.out.cols = cols;
        d.out.ld = cols;
        d.gs = a.gs_w;
        d.q = a.q;
        d.q.blocked = a.w_blocked;
        QQ_TRY(dequantize(c, d, st));
      }
      Gemm g;
      g.M = fold ? M * nbatch : M;
      g.N = N;
      g.K = K;
      g.ab = wt;
      g.d = a.out.dt;
      g.A = (const char*)a.x.ptr + a.x.offset(b) * dtype_size(a.x.dt);
      g.lda = a.x.ld;
      g.B = wd;
      g.ldb = a.transpose ? K : N;
      g.b_trans = a.transpose;
      g.D = (char*)a.out.ptr + b * M * N * dtype_size(a.out.dt);
      g.ldd = N;
      g.bias = eb.bias;
      g.bias_dt = eb.bias_dt;
      QQ_TRY(gemm(c, g, st));
      if (fold) break;
    }
    set_route(QQ_ROUTE_EXACT);  // dequantize + GEMM
    return QQ_STATUS_SUCCESS;
  });
}

}  // namespace cuda
}  // namespace qq
