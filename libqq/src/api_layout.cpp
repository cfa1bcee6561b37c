// api_layout.cpp - the C entry points on scales and tensors that neither
// quantize nor multiply: qqSwizzleScales / qqUnswizzleScales (the linear <->
// blocked scale layout), qqAmax (nvfp4's global-scale input) and qqSwiglu (the
// activation between a gated MLP's matmuls).
//
// Arguments are checked by the validation layer (validate.h); the work is
// cpu/quantize.cpp's, cpu/act.cpp's or the CUDA kernels' (cuda/layout.cu, cuda/amax.cu,
// cuda/act.cu).
#include "codec.h"
#include "internal.h"
#include "validate.h"

namespace qq {
namespace {
// Both directions share one shape rule; `to_blocked` only swaps which tensor
// is read and which is written (and so the argument names in messages).
qqStatus_t swizzle_common(const char* op, qqHandle_t handle, const DLTensor* lin, const DLTensor* blk,
                          bool to_blocked, void* stream) {
  return guard(op, [&]() -> qqStatus_t {
    Ctx c{op};
    DType ldt, bdt;
    const char* lname = to_blocked ? "scales" : "out";
    const char* bname = to_blocked ? "out" : "scales";
    QQ_TRY(check_tensor(c, "scales", to_blocked ? lin : blk, to_blocked ? &ldt : &bdt));
    QQ_TRY(expect_bytes(c, "scales", to_blocked ? lin : blk, to_blocked ? ldt : bdt, "scale bytes"));
    {  // the output: a wrong buffer is QQ_STATUS_INVALID_VALUE, as every op's out (output_mat)
      const DLTensor* ot = to_blocked ? blk : lin;
      DType* odt = to_blocked ? &bdt : &ldt;
      qqStatus_t st = check_tensor(c, "out", ot, odt);
      if (st == QQ_STATUS_SUCCESS) st = expect_bytes(c, "out", ot, *odt, "scale bytes");
      if (st != QQ_STATUS_SUCCESS) return st == QQ_STATUS_INVALID_DTYPE ? QQ_STATUS_INVALID_VALUE : st;
    }
    if (lin->ndim < 1)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: the linear scales must have at least one dimension", op);
    int64_t bshape[kMaxDims + 1];
    const int nd = lin->ndim;
    int o = 0;
    for (int i = 0; i + 2 < nd; ++i) bshape[o++] = lin->shape[i];
    bshape[o++] = roundup(nd >= 2 ? lin->shape[nd - 2] : 1, 128);
    bshape[o++] = roundup(lin->shape[nd - 1], 4);
    QQ_TRY(expect_shape(c, bname, blk, o, bshape, "blocked layout: [batch..., roundup(rows,128), roundup(cols,4)]"));
    QQ_TRY(expect_compact(c, bname, blk));
    if (!to_blocked) QQ_TRY(expect_compact(c, lname, lin));
    Mat l, b;
    QQ_TRY(to_mat(c, lname, lin, ldt, &l));
    QQ_TRY(to_mat(c, bname, blk, bdt, &b));
    if (nd == 1) b.nb = 0;
    QQ_TRY(to_blocked ? check_no_alias(c, {{bname, blk}}, {{lname, lin}}) : check_no_alias(c, {{lname, lin}}, {{bname, blk}}));
    if (numel(lin) == 0 || numel(blk) == 0) return QQ_STATUS_SUCCESS;  // nothing to move (or pad: no blocks)
    if (c.device < 0) return cpu::swizzle(l, b, to_blocked);
    return cuda::swizzle(handle, l, b, to_blocked, stream);
  });
}
}  // namespace
}  // namespace qq

using namespace qq;

extern "C" {

QQ_API qqStatus_t qqSwizzleScales(qqHandle_t handle, const DLTensor* linear, DLTensor* blocked, void* stream) {
  return swizzle_common("swizzle_scales", handle, linear, blocked, true, stream);
}
QQ_API qqStatus_t qqUnswizzleScales(qqHandle_t handle, const DLTensor* blocked, DLTensor* linear, void* stream) {
  return swizzle_common("unswizzle_scales", handle, linear, blocked, false, stream);
}

QQ_API qqStatus_t qqAmax(qqHandle_t handle, const DLTensor* x, DLTensor* out, void* stream) {
  return guard("amax", [&]() -> qqStatus_t {
    Ctx c{"amax"};
    DType dt, odt;
    QQ_TRY(check_tensor(c, "x", x, &dt));
    QQ_TRY(expect_float(c, "x", x, dt));
    QQ_TRY(check_output(c, "out", out, false, &odt));
    if (odt != DType::F32 || numel(out) != 1)
      return set_error(QQ_STATUS_INVALID_VALUE, "amax: argument 'out' must be a float32 tensor of one element");
    Mat m;
    QQ_TRY(to_mat(c, "x", x, dt, &m));
    QQ_TRY(check_no_alias(c, {{"out", out}}, {{"x", x}}));
    float* o = (float*)((char*)out->data + out->byte_offset);
    if (c.device < 0) return cpu::amax(m, o);
    return cuda::amax(handle, m, o, stream);
  });
}

QQ_API qqStatus_t qqSwiglu(qqHandle_t handle, const DLTensor* x, DLTensor* out, void* stream) {
  return guard("swiglu", [&]() -> qqStatus_t {
    Ctx c{"swiglu"};
    DType dt;
    QQ_TRY(check_tensor(c, "x", x, &dt));
    QQ_TRY(expect_float(c, "x", x, dt));
    if (x->ndim < 1 || x->shape[x->ndim - 1] % 2)
      return set_error(QQ_STATUS_INVALID_VALUE, "swiglu: argument 'x' has shape %s; expected [..., 2F] (the gate "
                       "in the first F columns, the up projection in the last F): an even last axis",
                       shape_str(x->ndim, x->shape).c_str());
    int64_t oshape[kMaxDims + 2];
    for (int i = 0; i < x->ndim; ++i) oshape[i] = x->shape[i];
    oshape[x->ndim - 1] /= 2;
    Mat m, o;
    QQ_TRY(to_mat(c, "x", x, dt, &m));
    QQ_TRY(output_mat(c, "out", out, x->ndim, oshape, (int)dt, "x's shape with the last axis halved, x's dtype",
                      &o));
    QQ_TRY(check_no_alias(c, {{"out", out}}, {{"x", x}}));
    if (m.batch() * m.rows * m.cols == 0) return QQ_STATUS_SUCCESS;
    if (c.device < 0) return cpu::swiglu(m, o);
    return cuda::swiglu(handle, m, o, stream);
  });
}

}  // extern "C"
