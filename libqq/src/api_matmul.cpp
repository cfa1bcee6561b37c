// api_matmul.cpp - the C entry points that multiply: qqQqmm (one product,
// or one per entry of a batched w), qqGroupedQqmm (one per expert),
// qqQuantizedMatmul (float x times packed w) and qqGatherQmm (the same with
// each batch entry's weight picked from [E, ...] by a device-side index).
//
// Each checks every argument through the validation layer (validate.h),
// builds the views of internal.h and dispatches on the device: cpu/matmul.cpp
// or the CUDA dispatch (cuda/qqmm.cu, cuda/qmm.cu). The batched and grouped
// forms split their tensors into per-entry DLTensor views and validate each
// entry exactly as a single qqmm would.
#include <string.h>

#include <string>
#include <vector>

#include "codec.h"
#include "decode_layout.h"
#include "internal.h"
#include "validate.h"

namespace qq {
namespace {

// A DLTensor view of part of another: rows [r0, r0+n) of dim 0 (drop = false)
// or entry r0 of dim 0 with that dim removed (drop = true). The view owns its
// shape and strides.
struct SubTensor {
  DLTensor t;
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];
  SubTensor(const DLTensor* src, int64_t r0, int64_t n, bool drop) {
    t = *src;
    const int64_t es = (src->dtype.bits * src->dtype.lanes + 7) / 8;
    const int64_t s0 = src->ndim ? stride_of(src, 0) : 0;  // (a 0-d tensor has no dim 0: its caller refuses it)
    t.byte_offset = src->byte_offset + (uint64_t)(r0 * s0 * es);
    const int off = drop && src->ndim ? 1 : 0;
    t.ndim = src->ndim - off;
    for (int i = 0; i < t.ndim; ++i) {
      shape[i] = src->shape[i + off];
      strides[i] = stride_of(src, i + off);
    }
    if (!drop) shape[0] = n;
    if (numel(src) == 0) {  // an empty tensor's strides mean nothing (NumPy reports 0s): compact ones
      int64_t st = 1;
      for (int i = t.ndim - 1; i >= 0; --i) {
        strides[i] = st;
        st *= shape[i] > 1 ? shape[i] : 1;
      }
    }
    t.shape = shape;
    t.strides = strides;
  }
};

// A 2-D tensor with stride 1 on its first axis and not on its last: the
// transposed view of a row-major matrix (t.T), which qqmm's GEMM reads with
// op T where the operand is prepared (q's values).
bool transposed_view(const DLTensor* t) {
  return t->ndim == 2 && t->strides && t->shape[1] > 1 && t->strides[1] != 1 &&
         (t->shape[0] == 1 || t->strides[0] == 1) && numel(t) > 0;
}

// One qqmm with a 2D (or unbatched) w: validation, then the backend when
// `run`. The batched and grouped forms call it per entry, and with run =
// false to validate an empty batch.
qqStatus_t qqmm_single(Ctx& c, qqHandle_t handle, const DLTensor* x, const DLTensor* x_scales, const DLTensor* w,
                       const DLTensor* w_scales, const qqQqmmParams_t& p, const DLTensor* global_scale_x,
                       const DLTensor* global_scale_w, const DLTensor* bias, DLTensor* out, void* stream,
                       bool run, MatmulArgs* args_out = nullptr) {
  MatmulArgs a{};
  qqQuantParams_t qp = p.quant;
  qp.scale_layout = QQ_SCALE_LINEAR;
  QQ_TRY(resolve_params(c, &qp, &a.q));
  if (a.q.mode == QQ_MODE_AFFINE)
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "qqmm: mode affine is not supported (qqmm quantizes both operands with fp formats); use "
                     "quantized_matmul for affine weights, or mode nvfp4, mxfp4 or mxfp8");
  for (int which = 0; which < 2; ++which) {
    const char* nm = which ? "w" : "x";
    const char* snm = which ? "scales" : "x_scales";
    const DLTensor* t = which ? w : x;
    const DLTensor* st = which ? w_scales : x_scales;
    const int lay = raw_enum(which ? p.w_scale_layout : p.x_scale_layout);
    // (checked for every operand, as every enum is: a float operand ignores it, but a value
    // outside the enum is the caller's error wherever it is)
    if (lay != QQ_SCALE_LINEAR && lay != QQ_SCALE_BLOCKED)
      return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: unknown scale layout %d for '%s'", (int)lay, snm);
    DType dt;
    QQ_TRY(check_tensor(c, nm, t, &dt));
    const bool prepared = which ? p.w_prepared : p.x_prepared;
    if (prepared && dt == DType::U8)
      return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: %s_prepared is set but '%s' is packed (1-byte codes); a "
                       "prepared %s is a float tensor of q(%s)'s values (qq.quantize_dequantize, qq.prepare_weight), "
                       "or clear %s_prepared", nm, nm, nm, nm, nm);
    if (t->ndim < 1 || (which && t->ndim != 2))
      return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: argument '%s' has shape %s; expected %s", nm,
                       shape_str(t->ndim, t->shape).c_str(), which ? "[N, K] or [B, N, K]" : "[..., M, K]");
    Mat& m = which ? a.w : a.x;
    Mat& sm = which ? a.w_scales : a.x_scales;
    if (prepared && transposed_view(t)) {  // the stored [K, rows] matrix, read with op T
      DLTensor s = *t;
      int64_t sh[2] = {t->shape[1], t->shape[0]}, sd[2] = {t->strides[1], t->strides[0]};
      s.shape = sh;
      s.strides = sd;
      QQ_TRY(to_mat(c, nm, &s, dt, &m));
      (which ? a.w_trans : a.x_trans) = true;
    } else {
      QQ_TRY(to_mat(c, nm, t, dt, &m));
    }
    int64_t fshape[kMaxDims];
    for (int i = 0; i < t->ndim; ++i) fshape[i] = t->shape[i];
    if (dt == DType::U8) {
      QQ_TRY(check_byte_kind(c, nm, t, a.q, ByteRole::DATA));
      if ((fshape[t->ndim - 1] * 8) % a.q.bits)
        return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: argument '%s' is packed but its row of %lld bytes is not "
                         "a whole number of elements", nm, (long long)fshape[t->ndim - 1]);
      fshape[t->ndim - 1] = fshape[t->ndim - 1] * 8 / a.q.bits;
      QSpec sq = a.q;
      sq.blocked = lay == QQ_SCALE_BLOCKED;
      QQ_TRY(check_k(c, nm, "K", fshape[t->ndim - 1], a.q));
      QQ_TRY(input_scales(c, snm, st, sq, t->ndim, fshape, DType::U8, false, &sm));
      if (sq.blocked) blocked_batch_strides(&sm);
      (which ? a.w_packed : a.x_packed) = true;
      (which ? a.w_blocked : a.x_blocked) = sq.blocked;
    } else {
      QQ_TRY(expect_float(c, nm, t, dt));
      if (!prepared) QQ_TRY(check_k(c, nm, "K", fshape[t->ndim - 1], a.q));  // (q's values: any K)
      if (prepared) (which ? a.w_prepared : a.x_prepared) = true;
      if (st)
        return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: argument '%s' is given but '%s' is a float tensor (it "
                         "is quantized on the fly); pass packed uint8 data with its scales, or drop '%s'",
                         snm, nm, snm);
    }
    if (which) { a.N = fshape[0]; if (a.K != fshape[1])
        return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: K of 'x' (%lld) and 'w' (%lld) differ", (long long)a.K,
                         (long long)fshape[1]); }
    else { a.K = fshape[t->ndim - 1]; a.M = t->ndim >= 2 ? fshape[t->ndim - 2] : 1; }
  }
  if (p.w_values) {  // q(w)'s values next to the packed w (qq.prepare_weight)
    if (p.w_prepared || !a.w_packed)
      return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: 'w_values' goes with a packed w (uint8 data and its "
                       "scales); got %s; pass the packed weight as w, or drop w_values",
                       p.w_prepared ? "w_prepared set as well" : "a float w");
    DType vdt;
    QQ_TRY(check_tensor(c, "w_values", p.w_values, &vdt));
    QQ_TRY(expect_float(c, "w_values", p.w_values, vdt));
    const int64_t vshape[2] = {a.N, a.K};
    QQ_TRY(expect_shape(c, "w_values", p.w_values, 2, vshape, "[N, K], w's logical shape"));
    QQ_TRY(to_mat(c, "w_values", p.w_values, vdt, &a.w_values));
  }
  QQ_TRY(global_scale_ptr(c, "global_scale_x", global_scale_x, a.q, &a.gs_x));
  QQ_TRY(global_scale_ptr(c, "global_scale_w", global_scale_w, a.q, &a.gs_w));
  QQ_TRY(bias_mat(c, bias, a.N, &a.bias));
  int64_t oshape[kMaxDims];
  for (int i = 0; i < x->ndim; ++i) oshape[i] = x->shape[i];
  oshape[x->ndim - 1] = a.N;
  QQ_TRY(output_mat(c, "out", out, x->ndim, oshape, -1, "[..., M, N]", &a.out));
  if (p.c && p.beta != 0.0f) {  // beta * C: out's shape, a float, out's device
    DType cdt;
    QQ_TRY(check_tensor(c, "c", p.c, &cdt));
    QQ_TRY(expect_float(c, "c", p.c, cdt));
    QQ_TRY(expect_shape(c, "c", p.c, x->ndim, oshape, "out's shape"));
    QQ_TRY(to_mat(c, "c", p.c, cdt, &a.c));
    a.beta = p.beta;
  }
  QQ_TRY(check_route(c.op, raw_enum(p.route), c.device));
  a.route = p.route;
  if (!run) return QQ_STATUS_SUCCESS;  // validation only (an empty batch): nothing is read or written
  QQ_TRY(check_no_alias(c, {{"out", out}}, {{"x", x}, {"x_scales", x_scales}, {"w", w}, {"w_scales", w_scales},
                                           {"global_scale_x", global_scale_x}, {"global_scale_w", global_scale_w},
                                           {"bias", bias}, {"w_values", p.w_values}}));
  // C may be out itself (accumulate in place: every backend reads C and
  // writes out element by element), but not a different view of its memory.
  if (a.beta != 0.0f && overlap(out, p.c) && !same_view(out, p.c))
    return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: 'c' overlaps 'out' without being the same tensor; pass "
                     "out=c exactly (in place) or separate buffers");
  if (args_out) {  // validated, not run: the caller dispatches (grouped_qqmm's one-launch path)
    *args_out = a;
    return QQ_STATUS_SUCCESS;
  }
  if (a.M * a.N * a.x.batch() == 0) return QQ_STATUS_SUCCESS;
  if (c.device < 0) return routed(cpu::qqmm(a), QQ_ROUTE_CPU);
  return cuda::qqmm(handle, a, stream);
}

// quantized_matmul, and gather_qmm when `indices` is given: w is [E, ...] and batch
// entry b of out multiplies x's entry b by expert indices[b] (x's batch and the
// indices broadcast together).
// gather_qmm's expert indices (int32, any shape and strides) as a batch-only Mat, their
// shape broadcast with x's batch (NumPy rules) into nb / bshape, both Mats aligned to it.
qqStatus_t gather_indices(Ctx& c, const DLTensor* indices, Mat* x, Mat* g, int* nb, int64_t* bshape) {
  DType idt;
  QQ_TRY(check_tensor(c, "rhs_indices", indices, &idt));
  if (idt != DType::I32)
    return set_error(QQ_STATUS_INVALID_DTYPE, "%s: argument 'rhs_indices' must be int32 (expert indices); got %s",
                     c.op, dtype_str(indices->dtype).c_str());
  if (indices->ndim > kMaxDims - 2)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'rhs_indices' has %d dimensions; at most %d", c.op,
                     indices->ndim, kMaxDims - 2);
  g->ptr = (char*)indices->data + indices->byte_offset;
  g->dt = DType::I32;
  g->device = c.device;
  g->rows = g->cols = g->ld = 1;
  g->nb = indices->ndim;
  for (int i = 0; i < g->nb; ++i) {
    g->bshape[i] = indices->shape[i];
    g->bstride[i] = indices->shape[i] == 1 ? 0 : stride_of(indices, i);
  }
  QQ_TRY(broadcast_batch(c, x, g, nb, bshape, "rhs_indices"));
  align_batch(x, *nb, bshape);
  align_batch(g, *nb, bshape);
  return QQ_STATUS_SUCCESS;
}

qqStatus_t weight_only_matmul(const char* op, qqHandle_t handle, const DLTensor* x, const DLTensor* w,
                              const DLTensor* scales, const DLTensor* biases, const DLTensor* indices,
                              const qqQuantParams_t* params, int transpose, const DLTensor* global_scale,
                              const DLTensor* bias, DLTensor* out, void* stream) {
  set_route(QQ_ROUTE_AUTO);
  Ctx c{op};
  MatmulArgs a{};
  QQ_TRY(resolve_params(c, params, &a.q));
  a.transpose = transpose != 0;
  a.x_packed = false;
  a.w_packed = true;
  if (!a.transpose && a.q.blocked)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: blocked scales need transpose=True (groups along K); use "
                     "linear scales with transpose=False", op);
  DType xdt, wdt;
  QQ_TRY(check_tensor(c, "x", x, &xdt));
  QQ_TRY(expect_float(c, "x", x, xdt));
  QQ_TRY(check_tensor(c, "w", w, &wdt));
  QQ_TRY(expect_bytes(c, "w", w, wdt, "packed quantized weights"));
  QQ_TRY(check_byte_kind(c, "w", w, a.q, ByteRole::DATA));
  if (x->ndim < 1 || w->ndim < 2)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: 'x' must be [..., M, K] and 'w' [..., N, K*bits/8] "
                     "(transpose) or [..., K, N*bits/8]; got x %s, w %s", op,
                     shape_str(x->ndim, x->shape).c_str(), shape_str(w->ndim, w->shape).c_str());
  if (indices && (x->ndim < 2 || w->ndim != 3))
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: 'x' must be [..., M, K] and 'w' the experts' packed weights "
                     "[E, N, K*bits/8] (transpose) or [E, K, N*bits/8]; got x %s, w %s", op,
                     shape_str(x->ndim, x->shape).c_str(), shape_str(w->ndim, w->shape).c_str());
  QQ_TRY(to_mat(c, "x", x, xdt, &a.x));
  QQ_TRY(to_mat(c, "w", w, wdt, &a.w));
  a.K = x->shape[x->ndim - 1];
  a.M = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1;
  const int64_t wr = w->shape[w->ndim - 2], wc = w->shape[w->ndim - 1];
  if ((wc * 8) % a.q.bits)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'w' has %lld bytes per row, not a whole number of "
                     "%d-bit elements", op, (long long)wc, a.q.bits);
  const int64_t wcols = wc * 8 / a.q.bits;  // logical columns of w
  if (a.transpose) {
    a.N = wr;
    if (wcols != a.K)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: 'x' has K=%lld but 'w' (transpose=True, [N, K*bits/8]) "
                       "holds %lld columns", op, (long long)a.K, (long long)wcols);
  } else {
    a.N = wcols;
    if (wr != a.K)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: 'x' has K=%lld but 'w' (transpose=False, [K, N*bits/8]) "
                       "has %lld rows", op, (long long)a.K, (long long)wr);
  }
  QQ_TRY(check_k(c, "w", a.transpose ? "K" : "N", wcols, a.q));
  int64_t fshape[kMaxDims];
  for (int i = 0; i < w->ndim; ++i) fshape[i] = w->shape[i];
  fshape[w->ndim - 1] = wcols;
  QQ_TRY(input_scales(c, "scales", scales, a.q, w->ndim, fshape, DType::U8, false, &a.w_scales));
  if (a.q.blocked) blocked_batch_strides(&a.w_scales);
  a.w_blocked = a.q.blocked;
  QQ_TRY(input_biases(c, biases, a.q, w->ndim, fshape, a.w_scales.dt, &a.w_biases));
  QQ_TRY(global_scale_ptr(c, "global_scale", global_scale, a.q, &a.gs_w));
  QQ_TRY(bias_mat(c, bias, a.N, &a.bias));
  int nb;
  int64_t bshape[kMaxDims];
  if (indices) {
    // The indices as a batch-only Mat (one int32 per entry), broadcast with x's batch;
    // w keeps its own batch [E], indexed through them (weight_entry).
    QQ_TRY(gather_indices(c, indices, &a.x, &a.gidx, &nb, bshape));
  } else {
    QQ_TRY(broadcast_batch(c, &a.x, &a.w, &nb, bshape));
    align_batch(&a.x, nb, bshape);
    align_batch(&a.w, nb, bshape);
    align_batch(&a.w_scales, nb, bshape);
    if (a.w_biases.ptr) align_batch(&a.w_biases, nb, bshape);
  }
  int64_t oshape[kMaxDims];
  int ond = 0;
  for (int i = 0; i < nb; ++i) oshape[ond++] = bshape[i];
  if (x->ndim >= 2) oshape[ond++] = a.M;
  oshape[ond++] = a.N;
  QQ_TRY(output_mat(c, "out", out, ond, oshape, -1, "[broadcast batch..., M, N]", &a.out));
  QQ_TRY(check_no_alias(c, {{"out", out}}, {{"x", x}, {"w", w}, {"scales", scales}, {"biases", biases},
                                           {"global_scale", global_scale}, {"bias", bias},
                                           {"rhs_indices", indices}}));
  // The output Mat indexes batches like x and w do: out is compact.
  a.out.nb = nb;
  {
    int64_t st = a.M * a.N;
    for (int i = nb - 1; i >= 0; --i) {
      a.out.bshape[i] = bshape[i];
      a.out.bstride[i] = st;
      st *= bshape[i];
    }
    a.out.rows = a.M;
    a.out.cols = a.N;
    a.out.ld = a.N;
  }
  if (a.M * a.N * a.out.batch() == 0) return QQ_STATUS_SUCCESS;
  if (c.device < 0) {
    if (indices) {  // the CPU can refuse a bad index; the GPU kernels write NaN rows instead
      for (int64_t b = 0; b < a.out.batch(); ++b)
        if (weight_entry(a, b) < 0)
          return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'rhs_indices' holds %d at batch entry %lld; "
                           "expert indices must lie in [0, E=%lld)", op,
                           *((const int32_t*)a.gidx.ptr + a.gidx.offset(b)), (long long)b, (long long)a.w.bshape[0]);
    }
    return routed(cpu::quantized_matmul(a), QQ_ROUTE_CPU);
  }
  return cuda::quantized_matmul(handle, a, stream);
}

}  // namespace
}  // namespace qq

using namespace qq;

extern "C" {

QQ_API qqStatus_t qqQqmm(qqHandle_t handle, const DLTensor* x, const DLTensor* x_scales, const DLTensor* w,
                         const DLTensor* w_scales, const qqQqmmParams_t* params, const DLTensor* global_scale_x,
                         const DLTensor* global_scale_w, const DLTensor* bias, DLTensor* out, void* stream) {
  return guard("qqmm", [&]() -> qqStatus_t {
    set_route(QQ_ROUTE_AUTO);
    Ctx c{"qqmm"};
    qqQqmmParams_t p;
    QQ_TRY(read_qqmm_params(c, params, &p));
    // Every tensor whose shape the batch split reads is checked first.
    QQ_TRY(check_header(c, "x", x));
    QQ_TRY(check_header(c, "w", w));
    QQ_TRY(check_header(c, "out", out));
    if (x_scales) QQ_TRY(check_header(c, "x_scales", x_scales));
    if (w_scales) QQ_TRY(check_header(c, "w_scales", w_scales));
    const bool has_c = p.c && p.beta != 0.0f;
    if (has_c) QQ_TRY(check_header(c, "c", p.c));
    if (w->ndim != 3)
      return qqmm_single(c, handle, x, x_scales, w, w_scales, p, global_scale_x, global_scale_w, bias, out, stream,
                         true);
    // A batched weight [B, N, K] with x [B, M, K] (or [M, K], shared): one qqmm per entry.
    if (p.w_values)
      return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: 'w_values' goes with a 2-D w [N, K]; got a batched w %s; "
                       "drop w_values", shape_str(w->ndim, w->shape).c_str());
    const int64_t B = w->shape[0];
    const bool xb = x->ndim == 3;
    if ((x->ndim != 2 && !xb) || (xb && x->shape[0] != B) || out->ndim != 3 || out->shape[0] != B ||
        (w_scales && (w_scales->ndim != 3 || w_scales->shape[0] != B)) ||
        (x_scales && xb && (x_scales->ndim != 3 || x_scales->shape[0] != B)))
      return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: with a batched 'w' %s, 'x' must be [B=%lld, M, K] or "
                       "[M, K], 'out' [B, M, N] and the scales one matrix per entry; got x %s, out %s",
                       shape_str(w->ndim, w->shape).c_str(), (long long)B, shape_str(x->ndim, x->shape).c_str(),
                       shape_str(out->ndim, out->shape).c_str());
    if (has_c && (p.c->ndim != 3 || p.c->shape[0] != B))
      return set_error(QQ_STATUS_INVALID_VALUE, "qqmm: 'c' has shape %s; expected out's shape [B=%lld, M, N]",
                       shape_str(p.c->ndim, p.c->shape).c_str(), (long long)B);
    // An empty batch still validates every argument (as entry 0 would be).
    for (int64_t b = 0; b < (B ? B : 1); ++b) {
      SubTensor ws(w, b, 0, true), os(out, b, 0, true);
      SubTensor wss(w_scales ? w_scales : w, b, 0, true);
      SubTensor xs(x, xb ? b : 0, x->ndim ? x->shape[0] : 0, xb);
      SubTensor xss(x_scales ? x_scales : x, xb ? b : 0, x_scales && x_scales->ndim ? x_scales->shape[0] : 0, xb);
      qqQqmmParams_t pb = p;  // C, like out, one [M, N] matrix per entry
      SubTensor cs(has_c ? p.c : out, b, 0, true);
      pb.c = has_c ? &cs.t : nullptr;
      if (B == 0) {  // the entry is virtual: a stand-in address (never read) for a NULL data pointer
        static double stand_in;
        for (SubTensor* v : {&ws, &os, &wss, &xs, &xss, &cs})
          if (!v->t.data) v->t.data = &stand_in;
      }
      const qqStatus_t st = qqmm_single(c, handle, &xs.t, x_scales ? &xss.t : nullptr, &ws.t,
                                        w_scales ? &wss.t : nullptr, pb, global_scale_x, global_scale_w, bias,
                                        &os.t, stream, B > 0);
      if (st != QQ_STATUS_SUCCESS) {
        const std::string msg = last_error();
        const char* inner = msg.c_str() + (msg.compare(0, 6, "qqmm: ") == 0 ? 6 : 0);
        return B ? set_error(st, "qqmm: batch entry %lld of 'w': %s", (long long)b, inner)
                 : set_error(st, "qqmm: (an empty batch, checked as one entry) %s", inner);
      }
    }
    return QQ_STATUS_SUCCESS;
  });
}


QQ_API qqStatus_t qqGroupedQqmm(qqHandle_t handle, const DLTensor* x, const DLTensor* x_scales,
                                const DLTensor* offsets, const DLTensor* w, const DLTensor* w_scales,
                                const qqQqmmParams_t* params, const DLTensor* global_scale_x,
                                const DLTensor* global_scale_w, DLTensor* out, void* stream) {
  return guard("grouped_qqmm", [&]() -> qqStatus_t {
    Ctx c{"grouped_qqmm"};
    qqQqmmParams_t p;
    QQ_TRY(read_qqmm_params(c, params, &p));
    if (p.c && p.beta != 0.0f)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: params.c (beta * C) is not supported; add C to the "
                       "result yourself, or leave params.c NULL / params.beta 0");
    if (p.w_values)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: params.w_values is not supported (it holds one "
                       "2-D weight's values); leave it NULL");
    if (p.x_prepared)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: params.x_prepared is not supported (x is quantized "
                       "per expert segment here); pass x itself and leave x_prepared 0");
    DType dt;
    QQ_TRY(check_tensor(c, "x", x, &dt));
    if (x->ndim != 2)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: argument 'x' has shape %s; expected [T, K] (tokens "
                       "sorted by expert)", shape_str(x->ndim, x->shape).c_str());
    const bool x_packed = dt == DType::U8;
    if (x_packed && raw_enum(p.x_scale_layout) != QQ_SCALE_LINEAR)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: a packed 'x' needs linear x_scales (blocked scales "
                       "pad each 128 rows and cannot be split at the group boundaries); pass linear scales or a "
                       "float x");
    QQ_TRY(check_tensor(c, "offsets", offsets, &dt));
    if (dt != DType::I32 || offsets->ndim != 1)
      return set_error(dt != DType::I32 ? QQ_STATUS_INVALID_DTYPE : QQ_STATUS_INVALID_VALUE,
                       "grouped_qqmm: argument 'offsets' must be int32 [E] (cumulative "
                       "group ends); got %s %s", dtype_str(offsets->dtype).c_str(),
                       shape_str(offsets->ndim, offsets->shape).c_str());
    const int64_t E = offsets->shape[0], T = x->shape[0];
    // Each expert reads rows [offsets[e-1], offsets[e]) of x_scales: it must
    // have x's T rows (the per-expert views cannot see past their slice).
    if (x_scales) {
      QQ_TRY(check_tensor(c, "x_scales", x_scales, &dt));
      if (!x_packed)
        return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: argument 'x_scales' is given but 'x' is a float "
                         "tensor (it is quantized on the fly); pass packed uint8 x with its scales, or drop "
                         "'x_scales'");
      if (x_scales->ndim != 2 || x_scales->shape[0] != T)
        return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: argument 'x_scales' has shape %s; expected [T=%lld, "
                         "K/group] (linear, one row per token of 'x')", shape_str(x_scales->ndim,
                         x_scales->shape).c_str(), (long long)T);
    } else if (x_packed) {
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: argument 'x_scales' is required when 'x' is packed "
                       "uint8 data");
    }
    QQ_TRY(check_tensor(c, "w", w, &dt));
    if (w->ndim != 3 || w->shape[0] != E)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: argument 'w' has shape %s; expected [E=%lld, N, K] "
                       "(or packed [E, N, K*bits/8]): E experts, one a group end of 'offsets' (%lld entries)",
                       shape_str(w->ndim, w->shape).c_str(), (long long)E, (long long)E);
    if (w_scales) {
      QQ_TRY(check_tensor(c, "scales", w_scales, &dt));
      if (w_scales->ndim != 3 || w_scales->shape[0] != E)
        return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: argument 'scales' has shape %s; expected one "
                         "scale matrix per expert, [E=%lld, ...]", shape_str(w_scales->ndim, w_scales->shape).c_str(),
                         (long long)E);
    }
    if (global_scale_w) {
      QQ_TRY(check_tensor(c, "global_scale_w", global_scale_w, &dt));
      if (dt != DType::F32 || (numel(global_scale_w) != E && numel(global_scale_w) != 1) || global_scale_w->ndim > 1)
        return set_error(dt != DType::F32 ? QQ_STATUS_INVALID_DTYPE : QQ_STATUS_INVALID_VALUE,
                         "grouped_qqmm: argument 'global_scale_w' must be float32 [E=%lld] "
                         "(one global scale per expert) or one scale for all; got %s %s", (long long)E,
                         dtype_str(global_scale_w->dtype).c_str(),
                         shape_str(global_scale_w->ndim, global_scale_w->shape).c_str());
      // Host scales are read here, every expert's (an empty expert's is never read by its
      // qqmm, but a negative or NaN entry is the caller's error all the same); for another
      // mode than nvfp4 the qqmm check below refuses the global scale itself
      if (c.device < 0 && raw_enum(p.quant.mode) == QQ_MODE_NVFP4) {
        const float* g = (const float*)((const char*)global_scale_w->data + global_scale_w->byte_offset);
        const int64_t n = numel(global_scale_w), gst = global_scale_w->ndim ? stride_of(global_scale_w, 0) : 0;
        for (int64_t e = 0; e < n; ++e) QQ_TRY(check_host_global_scale(c, "global_scale_w", g[e * gst], e));
      }
    }
    QQ_TRY(check_output(c, "out", out, true, &dt));
    if (out->ndim != 2 || out->shape[0] != T)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: argument 'out' has shape %s; expected [T=%lld, N]",
                       shape_str(out->ndim, out->shape).c_str(), (long long)T);
    QQ_TRY(check_no_alias(c, {{"out", out}}, {{"x", x}, {"x_scales", x_scales}, {"offsets", offsets}, {"w", w},
                                             {"scales", w_scales}, {"global_scale_x", global_scale_x},
                                             {"global_scale_w", global_scale_w}}));
    if (stride_of(offsets, 0) != 1 && E > 1)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm: argument 'offsets' must be contiguous");
    const void* src = (const char*)offsets->data + offsets->byte_offset;
    // Hopper: every expert in one grouped GEMM, the ends read on the device
    // (cuda::grouped_qqmm). Validated as one qqmm of all T tokens against
    // expert 0's weight; the other experts are views of the same tensors.
    const bool one_gw = global_scale_w && numel(global_scale_w) == 1;  // one scale for every expert
    bool checked = false;  // the arguments checked as expert 0's qqmm of all T tokens
    if (c.device >= 0 && T > 0 && E > 0 && (!global_scale_w || one_gw || stride_of(global_scale_w, 0) == 1)) {
      SubTensor ws(w, 0, 0, true), wss(w_scales ? w_scales : w, 0, 0, true);
      SubTensor gws(global_scale_w && !one_gw ? global_scale_w : offsets, 0, 0, true);
      const DLTensor* gw = one_gw ? global_scale_w : (global_scale_w ? &gws.t : nullptr);
      MatmulArgs a;
      Ctx ce{"qqmm"};
      const qqStatus_t st = qqmm_single(ce, handle, x, x_scales, &ws.t, w_scales ? &wss.t : nullptr, p,
                                        global_scale_x, gw, nullptr, out, stream, true, &a);
      if (st != QQ_STATUS_SUCCESS) {
        const std::string msg = last_error();
        return set_error(st, "grouped_qqmm: expert 0: %s", msg.c_str());
      }
      checked = true;
      a.w.nb = 1;
      a.w.bshape[0] = E;
      a.w.bstride[0] = stride_of(w, 0);
      if (a.w_scales.ptr) {
        a.w_scales.nb = 1;
        a.w_scales.bshape[0] = E;
        a.w_scales.bstride[0] = stride_of(w_scales, 0);
      }
      bool taken = false;
      QQ_TRY(cuda::grouped_qqmm(handle, a, one_gw ? 0 : 1, (const int32_t*)src, E, stream, &taken));
      if (taken) return QQ_STATUS_SUCCESS;
    }
    // Elsewhere the group ends are read on the host, and each expert runs as a qqmm. The
    // arguments are checked first as expert 0's qqmm of all T tokens (as the Hopper path
    // does): a wrong 'out' is then named by its own shape, not by an expert's rows of it.
    // With no experts (E = 0) that expert is virtual, as an empty qqmm batch's entry: the
    // arguments are still checked, with a stand-in address (never read) for NULL data.
    if (!checked && (T > 0 || E == 0)) {
      SubTensor ws(w, 0, 0, true), wss(w_scales ? w_scales : w, 0, 0, true);
      SubTensor gws(global_scale_w && !one_gw ? global_scale_w : offsets, 0, 0, true);
      const DLTensor* gw = one_gw ? global_scale_w : (global_scale_w ? &gws.t : nullptr);
      if (E == 0) {
        static double stand_in;
        for (SubTensor* v : {&ws, &wss, &gws})
          if (!v->t.data) v->t.data = &stand_in;
      }
      Ctx ce{"qqmm"};
      const qqStatus_t st = qqmm_single(ce, handle, x, x_scales, &ws.t, w_scales ? &wss.t : nullptr, p,
                                        global_scale_x, gw, nullptr, out, stream, false);
      if (st != QQ_STATUS_SUCCESS) {
        const std::string msg = last_error();
        return set_error(st, "grouped_qqmm: expert 0: %s", msg.c_str());
      }
    }
    std::vector<int32_t> ends(E);
    if (E > 0) {
      if (c.device < 0) memcpy(ends.data(), src, E * sizeof(int32_t));
      else QQ_TRY(cuda::copy_to_host(c.device, src, E * sizeof(int32_t), ends.data(), stream));
    }
    QQ_TRY(check_group_ends("grouped_qqmm", ends.data(), E, T));
    int32_t prev = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = prev, n = ends[e] - prev;
      prev = ends[e];
      // Empty groups are skipped, but when no group has a token (T = 0) the
      // arguments are still validated, as expert 0 would see them.
      const bool check_only = T == 0 && e == 0;
      if (n == 0 && !check_only) continue;
      SubTensor xs(x, r0, n, false), os(out, r0, n, false), ws(w, e, 0, true);
      SubTensor xss(x_scales ? x_scales : x, r0, n, false);
      SubTensor wss(w_scales ? w_scales : w, e, 0, true);
      SubTensor gws(global_scale_w && !one_gw ? global_scale_w : offsets, e, 0, true);
      const DLTensor* gw = one_gw ? global_scale_w : (global_scale_w ? &gws.t : nullptr);
      Ctx ce{"qqmm"};
      const qqStatus_t st = qqmm_single(ce, handle, &xs.t, x_scales ? &xss.t : nullptr, &ws.t,
                                        w_scales ? &wss.t : nullptr, p, global_scale_x,
                                        gw, nullptr, &os.t, stream, !check_only);
      if (st != QQ_STATUS_SUCCESS) {
        const std::string msg = last_error();
        return set_error(st, "grouped_qqmm: expert %lld: %s", (long long)e, msg.c_str());
      }
    }
    return QQ_STATUS_SUCCESS;
  });
}

QQ_API qqStatus_t qqGroupedQqmmWgrad(qqHandle_t handle, const DLTensor* x, const DLTensor* dy,
                                     const DLTensor* offsets, const qqQuantParams_t* params,
                                     const DLTensor* global_scale_x, const DLTensor* global_scale_dy, DLTensor* out,
                                     void* stream) {
  return guard("grouped_qqmm_wgrad", [&]() -> qqStatus_t {
    set_route(QQ_ROUTE_AUTO);
    Ctx c{"grouped_qqmm_wgrad"};
    WgradArgs a;
    QQ_TRY(resolve_params(c, params, &a.q));
    if (!a.q.fp())
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm_wgrad: mode affine has no quantized-activation GEMM; "
                       "use mode nvfp4, mxfp4 or mxfp8");
    if (a.q.blocked)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm_wgrad: params.scale_layout must be LINEAR (the "
                       "quantized operands stay inside the call)");
    DType xdt, ddt, odt;
    QQ_TRY(check_tensor(c, "x", x, &xdt));
    QQ_TRY(expect_float(c, "x", x, xdt));
    QQ_TRY(check_tensor(c, "dy", dy, &ddt));
    QQ_TRY(expect_float(c, "dy", dy, ddt));
    if (x->ndim != 2 || dy->ndim != 2 || dy->shape[0] != x->shape[0])
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm_wgrad: 'x' must be [T, K] and 'dy' [T, N] with the same "
                       "T (tokens sorted by expert); got x %s, dy %s", shape_str(x->ndim, x->shape).c_str(),
                       shape_str(dy->ndim, dy->shape).c_str());
    QQ_TRY(check_tensor(c, "offsets", offsets, &odt));
    if (odt != DType::I32 || offsets->ndim != 1)
      return set_error(odt != DType::I32 ? QQ_STATUS_INVALID_DTYPE : QQ_STATUS_INVALID_VALUE,
                       "grouped_qqmm_wgrad: argument 'offsets' must be int32 [E] (cumulative group ends); got %s %s",
                       dtype_str(offsets->dtype).c_str(), shape_str(offsets->ndim, offsets->shape).c_str());
    a.E = offsets->shape[0];
    a.T = x->shape[0];
    a.K = x->shape[1];
    a.N = dy->shape[1];
    if (a.E > 1 && stride_of(offsets, 0) != 1)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm_wgrad: argument 'offsets' must be contiguous");
    if (a.E == 0)
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm_wgrad: argument 'offsets' is empty; give at least one "
                       "expert's group end");
    QQ_TRY(global_scale_ptr(c, "global_scale_x", global_scale_x, a.q, &a.gs_x));
    QQ_TRY(global_scale_ptr(c, "global_scale_dy", global_scale_dy, a.q, &a.gs_dy));
    if ((global_scale_x == nullptr) != (global_scale_dy == nullptr))
      return set_error(QQ_STATUS_INVALID_VALUE, "grouped_qqmm_wgrad: give both global_scale_x and global_scale_dy "
                       "(nvfp4) or neither");
    QQ_TRY(to_mat(c, "x", x, xdt, &a.x));
    QQ_TRY(to_mat(c, "dy", dy, ddt, &a.dy));
    const int64_t oshape[3] = {a.E, a.K, a.N};
    QQ_TRY(output_mat(c, "out", out, 3, oshape, -1, "[E, K, N]", &a.out));
    QQ_TRY(check_no_alias(c, {{"out", out}}, {{"x", x}, {"dy", dy}, {"offsets", offsets},
                                             {"global_scale_x", global_scale_x}, {"global_scale_dy", global_scale_dy}}));
    a.ends = (const int32_t*)((const char*)offsets->data + offsets->byte_offset);
    // (host ends are checked whatever the result's size, as grouped_qqmm checks them)
    if (c.device < 0) QQ_TRY(check_group_ends("grouped_qqmm_wgrad", a.ends, a.E, a.T));
    if (a.K * a.N == 0) return QQ_STATUS_SUCCESS;
    if (c.device >= 0) return cuda::grouped_qqmm_wgrad(handle, a, stream);
    return routed(cpu::grouped_wgrad(a), QQ_ROUTE_CPU);
  });
}

QQ_API qqStatus_t qqQuantizedMatmul(qqHandle_t handle, const DLTensor* x, const DLTensor* w,
                                    const DLTensor* scales, const DLTensor* biases, const qqQuantParams_t* params,
                                    int transpose, const DLTensor* global_scale, const DLTensor* bias,
                                    DLTensor* out, void* stream) {
  return guard("quantized_matmul", [&]() -> qqStatus_t {
    return weight_only_matmul("quantized_matmul", handle, x, w, scales, biases, nullptr, params, transpose,
                              global_scale, bias, out, stream);
  });
}

QQ_API qqStatus_t qqGatherQmm(qqHandle_t handle, const DLTensor* x, const DLTensor* w, const DLTensor* scales,
                              const DLTensor* biases, const DLTensor* rhs_indices, const qqQuantParams_t* params,
                              int transpose, const DLTensor* global_scale, const DLTensor* bias, DLTensor* out,
                              void* stream) {
  return guard("gather_qmm", [&]() -> qqStatus_t {
    if (!rhs_indices)
      return set_error(QQ_STATUS_INVALID_VALUE, "gather_qmm: argument 'rhs_indices' is NULL; pass int32 expert "
                       "indices (qqQuantizedMatmul multiplies without them)");
    return weight_only_matmul("gather_qmm", handle, x, w, scales, biases, rhs_indices, params, transpose,
                              global_scale, bias, out, stream);
  });
}

namespace {
// The decode layout takes nvfp4, mxfp4, mxfp8 with E4M3 elements, affine 4-bit with
// group 64 or 128 and affine 8-bit (decode_layout.h: a fragment block must lie in one group).
qqStatus_t decode_mode(const char* op, const QSpec& q) {
  if (q.mode == QQ_MODE_AFFINE) {
    if (q.bits != 4 && q.bits != 8)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: the decode layout holds affine weights of 4 or 8 bits; "
                       "params.bits is %d (use the packed weight with quantized_matmul)", op, q.bits);
    if (q.bits == 4 && q.group < 64)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: the decode layout holds affine 4-bit weights of group_size "
                       "64 or 128; params.group_size is %d (use the packed weight with quantized_matmul)", op,
                       q.group);
    return QQ_STATUS_SUCCESS;
  }
  if (q.mode != QQ_MODE_NVFP4 && q.mode != QQ_MODE_MXFP4 && q.mode != QQ_MODE_MXFP8)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: the decode layout holds nvfp4, mxfp4, mxfp8 and affine 4- / "
                     "8-bit weights; params.mode is %s (use the packed weight with quantized_matmul)", op,
                     mode_name(q.mode));
  if (q.mode == QQ_MODE_MXFP8 && q.elem != ELEM_E4M3)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: the decode layout holds mxfp8 with E4M3 elements; params."
                     "fp8_format is E5M2 (use the packed weight with quantized_matmul)", op);
  return QQ_STATUS_SUCCESS;
}
}  // namespace

QQ_API qqStatus_t qqDecodeLayoutSize(const qqQuantParams_t* params, int64_t n, int64_t k, int64_t* bytes) {
  return guard("decode_layout_size", [&]() -> qqStatus_t {
    Ctx c{"decode_layout_size"};
    QSpec q;
    QQ_TRY(resolve_params(c, params, &q));
    QQ_TRY(decode_mode(c.op, q));
    if (!bytes) return set_error(QQ_STATUS_INVALID_VALUE, "decode_layout_size: argument 'bytes' is NULL");
    if (n < 0 || k < 0 || k % kDecChunkK || n > INT32_MAX || k > INT32_MAX)
      return set_error(QQ_STATUS_INVALID_VALUE, "decode_layout_size: n = %lld, k = %lld; each must be in [0, 2^31) "
                       "and k a multiple of %d (the decode layout's K chunk)", (long long)n, (long long)k, kDecChunkK);
    *bytes = decode_layout_bytes(n, k, decode_fmt(q));
    return QQ_STATUS_SUCCESS;
  });
}

namespace {
// A compact uint8 tensor of exactly `bytes` bytes (any shape): the decode layout.
qqStatus_t decode_buffer(Ctx& c, const char* name, const DLTensor* t, int64_t bytes) {
  DType dt;
  QQ_TRY(check_tensor(c, name, t, &dt));
  QQ_TRY(expect_bytes(c, name, t, dt, "the decode layout (uint8)"));
  QQ_TRY(expect_compact(c, name, t));
  if (numel(t) != bytes)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' holds %lld bytes; the decode layout of this "
                     "weight takes %lld (qqDecodeLayoutSize)", c.op, name, (long long)numel(t), (long long)bytes);
  return QQ_STATUS_SUCCESS;
}
}  // namespace

namespace {
// qqToDecodeLayout (gated false) and qqToDecodeLayoutGated: one validation, op names its errors.
qqStatus_t to_decode_layout_api(const char* op, bool gated, qqHandle_t handle, const DLTensor* w,
                                const DLTensor* scales, const DLTensor* biases, const qqQuantParams_t* params,
                                DLTensor* out, void* stream) {
  return guard(op, [&]() -> qqStatus_t {
    Ctx c{op};
    DecodeLayoutArgs a{};
    QQ_TRY(resolve_params(c, params, &a.q));
    QQ_TRY(decode_mode(c.op, a.q));
    DType wdt;
    QQ_TRY(check_tensor(c, "w", w, &wdt));
    QQ_TRY(expect_bytes(c, "w", w, wdt, "packed quantized weights"));
    QQ_TRY(check_byte_kind(c, "w", w, a.q, ByteRole::DATA));
    if (w->ndim != 2 && w->ndim != 3)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'w' must be a packed weight [N, "
                       "K*bits/8] or experts [E, N, K*bits/8]; got shape %s", op, shape_str(w->ndim, w->shape).c_str());
    QQ_TRY(to_mat(c, "w", w, wdt, &a.w));
    a.E = w->ndim == 3 ? w->shape[0] : 1;
    a.N = w->shape[w->ndim - 2];
    a.K = w->shape[w->ndim - 1] * 8 / a.q.bits;
    if (a.N > INT32_MAX || a.K > INT32_MAX)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: N = %lld, K = %lld; each must be below 2^31", op,
                       (long long)a.N, (long long)a.K);
    if (a.K % kDecChunkK)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: K = %lld; the decode layout needs K a multiple "
                       "of %d (keep the packed weight)", op, (long long)a.K, kDecChunkK);
    if (a.E > INT32_MAX)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: E = %lld experts; at most 2^31 - 1", op,
                       (long long)a.E);
    if (gated) {
      if (w->ndim == 3)
        return set_error(QQ_STATUS_INVALID_VALUE, "%s: w holds %lld experts; a gated layout is read by "
                         "qqDecodeGatedMatmul, which takes one weight [2F, K] (no gather reads one): convert "
                         "experts with qqToDecodeLayout", op, (long long)a.E);
      if (a.N % 64)
        return set_error(QQ_STATUS_INVALID_VALUE, "%s: w has N = %lld rows; a gated layout holds a gate/up weight "
                         "[2F, K] (the gate's F rows, then the up projection's) with F a multiple of 32, so N a "
                         "multiple of 64 (use qqToDecodeLayout and qqSwiglu after the matmul otherwise)", op,
                         (long long)a.N);
      a.gated = a.N / 2;
    }
    const int64_t fshape[3] = {a.E, a.N, a.K};
    QQ_TRY(input_scales(c, "scales", scales, a.q, w->ndim, fshape + (3 - w->ndim), DType::U8, false, &a.scales));
    if (a.q.blocked) blocked_batch_strides(&a.scales);
    QQ_TRY(input_biases(c, biases, a.q, w->ndim, fshape + (3 - w->ndim), a.scales.dt, &a.biases));
    QQ_TRY(decode_buffer(c, "out", out, a.E * decode_layout_bytes(a.N, a.K, decode_fmt(a.q))));
    QQ_TRY(check_no_alias(c, {{"out", out}}, {{"w", w}, {"scales", scales}, {"biases", biases}}));
    a.out = (uint8_t*)out->data + out->byte_offset;
    if (numel(out) == 0) return QQ_STATUS_SUCCESS;  // (E, N or K 0: a layout of no bytes)
    if (c.device >= 0) return cuda::to_decode_layout(handle, a, stream);
    return cpu::to_decode_layout(a);
  });
}
}  // namespace

QQ_API qqStatus_t qqToDecodeLayout(qqHandle_t handle, const DLTensor* w, const DLTensor* scales,
                                   const DLTensor* biases, const qqQuantParams_t* params, DLTensor* out,
                                   void* stream) {
  return to_decode_layout_api("to_decode_layout", false, handle, w, scales, biases, params, out, stream);
}

QQ_API qqStatus_t qqToDecodeLayoutGated(qqHandle_t handle, const DLTensor* w, const DLTensor* scales,
                                        const DLTensor* biases, const qqQuantParams_t* params, DLTensor* out,
                                        void* stream) {
  return to_decode_layout_api("to_decode_layout_gated", true, handle, w, scales, biases, params, out, stream);
}

namespace {
// qqDecodeMatmul (gated false) and qqDecodeGatedMatmul: one validation, op names its errors.
qqStatus_t decode_matmul_api(const char* op, bool gated, int swiglu, qqHandle_t handle, const DLTensor* x,
                             const DLTensor* w_decode, const qqQuantParams_t* params, const DLTensor* global_scale,
                             const DLTensor* bias, DLTensor* out, void* stream) {
  set_route(QQ_ROUTE_AUTO);
  return guard(op, [&]() -> qqStatus_t {
    Ctx c{op};
    DecodeMatmulArgs a{};
    QSpec q;
    QQ_TRY(resolve_params(c, params, &q));
    QQ_TRY(decode_mode(c.op, q));
    DType xdt, odt;
    QQ_TRY(check_tensor(c, "x", x, &xdt));
    QQ_TRY(expect_float(c, "x", x, xdt));
    QQ_TRY(check_output(c, "out", out, true, &odt));
    QQ_TRY(expect_compact(c, "out", out));
    if (x->ndim < 1 || out->ndim != x->ndim)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: 'x' must be [..., M, K] and 'out' [..., M, N] "
                       "with the same leading axes; got x %s, out %s", op, shape_str(x->ndim, x->shape).c_str(),
                       shape_str(out->ndim, out->shape).c_str());
    a.K = x->shape[x->ndim - 1];
    a.N = out->shape[out->ndim - 1];
    if (gated) {
      if (swiglu != 0 && swiglu != 1)
        return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'swiglu' is %d; pass 0 (out [..., M, 2F], the "
                         "product) or 1 (out [..., M, F], SwiGLU of it)", op, swiglu);
      a.swiglu = swiglu == 1;
      if (a.swiglu) a.N *= 2;  // out holds F columns of the 2F-row weight
      if (a.N % 64)
        return set_error(QQ_STATUS_INVALID_VALUE, "%s: 'out' %s: a gated layout holds a gate/up weight [2F, K] with F "
                         "a multiple of 32, so out's last axis must be %s", op,
                         shape_str(out->ndim, out->shape).c_str(), a.swiglu ? "F (a multiple of 32)" :
                         "2F (a multiple of 64)");
      a.gated = a.N / 2;
    }
    a.M = 1;
    for (int i = 0; i + 1 < x->ndim; ++i) {
      if (out->shape[i] != x->shape[i])
        return set_error(QQ_STATUS_INVALID_VALUE, "%s: 'out' %s does not match 'x' %s in its leading "
                         "axes", op, shape_str(out->ndim, out->shape).c_str(), shape_str(x->ndim, x->shape).c_str());
      a.M *= x->shape[i];
    }
    if (a.K % kDecChunkK)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: x has K = %lld; a decode-layout weight needs K "
                       "a multiple of %d", op, (long long)a.K, kDecChunkK);
    if (a.K > INT32_MAX || a.N > INT32_MAX || a.M > INT32_MAX)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: M = %lld, N = %lld, K = %lld; each must be below "
                       "2^31", op, (long long)a.M, (long long)a.N, (long long)a.K);
    // x's rows: stride 1 along K, and one stride between consecutive rows across all
    // leading axes: the innermost leading axis of extent > 1 gives it, each outer one
    // of extent > 1 must step by it times the rows inside (axes of extent 1 have no
    // stride that matters).
    if (a.M > 0 && a.K > 0) {
      if (a.K > 1 && stride_of(x, x->ndim - 1) != 1)
        return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: 'x' needs stride 1 along K (make x contiguous, or "
                         "use the packed weight)", op);
      a.x.ld = a.K;
      int64_t inner = 1;  // rows inside the axis being checked
      bool first = true;
      for (int i = x->ndim - 2; i >= 0; --i) {
        if (x->shape[i] == 1) continue;
        if (first) {
          a.x.ld = stride_of(x, i);
          first = false;
        } else if (stride_of(x, i) != a.x.ld * inner) {
          return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: the rows of 'x' %s are not evenly spaced "
                           "across its leading axes (make x contiguous, or use the packed weight)", op,
                           shape_str(x->ndim, x->shape).c_str());
        }
        inner *= x->shape[i];
      }
      if (a.M > 1 && a.x.ld < a.K)
        return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: the rows of 'x' overlap (row stride %lld < K = "
                         "%lld; use the packed weight)", op, (long long)a.x.ld, (long long)a.K);
    }
    a.x.ptr = (char*)x->data + x->byte_offset;
    a.x.dt = xdt;
    a.x.rows = a.M;
    a.x.cols = a.K;
    a.x.device = c.device;
    QQ_TRY(decode_buffer(c, "w_decode", w_decode, decode_layout_bytes(a.N, a.K, decode_fmt(q))));
    a.q = q;
    a.w = (const uint8_t*)w_decode->data + w_decode->byte_offset;
    QQ_TRY(global_scale_ptr(c, "global_scale", global_scale, q, &a.gs));
    QQ_TRY(bias_mat(c, bias, a.N, &a.bias));
    QQ_TRY(check_no_alias(c, {{"out", out}}, {{"x", x}, {"w_decode", w_decode}, {"global_scale", global_scale},
                                             {"bias", bias}}));
    a.out.ptr = (char*)out->data + out->byte_offset;
    a.out.dt = odt;
    a.out.rows = a.M;
    a.out.cols = a.out.ld = a.swiglu ? a.gated : a.N;
    a.out.device = c.device;
    if (a.M == 0 || a.N == 0) return QQ_STATUS_SUCCESS;
    if (c.device >= 0) return cuda::decode_matmul(handle, a, stream);
    return routed(cpu::decode_matmul(a), QQ_ROUTE_CPU);
  });
}
}  // namespace

QQ_API qqStatus_t qqDecodeMatmul(qqHandle_t handle, const DLTensor* x, const DLTensor* w_decode,
                                 const qqQuantParams_t* params, const DLTensor* global_scale, const DLTensor* bias,
                                 DLTensor* out, void* stream) {
  return decode_matmul_api("decode_matmul", false, 0, handle, x, w_decode, params, global_scale, bias, out, stream);
}

QQ_API qqStatus_t qqDecodeGatedMatmul(qqHandle_t handle, const DLTensor* x, const DLTensor* w_decode,
                                      const qqQuantParams_t* params, const DLTensor* global_scale,
                                      const DLTensor* bias, int swiglu, DLTensor* out, void* stream) {
  return decode_matmul_api("decode_gated_matmul", true, swiglu, handle, x, w_decode, params, global_scale, bias, out,
                           stream);
}

QQ_API qqStatus_t qqDecodeGatherQmm(qqHandle_t handle, const DLTensor* x, const DLTensor* w_decode,
                                    const DLTensor* rhs_indices, const qqQuantParams_t* params,
                                    const DLTensor* global_scale, const DLTensor* bias, DLTensor* out,
                                    void* stream) {
  set_route(QQ_ROUTE_AUTO);
  return guard("decode_gather_qmm", [&]() -> qqStatus_t {
    Ctx c{"decode_gather_qmm"};
    DecodeMatmulArgs a{};
    QQ_TRY(resolve_params(c, params, &a.q));
    QQ_TRY(decode_mode(c.op, a.q));
    DType xdt, wdt;
    QQ_TRY(check_tensor(c, "x", x, &xdt));
    QQ_TRY(expect_float(c, "x", x, xdt));
    if (x->ndim < 2)
      return set_error(QQ_STATUS_INVALID_VALUE, "decode_gather_qmm: 'x' must be [..., M, K]; got %s",
                       shape_str(x->ndim, x->shape).c_str());
    QQ_TRY(check_tensor(c, "w_decode", w_decode, &wdt));
    QQ_TRY(expect_bytes(c, "w_decode", w_decode, wdt, "the decode layouts of the experts (uint8 [E, bytes])"));
    QQ_TRY(expect_compact(c, "w_decode", w_decode));
    if (w_decode->ndim != 2)
      return set_error(QQ_STATUS_INVALID_VALUE, "decode_gather_qmm: 'w_decode' must be uint8 [E, bytes] (one "
                       "decode layout per expert, qqToDecodeLayout of [E, N, K]); got %s",
                       shape_str(w_decode->ndim, w_decode->shape).c_str());
    QQ_TRY(check_header(c, "out", out));
    if (out->ndim < 2)
      return set_error(QQ_STATUS_INVALID_VALUE, "decode_gather_qmm: 'out' must be [batch..., M, N]; got %s",
                       shape_str(out->ndim, out->shape).c_str());
    a.K = x->shape[x->ndim - 1];
    a.M = x->shape[x->ndim - 2];
    a.N = out->shape[out->ndim - 1];
    a.E = w_decode->shape[0];
    if (a.K % kDecChunkK || a.K > INT32_MAX || a.N > INT32_MAX || a.M > INT32_MAX || a.E > INT32_MAX)
      return set_error(QQ_STATUS_INVALID_VALUE, "decode_gather_qmm: M = %lld, N = %lld, K = %lld, E = %lld; K "
                       "must be a multiple of %d and each below 2^31", (long long)a.M, (long long)a.N,
                       (long long)a.K, (long long)a.E, kDecChunkK);
    if (w_decode->shape[1] != decode_layout_bytes(a.N, a.K, decode_fmt(a.q)))
      return set_error(QQ_STATUS_INVALID_VALUE, "decode_gather_qmm: 'w_decode' holds %lld bytes per expert; the "
                       "decode layout of [%lld, %lld] takes %lld (qqDecodeLayoutSize)",
                       (long long)w_decode->shape[1], (long long)a.N, (long long)a.K,
                       (long long)decode_layout_bytes(a.N, a.K, decode_fmt(a.q)));
    a.w = (const uint8_t*)w_decode->data + w_decode->byte_offset;
    QQ_TRY(to_mat(c, "x", x, xdt, &a.x));
    int nb;
    int64_t bshape[kMaxDims];
    QQ_TRY(gather_indices(c, rhs_indices, &a.x, &a.gidx, &nb, bshape));
    int64_t oshape[kMaxDims];
    int ond = 0;
    for (int i = 0; i < nb; ++i) oshape[ond++] = bshape[i];
    oshape[ond++] = a.M;
    oshape[ond++] = a.N;
    QQ_TRY(output_mat(c, "out", out, ond, oshape, -1, "[broadcast batch..., M, N]", &a.out));
    QQ_TRY(global_scale_ptr(c, "global_scale", global_scale, a.q, &a.gs));
    QQ_TRY(bias_mat(c, bias, a.N, &a.bias));
    QQ_TRY(check_no_alias(c, {{"out", out}}, {{"x", x}, {"w_decode", w_decode}, {"rhs_indices", rhs_indices},
                                             {"global_scale", global_scale}, {"bias", bias}}));
    a.B = a.out.batch();
    a.out.nb = 0;  // compact [B, M, N]: the kernels index it as b * M * N
    if (a.B == 0 || a.M == 0 || a.N == 0) return QQ_STATUS_SUCCESS;
    if (c.device >= 0) return cuda::decode_matmul(handle, a, stream);
    for (int64_t b = 0; b < a.B; ++b) {  // the CPU reads the indices: out of range is an error there
      const int32_t e = *((const int32_t*)a.gidx.ptr + a.gidx.offset(b));
      if (e < 0 || e >= a.E)
        return set_error(QQ_STATUS_INVALID_VALUE, "decode_gather_qmm: rhs_indices holds %d at entry %lld; expert "
                         "indices must be in [0, %lld)", e, (long long)b, (long long)a.E);
    }
    return routed(cpu::decode_matmul(a), QQ_ROUTE_CPU);
  });
}

}  // extern "C"
