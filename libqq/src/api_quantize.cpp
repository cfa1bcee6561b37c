// api_quantize.cpp - the C entry points that quantize and dequantize:
// qqQuantize, qqQuantizeColwise, qqQuantizeMoe, qqDequantize, qqQuantizeDequantize(Moe).
//
// Each checks every argument through the validation layer (validate.h),
// builds the views of internal.h and dispatches on the device: cpu/quantize.cpp
// or the CUDA kernels (cuda/quantize.cu, colwise.cu, dequantize.cu).
#include <utility>

#include "internal.h"
#include "validate.h"

namespace qq {
namespace {
// Validation of qqQuantize, shared with qqQuantizeColwise's row-wise half.
// `op` names the caller in messages (quantize_colwise validates its row-wise half here).
qqStatus_t quantize_validate(const char* op, const DLTensor* x, const qqQuantParams_t* params,
                             const DLTensor* global_scale, DLTensor* data, DLTensor* scales, DLTensor* biases,
                             QuantizeArgs* out) {
  Ctx c{op};
  QuantizeArgs& a = *out;
  QQ_TRY(resolve_params(c, params, &a.q));
  DType xdt;
  QQ_TRY(check_tensor(c, "x", x, &xdt));
  QQ_TRY(expect_float(c, "x", x, xdt));
  if (x->ndim < 1)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'x' is a scalar; expected shape [..., K]", op);
  QQ_TRY(check_k(c, "x", "K", x->shape[x->ndim - 1], a.q));
  QQ_TRY(to_mat(c, "x", x, xdt, &a.x));
  int64_t dshape[kMaxDims], sshape[kMaxDims + 1];
  int snd;
  quantized_shapes(a.q, x->ndim, x->shape, dshape, sshape, &snd);
  QQ_TRY(output_mat(c, "data", data, x->ndim, dshape, (int)DType::U8, "packed elements", &a.data));
  const int sdt = a.q.fp() ? (int)DType::U8 : (int)xdt;
  QQ_TRY(output_mat(c, "scales", scales, snd, sshape, sdt,
                    a.q.blocked ? "blocked layout: [batch..., roundup(rows,128), roundup(K/group,4)]"
                                : (a.q.fp() ? "one scale byte per group" : "affine scales have x's dtype"),
                    &a.scales));
  if (a.q.mode == QQ_MODE_AFFINE) {
    if (!biases) return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'biases' is required for affine", op);
    QQ_TRY(output_mat(c, "biases", biases, snd, sshape, (int)xdt, "affine biases have x's dtype", &a.biases));
  } else if (biases) {
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'biases' must be NULL for mode %s", op,
                     mode_name(a.q.mode));
  }
  QQ_TRY(global_scale_ptr(c, "global_scale", global_scale, a.q, &a.gs));
  QQ_TRY(check_byte_kind(c, "data", data, a.q, ByteRole::DATA));
  QQ_TRY(check_byte_kind(c, "scales", scales, a.q, ByteRole::SCALES));
  return check_no_alias(c, {{"data", data}, {"scales", scales}, {"biases", biases}},
                        {{"x", x}, {"global_scale", global_scale}});
}
// quantize_moe's scales shape (qqQuantizeMoe and qqQuantizeMoeShapes): the one home
// of the rule; `why` describes it for messages.
void moe_scales_shape(const QSpec& q, bool tile32, int64_t E, int64_t D1, int64_t D2, int64_t ssh[3],
                      const char** why) {
  ssh[0] = E;
  if (q.blocked) {
    ssh[1] = roundup(D2, 128);
    ssh[2] = roundup(D1 / 32, 4);
    *why = "blocked: [E, roundup(D2,128), roundup(D1/32,4)]";
  } else {
    ssh[1] = D1 / 32;
    ssh[2] = tile32 ? D2 / 32 : D2;
    *why = tile32 ? "32x32 scales: [E, D1/32, D2/32]" : "32x1 scales: [E, D1/32, D2]";
  }
}

// quantize_moe's parameters and w shape (qqQuantizeMoe and qqQuantizeMoeShapes).
// `sc` is the caller's qqMoeScaling_t read as an int (raw_enum at the entry point: an
// out-of-range value must not be loaded as the enum type).
// (`shown`, `shown_nd`: w's shape as the caller gave it, for the message, where `shape` is
// its [E, D1, D2] form)
qqStatus_t moe_check(Ctx& c, const qqQuantParams_t* params, int sc, const int64_t* shape, QSpec* q,
                     bool* tile32, const int64_t* shown = nullptr, int shown_nd = 3) {
  QQ_TRY(resolve_params(c, params, q));
  if (q->mode != QQ_MODE_MXFP8)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: mode %s is not supported; MoE weight scaling "
                     "(32x1 / 32x32) is defined for mxfp8 only", c.op, mode_name(q->mode));
  if (sc != QQ_MOE_32X1 && sc != QQ_MOE_32X32)
    return set_error(QQ_STATUS_INVALID_VALUE, "quantize_moe: unknown scaling %d; expected 32x1 or 32x32", sc);
  *tile32 = sc == QQ_MOE_32X32;
  if (shape[0] < 0 || shape[1] % 32 || shape[2] % 32 || shape[1] <= 0 || shape[2] <= 0)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'w' has shape %s; D1 and D2 must be "
                     "positive multiples of 32", c.op, shape_str(shown_nd, shown ? shown : shape).c_str());
  return QQ_STATUS_SUCCESS;
}
}  // namespace
}  // namespace qq

using namespace qq;

extern "C" {

QQ_API qqStatus_t qqQuantize(qqHandle_t handle, const DLTensor* x, const qqQuantParams_t* params,
                             const DLTensor* global_scale, DLTensor* data, DLTensor* scales,
                             DLTensor* biases, void* stream) {
  return guard("quantize", [&]() -> qqStatus_t {
    QuantizeArgs a{};
    QQ_TRY(quantize_validate("quantize", x, params, global_scale, data, scales, biases, &a));
    if (a.x.rows * a.x.batch() == 0) return QQ_STATUS_SUCCESS;
    if (a.x.device < 0) return cpu::quantize(a);
    return cuda::quantize(handle, a, stream);
  });
}

QQ_API qqStatus_t qqQuantizeColwise(qqHandle_t handle, const DLTensor* x, const qqQuantParams_t* params,
                                    const DLTensor* global_scale, DLTensor* data_t, DLTensor* scales_t,
                                    DLTensor* biases_t, DLTensor* data, DLTensor* scales, DLTensor* biases,
                                    void* stream) {
  return guard("quantize_colwise", [&]() -> qqStatus_t {
    ColwiseArgs a{};
    if (!data && (scales || biases))  // the row-wise half is asked for by data; its parts alone are a mistake
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_colwise: argument '%s' is given but 'data' is NULL; "
                       "pass data too for both orientations (data, scales, biases), or none of them",
                       scales ? "scales" : "biases");
    if (data) {  // both orientations: validate the row-wise half exactly as qqQuantize does
      QQ_TRY(quantize_validate("quantize_colwise", x, params, global_scale, data, scales, biases, &a.row));
      a.rowwise = true;
    }
    Ctx c{"quantize_colwise"};
    QQ_TRY(resolve_params(c, params, &a.q));
    DType xdt;
    QQ_TRY(check_tensor(c, "x", x, &xdt));
    QQ_TRY(expect_float(c, "x", x, xdt));
    if (x->ndim < 2)
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_colwise: argument 'x' has shape %s; expected [..., M, K]",
                       shape_str(x->ndim, x->shape).c_str());
    const int nd = x->ndim;
    a.M = x->shape[nd - 2];
    a.K = x->shape[nd - 1];
    QQ_TRY(check_k(c, "x", "M", a.M, a.q));
    QQ_TRY(to_mat(c, "x", x, xdt, &a.x));
    int64_t tshape[kMaxDims], dshape[kMaxDims], sshape[kMaxDims + 1];
    for (int i = 0; i < nd; ++i) tshape[i] = x->shape[i];
    tshape[nd - 2] = a.K;
    tshape[nd - 1] = a.M;
    int snd;
    quantized_shapes(a.q, nd, tshape, dshape, sshape, &snd);
    QQ_TRY(output_mat(c, "data_t", data_t, nd, dshape, (int)DType::U8, "packed elements of x^T", &a.data_t));
    const int sdt = a.q.fp() ? (int)DType::U8 : (int)xdt;
    QQ_TRY(output_mat(c, "scales_t", scales_t, snd, sshape, sdt, "the scales of x^T", &a.scales_t));
    if (a.q.mode == QQ_MODE_AFFINE) {
      if (!biases_t)
        return set_error(QQ_STATUS_INVALID_VALUE, "quantize_colwise: argument 'biases_t' is required for affine");
      QQ_TRY(output_mat(c, "biases_t", biases_t, snd, sshape, (int)xdt, "affine biases of x^T", &a.biases_t));
    } else if (biases_t) {
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_colwise: argument 'biases_t' must be NULL for mode %s",
                       mode_name(a.q.mode));
    }
    a.scale_kind = a.q.blocked ? COL_SCALE_BLOCKED : COL_SCALE_T_LINEAR;
    QQ_TRY(global_scale_ptr(c, "global_scale", global_scale, a.q, &a.gs));
    QQ_TRY(check_byte_kind(c, "data_t", data_t, a.q, ByteRole::DATA));
    QQ_TRY(check_byte_kind(c, "scales_t", scales_t, a.q, ByteRole::SCALES));
    QQ_TRY(check_no_alias(c, {{"data_t", data_t}, {"scales_t", scales_t}, {"biases_t", biases_t}, {"data", data},
                              {"scales", scales}, {"biases", biases}}, {{"x", x}, {"global_scale", global_scale}}));
    if (a.M * a.K * a.x.batch() == 0) return QQ_STATUS_SUCCESS;
    if (c.device < 0) return cpu::quantize_colwise(a);
    return cuda::quantize_colwise(handle, a, stream);
  });
}

QQ_API qqStatus_t qqQuantizeMoe(qqHandle_t handle, const DLTensor* x, const qqQuantParams_t* params,
                                qqMoeScaling_t scaling, DLTensor* data, DLTensor* scales, void* stream) {
  return guard("quantize_moe", [&]() -> qqStatus_t {
    Ctx c{"quantize_moe"};
    ColwiseArgs a{};
    DType xdt;
    QQ_TRY(check_tensor(c, "w", x, &xdt));
    QQ_TRY(expect_float(c, "w", x, xdt));
    if (x->ndim != 3)
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_moe: argument 'w' has shape %s; expected [E, D1, D2]",
                       shape_str(x->ndim, x->shape).c_str());
    QQ_TRY(moe_check(c, params, raw_enum(scaling), x->shape, &a.q, &a.tile32));
    const int64_t E = x->shape[0], D1 = x->shape[1], D2 = x->shape[2];
    a.M = D1;
    a.K = D2;
    // Row-major [E, D1, D2], or the transposed view (stride 1 on D1): then the
    // physical rows are the D2 columns and the quantization is along them.
    const int64_t s0 = stride_of(x, 0), s1 = stride_of(x, 1), s2 = stride_of(x, 2);
    Mat m;
    m.dt = xdt;
    m.device = c.device;
    m.ptr = (char*)x->data + x->byte_offset;
    m.nb = 1;
    m.bshape[0] = E;
    m.bstride[0] = E == 1 ? 0 : s0;
    if ((s2 == 1 && s1 >= D2) || E == 0) {  // (an empty w has no layout: NumPy reports 0 strides)
      m.rows = D1; m.cols = D2; m.ld = s1;
    } else if (s1 == 1 && s2 >= D1) {
      m.rows = D2; m.cols = D1; m.ld = s2;
      a.x_colmajor = true;
    } else {
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_moe: argument 'w' has strides %s for shape %s; expected "
                       "stride 1 on dim 2 (row-major) or on dim 1 (a transposed view); pass a contiguous tensor",
                       shape_str(3, x->strides ? x->strides : x->shape).c_str(), shape_str(3, x->shape).c_str());
    }
    a.x = m;
    // data: [E, D1, D2] with strides (D1*D2, 1, D1)
    DType ddt;
    QQ_TRY(check_output(c, "data", data, false, &ddt));
    const int64_t dsh[3] = {E, D1, D2};
    QQ_TRY(expect_shape(c, "data", data, 3, dsh, "[E, D1, D2]"));
    if (ddt != DType::U8 || !data->strides || data->strides[1] != 1 || (D2 > 1 && data->strides[2] != D1) ||
        (E > 1 && data->strides[0] != D1 * D2))
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_moe: argument 'data' must be uint8 [E, D1, D2] "
                       "column-major per expert, strides (D1*D2, 1, D1) (e.g. an [E, D2, D1] buffer transposed)");
    a.data_t.ptr = (char*)data->data + data->byte_offset;
    a.data_t.dt = DType::U8;
    a.data_t.device = c.device;
    a.data_t.rows = D2;
    a.data_t.cols = D1;
    a.data_t.ld = D1;
    int64_t ssh[3];
    const char* why;
    moe_scales_shape(a.q, a.tile32, E, D1, D2, ssh, &why);
    a.scale_kind = a.q.blocked ? COL_SCALE_BLOCKED : COL_SCALE_D1_LINEAR;
    QQ_TRY(output_mat(c, "scales", scales, 3, ssh, (int)DType::U8, why, &a.scales_t));
    QQ_TRY(check_byte_kind(c, "data", data, a.q, ByteRole::DATA));
    QQ_TRY(check_byte_kind(c, "scales", scales, a.q, ByteRole::SCALES));
    QQ_TRY(check_no_alias(c, {{"data", data}, {"scales", scales}}, {{"w", x}}));
    if (E == 0) return QQ_STATUS_SUCCESS;  // (D1 and D2 are positive: moe_check)
    if (c.device < 0) return cpu::quantize_colwise(a);
    return cuda::quantize_colwise(handle, a, stream);
  });
}

QQ_API qqStatus_t qqQuantizeDequantize(qqHandle_t handle, const DLTensor* x, const qqQuantParams_t* params,
                                       const DLTensor* global_scale, DLTensor* out, DLTensor* out_t,
                                       void* stream) {
  return guard("quantize_dequantize", [&]() -> qqStatus_t {
    Ctx c{"quantize_dequantize"};
    QdqArgs a{};
    QQ_TRY(resolve_params(c, params, &a.q));
    if (!a.q.fp())
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_dequantize: mode %s is not supported; it takes the fp "
                       "modes nvfp4, mxfp4 and mxfp8 (qqmm's operands)", mode_name(a.q.mode));
    DType xdt;
    QQ_TRY(check_tensor(c, "x", x, &xdt));
    QQ_TRY(expect_float(c, "x", x, xdt));
    if (x->ndim != 2)
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_dequantize: argument 'x' has shape %s; expected [M, K]",
                       shape_str(x->ndim, x->shape).c_str());
    if (!out && !out_t)
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_dequantize: 'out' and 'out_t' are both NULL; pass at "
                       "least one of them");
    if (out) QQ_TRY(check_k(c, "x", "K", x->shape[1], a.q));
    QQ_TRY(to_mat(c, "x", x, xdt, &a.x));
    if (out)
      QQ_TRY(output_mat(c, "out", out, 2, x->shape, (int)DType::BF16, "q(x)'s values along K, x's shape", &a.out));
    if (out_t)
      QQ_TRY(output_mat(c, "out_t", out_t, 2, x->shape, (int)DType::BF16, "q(x)'s values along M, x's shape",
                        &a.out_t));
    QQ_TRY(global_scale_ptr(c, "global_scale", global_scale, a.q, &a.gs));
    QQ_TRY(check_no_alias(c, {{"out", out}, {"out_t", out_t}}, {{"x", x}, {"global_scale", global_scale}}));
    if (a.x.rows * a.x.cols == 0) return QQ_STATUS_SUCCESS;
    if (c.device < 0) return cpu::quantize_dequantize(a);
    return cuda::quantize_dequantize(handle, a, stream);
  });
}

QQ_API qqStatus_t qqQuantizeDequantizeMoe(qqHandle_t handle, const DLTensor* w, const qqQuantParams_t* params,
                                          DLTensor* out, DLTensor* out_t, void* stream) {
  return guard("quantize_dequantize_moe", [&]() -> qqStatus_t {
    Ctx c{"quantize_dequantize_moe"};
    QdqArgs a{};
    a.tile32 = true;
    DType wdt;
    QQ_TRY(check_tensor(c, "w", w, &wdt));
    QQ_TRY(expect_float(c, "w", w, wdt));
    if (w->ndim != 2 && w->ndim != 3)
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_dequantize_moe: argument 'w' has shape %s; expected "
                       "[E, D1, D2] or [D1, D2]", shape_str(w->ndim, w->shape).c_str());
    const int nd = w->ndim;
    const int64_t shape3[3] = {nd == 3 ? w->shape[0] : 1, w->shape[nd - 2], w->shape[nd - 1]};
    bool tile32;
    QQ_TRY(moe_check(c, params, QQ_MOE_32X32, shape3, &a.q, &tile32, w->shape, nd));
    if (!out && !out_t)
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_dequantize_moe: 'out' and 'out_t' are both NULL; pass "
                       "at least one of them");
    QQ_TRY(to_mat(c, "w", w, wdt, &a.x));
    int64_t tshape[3];
    for (int i = 0; i < nd; ++i) tshape[i] = w->shape[i];
    std::swap(tshape[nd - 2], tshape[nd - 1]);
    if (out) QQ_TRY(output_mat(c, "out", out, nd, w->shape, (int)DType::BF16, "q(w)'s values, w's shape", &a.out));
    if (out_t)
      QQ_TRY(output_mat(c, "out_t", out_t, nd, tshape, (int)DType::BF16, "q(w)'s values transposed", &a.out_t));
    QQ_TRY(check_no_alias(c, {{"out", out}, {"out_t", out_t}}, {{"w", w}}));
    if (a.x.batch() * a.x.rows * a.x.cols == 0) return QQ_STATUS_SUCCESS;
    if (c.device < 0) return cpu::quantize_dequantize(a);
    return cuda::quantize_dequantize(handle, a, stream);
  });
}

QQ_API qqStatus_t qqDequantize(qqHandle_t handle, const DLTensor* w, const DLTensor* scales,
                               const DLTensor* biases, const qqQuantParams_t* params,
                               const DLTensor* global_scale, DLTensor* out, void* stream) {
  return guard("dequantize", [&]() -> qqStatus_t {
    Ctx c{"dequantize"};
    DequantizeArgs a{};
    QQ_TRY(resolve_params(c, params, &a.q));
    DType wdt;
    QQ_TRY(check_tensor(c, "w", w, &wdt));
    QQ_TRY(expect_bytes(c, "w", w, wdt, "packed quantized data"));
    QQ_TRY(check_byte_kind(c, "w", w, a.q, ByteRole::DATA));
    if (w->ndim < 1)
      return set_error(QQ_STATUS_INVALID_VALUE, "dequantize: argument 'w' is a scalar; expected [..., K*bits/8]");
    const int64_t kp = w->shape[w->ndim - 1];
    if ((kp * 8) % a.q.bits != 0)
      return set_error(QQ_STATUS_INVALID_VALUE, "dequantize: argument 'w' has %lld bytes per row, not a whole "
                       "number of %d-bit elements", (long long)kp, a.q.bits);
    int64_t fshape[kMaxDims];
    for (int i = 0; i < w->ndim; ++i) fshape[i] = w->shape[i];
    fshape[w->ndim - 1] = kp * 8 / a.q.bits;
    QQ_TRY(check_k(c, "w", "K", fshape[w->ndim - 1], a.q));
    QQ_TRY(to_mat(c, "w", w, wdt, &a.data));
    QQ_TRY(input_scales(c, "scales", scales, a.q, w->ndim, fshape, DType::U8, false, &a.scales));
    QQ_TRY(input_biases(c, biases, a.q, w->ndim, fshape, a.scales.dt, &a.biases));
    QQ_TRY(global_scale_ptr(c, "global_scale", global_scale, a.q, &a.gs));
    QQ_TRY(output_mat(c, "out", out, w->ndim, fshape, -1, "the dequantized shape [..., K]", &a.out));
    QQ_TRY(check_no_alias(c, {{"out", out}},
                          {{"w", w}, {"scales", scales}, {"biases", biases}, {"global_scale", global_scale}}));
    if (a.data.rows * a.data.batch() == 0) return QQ_STATUS_SUCCESS;
    if (c.device < 0) return cpu::dequantize(a);
    return cuda::dequantize(handle, a, stream);
  });
}

QQ_API qqStatus_t qqQuantizeMoeShapes(const qqQuantParams_t* params, qqMoeScaling_t scaling,
                                     const int64_t* w_shape, int64_t* scales_shape) {
  return guard("quantize_moe", [&]() -> qqStatus_t {
    Ctx c{"quantize_moe"};
    if (!w_shape || !scales_shape)
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_moe: w_shape and scales_shape must not be NULL");
    QSpec q;
    bool tile32 = false;
    QQ_TRY(moe_check(c, params, raw_enum(scaling), w_shape, &q, &tile32));
    // the element bound qqQuantizeMoe's tensor check makes (check_tensor), so that no shape
    // it would refuse is answered here, and the scales' roundup cannot overflow
    if (bounded_product(3, w_shape) < 0)
      return set_error(QQ_STATUS_INVALID_VALUE, "quantize_moe: argument 'w' has shape %s: more than 2^56 "
                       "elements, beyond what libqq addresses", shape_str(3, w_shape).c_str());
    const char* why;
    moe_scales_shape(q, tile32, w_shape[0], w_shape[1], w_shape[2], scales_shape, &why);
    return QQ_STATUS_SUCCESS;
  });
}

}  // extern "C"
