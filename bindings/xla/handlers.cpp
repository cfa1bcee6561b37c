// handlers.cpp - libqq's operations as XLA FFI custom-call handlers (JAX under jax.jit).
//
// Built into libqq_xla.so (installed next to libqq in the Python package, qq/lib/),
// loaded by qq/_jax_ffi.py with ctypes on first use and registered with
// jax.ffi.register_ffi_target for the "cpu" and "CUDA" platforms. Each handler:
//   1. answers XLA's metadata query at registration (API version, no traits);
//   2. reads its operands, results and attributes from the call frame (xla_ffi.h, our
//      declarations of XLA's C API; see tests/test_jax_ffi_abi.py);
//   3. wraps XLA's buffers in DLTensors (kDLCPU, or kDLCUDA on XLA's device ordinal) and
//      calls libqq's public C ABI (qq.h) - on the CUDA platform on XLA's stream, without
//      ever synchronizing it;
//   4. turns a failing qqStatus_t into an XLA FFI error carrying qqGetLastErrorMessage(),
//      so that jax raises with libqq's message (function, argument, fix).
// No C++ exception leaves an entry point (run() catches everything).
//
// Operands are named: the Python side passes the attribute `operands`, a comma-separated
// list of the operand names in order ("x,global_scale"), so optional operands are simply
// absent. Parameters come as integer attributes holding qq.h's enum values (resolved and
// validated in Python by the same code as the eager calls), plus `rank`: the rank of the
// first operand as traced.
//
// jax.vmap: every op is called with vmap_method="expand_dims", so under k nested vmaps
// each operand and result gains k leading axes (nb = actual rank - `rank`); a result's
// leading axes are the vmap sizes V, an operand's are V (batched) or 1 (not batched).
// run_batched() then either folds V into the op's own leading batch axes (one libqq
// call, when only operands that take leading batch axes are batched: e.g. x of quantize)
// or loops over V, calling libqq once per vmap index with pointer offsets (anything else:
// per-example global scales, a batched weight, amax).
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <exception>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include "qq/qq.h"
#include "xla_ffi.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define QQ_XLA_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using namespace qq_xla;

// ---- failures -------------------------------------------------------------------------------
struct Failure {
  ErrorCode code;
  std::string message;
};

// An error returned by one of XLA's own API functions (stream or device query): passed on
// to XLA as it is. (A pointer to the incomplete Error cannot be thrown itself.)
struct XlaFailure {
  Error* error;
};

[[noreturn]] void fail(ErrorCode code, std::string message) { throw Failure{code, std::move(message)}; }

// A libqq status as an XLA error code, with libqq's message (read on this thread, right after
// the failing call: it is thread-local and overwritten by the next libqq call).
void check(qqStatus_t st) {
  if (st == QQ_STATUS_SUCCESS) return;
  const char* m = qqGetLastErrorMessage();
  std::string msg = (m && *m) ? m : qqGetStatusString(st);
  ErrorCode code = kErrorInternal;
  switch (st) {
    case QQ_STATUS_INVALID_VALUE:
    case QQ_STATUS_INVALID_DTYPE: code = kErrorInvalidArgument; break;
    case QQ_STATUS_NOT_SUPPORTED:
    case QQ_STATUS_ARCH_MISMATCH: code = kErrorUnimplemented; break;
    case QQ_STATUS_ALLOC_FAILED: code = kErrorResourceExhausted; break;
    default: break;
  }
  fail(code, msg + " [" + qqGetStatusString(st) + "]");
}

// ---- the call frame, decoded ------------------------------------------------------------------
enum class Platform { kCpu, kCuda };

// One array as an op sees it: XLA's buffer, or a per-vmap-index slice of it.
struct Arr {
  std::string name;
  void* data = nullptr;
  DataType dtype = kF32;
  std::vector<int64_t> dims;
};

struct Attr {
  std::string name;
  AttrType type;
  const void* value;
};

int64_t element_size(DataType t) {
  switch (t) {
    case kS64: case kU64: case kF64: return 8;
    case kS32: case kU32: case kF32: return 4;
    case kS16: case kU16: case kF16: case kBF16: return 2;
    default: return 1;
  }
}

int64_t product(const int64_t* d, size_t n) {
  int64_t p = 1;
  for (size_t i = 0; i < n; ++i) p *= d[i];
  return p;
}

struct Call {
  const char* op;
  Platform platform;
  int device = 0;         // CUDA device ordinal (XLA's)
  void* stream = nullptr;  // XLA's stream on CUDA
  std::vector<Attr> attrs;
  std::vector<Arr> in, out;

  const Arr* arg(const char* name) const {
    for (const Arr& a : in)
      if (a.name == name) return &a;
    return nullptr;
  }
  const Arr& need(const char* name) const {
    const Arr* a = arg(name);
    if (!a) fail(kErrorInvalidArgument, std::string(op) + ": operand '" + name + "' is missing (a bug in qq's JAX layer)");
    return *a;
  }
  const Attr* attr(const char* name) const {
    for (const Attr& a : attrs)
      if (a.name == name) return &a;
    return nullptr;
  }
  int64_t integer(const char* name, int64_t dflt, bool required = true) const {
    const Attr* a = attr(name);
    if (!a) {
      if (required) fail(kErrorInvalidArgument, std::string(op) + ": attribute '" + name + "' is missing");
      return dflt;
    }
    const Scalar* s = static_cast<const Scalar*>(a->value);
    if (a->type != kAttrScalar || !s || !s->value) fail(kErrorInvalidArgument, std::string(op) + ": attribute '" + name + "' is not a scalar");
    switch (s->dtype) {
      case kS8: return *static_cast<const int8_t*>(s->value);
      case kS16: return *static_cast<const int16_t*>(s->value);
      case kS32: return *static_cast<const int32_t*>(s->value);
      case kS64: return *static_cast<const int64_t*>(s->value);
      case kU8: case kPred: return *static_cast<const uint8_t*>(s->value);
      case kU32: return *static_cast<const uint32_t*>(s->value);
      default: fail(kErrorInvalidArgument, std::string(op) + ": attribute '" + name + "' is not an integer");
    }
  }
  double real(const char* name, double dflt) const {
    const Attr* a = attr(name);
    if (!a) return dflt;
    const Scalar* s = static_cast<const Scalar*>(a->value);
    if (a->type != kAttrScalar || !s || !s->value) fail(kErrorInvalidArgument, std::string(op) + ": attribute '" + name + "' is not a scalar");
    if (s->dtype == kF32) return *static_cast<const float*>(s->value);
    if (s->dtype == kF64) return *static_cast<const double*>(s->value);
    return static_cast<double>(integer(name, 0));
  }
  std::string string(const char* name) const {
    const Attr* a = attr(name);
    if (!a) return "";
    if (a->type != kAttrString) fail(kErrorInvalidArgument, std::string(op) + ": attribute '" + name + "' is not a string");
    const ByteSpan* b = static_cast<const ByteSpan*>(a->value);
    return std::string(b->ptr, b->len);
  }
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i <= s.size() && !s.empty()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return v;
}

Arr buffer(const char* op, const char* what, int64_t i, const void* p) {
  const Buffer* b = static_cast<const Buffer*>(p);
  if (!b || b->struct_size < QQ_XLA_SIZE_UPTO(Buffer, dims) || b->rank < 0 || (b->rank > 0 && !b->dims))
    fail(kErrorInvalidArgument, std::string(op) + ": " + what + " " + std::to_string(i) + " is not an XLA buffer this version of qq reads");
  Arr a;
  a.data = b->data;
  a.dtype = b->dtype;
  a.dims.assign(b->dims, b->dims + b->rank);
  return a;
}

void decode(CallFrame* f, Call& c) {
  if (f->struct_size < QQ_XLA_SIZE_UPTO(CallFrame, attrs) || f->args.struct_size < QQ_XLA_SIZE_UPTO(Args, args) ||
      f->rets.struct_size < QQ_XLA_SIZE_UPTO(Rets, rets) || f->attrs.struct_size < QQ_XLA_SIZE_UPTO(Attrs, attrs))
    fail(kErrorFailedPrecondition, std::string(c.op) + ": XLA's call frame is older than qq's handlers read");
  for (int64_t i = 0; i < f->attrs.size; ++i) {
    const ByteSpan* n = f->attrs.names[i];
    c.attrs.push_back(Attr{std::string(n->ptr, n->len), f->attrs.types[i], f->attrs.attrs[i]});
  }
  std::vector<std::string> names = split(c.string("operands"));
  if (static_cast<int64_t>(names.size()) != f->args.size)
    fail(kErrorInvalidArgument, std::string(c.op) + ": " + std::to_string(f->args.size) + " operands for " +
                                    std::to_string(names.size()) + " names (a bug in qq's JAX layer)");
  for (int64_t i = 0; i < f->args.size; ++i) {
    if (f->args.types[i] != kArgBuffer) fail(kErrorInvalidArgument, std::string(c.op) + ": operand " + std::to_string(i) + " is not a buffer");
    c.in.push_back(buffer(c.op, "operand", i, f->args.args[i]));
    c.in.back().name = names[i];
  }
  for (int64_t i = 0; i < f->rets.size; ++i) {
    if (f->rets.types[i] != kRetBuffer) fail(kErrorInvalidArgument, std::string(c.op) + ": result " + std::to_string(i) + " is not a buffer");
    c.out.push_back(buffer(c.op, "result", i, f->rets.rets[i]));
  }
  if (c.platform == Platform::kCuda) {
    const Api* api = f->api;
    if (api->struct_size < QQ_XLA_SIZE_UPTO(Api, device_ordinal_get) || !api->stream_get || !api->device_ordinal_get)
      fail(kErrorFailedPrecondition, std::string(c.op) + ": this XLA does not tell FFI handlers their device "
                                     "(XLA_FFI_DeviceOrdinal_Get); qq's CUDA handlers need a newer jaxlib");
    StreamGetArgs sa{QQ_XLA_SIZE_UPTO(StreamGetArgs, stream), nullptr, f->ctx, nullptr};
    if (Error* e = api->stream_get(&sa)) throw XlaFailure{e};
    DeviceOrdinalGetArgs da{QQ_XLA_SIZE_UPTO(DeviceOrdinalGetArgs, device_ordinal), nullptr, f->ctx, 0};
    if (Error* e = api->device_ordinal_get(&da)) throw XlaFailure{e};
    c.stream = sa.stream;
    c.device = da.device_ordinal;
  }
}

// ---- DLTensors of XLA buffers ------------------------------------------------------------------
DLDataType dl_dtype(const Call& c, const Arr& a) {
  DLDataType t{0, 0, 1};
  switch (a.dtype) {
    case kF32: t.code = kDLFloat; t.bits = 32; break;
    case kF16: t.code = kDLFloat; t.bits = 16; break;
    case kF64: t.code = kDLFloat; t.bits = 64; break;
    case kBF16: t.code = kDLBfloat; t.bits = 16; break;
    case kU8: t.code = kDLUInt; t.bits = 8; break;
    case kU16: t.code = kDLUInt; t.bits = 16; break;
    case kU32: t.code = kDLUInt; t.bits = 32; break;
    case kU64: t.code = kDLUInt; t.bits = 64; break;
    case kS8: t.code = kDLInt; t.bits = 8; break;
    case kS16: t.code = kDLInt; t.bits = 16; break;
    case kS32: t.code = kDLInt; t.bits = 32; break;
    case kS64: t.code = kDLInt; t.bits = 64; break;
    case kPred: t.code = kDLBool; t.bits = 8; break;
    case kF8E4M3FN: t.code = kDLFloat8_e4m3fn; t.bits = 8; break;
    case kF8E5M2: t.code = kDLFloat8_e5m2; t.bits = 8; break;
    case kF8E8M0FNU: t.code = kDLFloat8_e8m0fnu; t.bits = 8; break;
    case kF8E4M3: t.code = kDLFloat8_e4m3; t.bits = 8; break;
    case kF8E3M4: t.code = kDLFloat8_e3m4; t.bits = 8; break;
    case kF8E4M3FNUZ: t.code = kDLFloat8_e4m3fnuz; t.bits = 8; break;
    case kF8E5M2FNUZ: t.code = kDLFloat8_e5m2fnuz; t.bits = 8; break;
    case kF8E4M3B11FNUZ: t.code = kDLFloat8_e4m3b11fnuz; t.bits = 8; break;
    default:
      fail(kErrorInvalidArgument, std::string(c.op) + ": argument '" + a.name + "' has XLA element type " +
                                      std::to_string(static_cast<int>(a.dtype)) +
                                      ", which qq does not take (float32, float16, bfloat16, uint8 or a float8 type)");
  }
  return t;
}

// A compact row-major DLTensor view of `a` (its dims vector must outlive the view).
DLTensor dl(const Call& c, Arr& a) {
  DLTensor t;
  t.data = a.data;
  t.device.device_type = c.platform == Platform::kCuda ? kDLCUDA : kDLCPU;
  t.device.device_id = c.platform == Platform::kCuda ? c.device : 0;
  t.ndim = static_cast<int32_t>(a.dims.size());
  t.dtype = dl_dtype(c, a);
  t.shape = a.dims.data();
  t.strides = nullptr;  // compact row-major: XLA's default layout, which ffi_call asks for
  t.byte_offset = 0;
  return t;
}

// An optional operand: its DLTensor in *t and &*t, or NULL.
const DLTensor* opt(Call& c, const char* name, DLTensor* t) {
  for (Arr& a : c.in)
    if (a.name == name) {
      *t = dl(c, a);
      return t;
    }
  return nullptr;
}

DLTensor need(Call& c, const char* name) {
  DLTensor t;
  if (!opt(c, name, &t)) c.need(name);  // throws with the name
  return t;
}

qqQuantParams_t quant_params(const Call& c) {
  qqQuantParams_t p;
  check(qqQuantParamsInit(&p, static_cast<qqMode_t>(c.integer("mode", 0))));
  p.group_size = static_cast<int>(c.integer("group_size", 0));
  p.bits = static_cast<int>(c.integer("bits", 0));
  p.rounding = static_cast<qqRounding_t>(c.integer("rounding", 0));
  p.scale_layout = static_cast<qqScaleLayout_t>(c.integer("scale_layout", 0, false));
  p.fp8_format = static_cast<qqFp8Format_t>(c.integer("fp8_format", 0));
  return p;
}

void* stream(const Call& c) { return c.platform == Platform::kCuda ? c.stream : nullptr; }

// ---- the operations ------------------------------------------------------------------------------
// quantize: operands x[, global_scale]; results data, scales[, biases (affine)].
void op_quantize(Call& c) {
  qqQuantParams_t p = quant_params(c);
  DLTensor x = need(c, "x"), g;
  const DLTensor* gs = opt(c, "global_scale", &g);
  if (c.out.size() < 2) fail(kErrorInvalidArgument, "quantize: expected 2 or 3 results");
  DLTensor data = dl(c, c.out[0]), scales = dl(c, c.out[1]), biases;
  DLTensor* b = c.out.size() > 2 ? (biases = dl(c, c.out[2]), &biases) : nullptr;
  check(qqQuantize(nullptr, &x, &p, gs, &data, &scales, b, stream(c)));
}

// quantize_colwise: operands x[, global_scale]; results data_t, scales_t[, biases_t] and,
// with rowwise=1, data, scales[, biases].
void op_quantize_colwise(Call& c) {
  qqQuantParams_t p = quant_params(c);
  DLTensor x = need(c, "x"), g;
  const DLTensor* gs = opt(c, "global_scale", &g);
  size_t per = p.mode == QQ_MODE_AFFINE ? 3 : 2;
  bool rowwise = c.integer("rowwise", 0, false) != 0;
  if (c.out.size() != per * (rowwise ? 2 : 1)) fail(kErrorInvalidArgument, "quantize_colwise: unexpected number of results");
  DLTensor t[6];
  for (size_t i = 0; i < c.out.size(); ++i) t[i] = dl(c, c.out[i]);
  DLTensor* bt = per == 3 ? &t[2] : nullptr;
  DLTensor* rd = rowwise ? &t[per] : nullptr;
  DLTensor* rs = rowwise ? &t[per + 1] : nullptr;
  DLTensor* rb = rowwise && per == 3 ? &t[per + 2] : nullptr;
  check(qqQuantizeColwise(nullptr, &x, &p, gs, &t[0], &t[1], bt, rd, rs, rb, stream(c)));
}

// dequantize: operands data, scales[, biases][, global_scale]; result out.
void op_dequantize(Call& c) {
  qqQuantParams_t p = quant_params(c);
  DLTensor w = need(c, "w"), s = need(c, "scales"), b, g;
  const DLTensor* bp = opt(c, "biases", &b);
  const DLTensor* gs = opt(c, "global_scale", &g);
  DLTensor out = dl(c, c.out.at(0));
  check(qqDequantize(nullptr, &w, &s, bp, &p, gs, &out, stream(c)));
}

// amax: operand x; result out (float32, shape ()).
void op_amax(Call& c) {
  DLTensor x = need(c, "x"), out = dl(c, c.out.at(0));
  check(qqAmax(nullptr, &x, &out, stream(c)));
}

// swiglu: operand x [..., 2F]; result out [..., F] (x's dtype).
void op_swiglu(Call& c) {
  DLTensor x = need(c, "x"), out = dl(c, c.out.at(0));
  check(qqSwiglu(nullptr, &x, &out, stream(c)));
}

// quantize_moe: operand w [..., E, D1, D2] (leading axes fold into E); results data
// [..., E, D2, D1] - the column-major [E, D1, D2] libqq writes, which the Python side
// swaps back - and scales.
void op_quantize_moe(Call& c) {
  qqQuantParams_t p;
  check(qqQuantParamsInit(&p, QQ_MODE_MXFP8));
  p.rounding = static_cast<qqRounding_t>(c.integer("rounding", 0));
  p.scale_layout = static_cast<qqScaleLayout_t>(c.integer("scale_layout", 0));
  p.fp8_format = static_cast<qqFp8Format_t>(c.integer("fp8_format", 0));
  qqMoeScaling_t scaling = static_cast<qqMoeScaling_t>(c.integer("scaling", 0));
  Arr& w = c.in.at(0);
  if (w.dims.size() < 3 || c.out.size() != 2 || c.out[0].dims.size() != w.dims.size() || c.out[1].dims.size() != w.dims.size())
    fail(kErrorInvalidArgument, "quantize_moe: argument 'w' must be [E, D1, D2]");
  size_t r = w.dims.size();
  int64_t e = product(w.dims.data(), r - 2), d1 = w.dims[r - 2], d2 = w.dims[r - 1];
  Arr wf = w, sf = c.out[1];
  wf.dims = {e, d1, d2};
  sf.dims = {product(sf.dims.data(), r - 2), sf.dims[r - 2], sf.dims[r - 1]};
  DLTensor tw = dl(c, wf), ts = dl(c, sf);
  Arr df = c.out[0];
  df.dims = {e, d1, d2};
  int64_t strides[3] = {d1 * d2, 1, d1};  // column-major per expert (qq.h, qqQuantizeMoe)
  DLTensor td = dl(c, df);
  td.strides = strides;
  check(qqQuantizeMoe(nullptr, &tw, &p, scaling, &td, &ts, stream(c)));
}

// qqmm: operands x[, x_scales], w[, scales][, global_scale_x][, global_scale_w][, bias][, c]
// [, w_values]; result out.
void op_qqmm(Call& c) {
  qqQqmmParams_t qp;
  check(qqQqmmParamsInit(&qp, static_cast<qqMode_t>(c.integer("mode", 0))));
  qp.quant = quant_params(c);
  qp.x_scale_layout = static_cast<qqScaleLayout_t>(c.integer("x_scale_layout", 0));
  qp.w_scale_layout = static_cast<qqScaleLayout_t>(c.integer("w_scale_layout", 0));
  qp.route = static_cast<qqRoute_t>(c.integer("route", 0, false));
  DLTensor x = need(c, "x"), w = need(c, "w"), xs, ws, gx, gw, bias, cc, wv;
  const DLTensor* pxs = opt(c, "x_scales", &xs);
  const DLTensor* pws = opt(c, "scales", &ws);
  const DLTensor* pgx = opt(c, "global_scale_x", &gx);
  const DLTensor* pgw = opt(c, "global_scale_w", &gw);
  const DLTensor* pb = opt(c, "bias", &bias);
  qp.c = opt(c, "c", &cc);
  qp.beta = qp.c ? static_cast<float>(c.real("beta", 1.0)) : 0.0f;
  qp.w_values = opt(c, "w_values", &wv);
  DLTensor out = dl(c, c.out.at(0));
  check(qqQqmm(nullptr, &x, pxs, &w, pws, &qp, pgx, pgw, pb, &out, stream(c)));
}

// quantized_matmul: operands x, w, scales[, biases][, global_scale][, bias]; result out.
void op_quantized_matmul(Call& c) {
  qqQuantParams_t p = quant_params(c);
  int transpose = c.integer("transpose", 1) != 0;
  DLTensor x = need(c, "x"), w = need(c, "w"), s = need(c, "scales"), b, g, bias;
  const DLTensor* pb = opt(c, "biases", &b);
  const DLTensor* pg = opt(c, "global_scale", &g);
  const DLTensor* pbias = opt(c, "bias", &bias);
  DLTensor out = dl(c, c.out.at(0));
  check(qqQuantizedMatmul(nullptr, &x, &w, &s, pb, &p, transpose, pg, pbias, &out, stream(c)));
}

// gather_qmm: operands x, w, scales[, biases], rhs_indices[, global_scale][, bias]; result out.
void op_gather_qmm(Call& c) {
  qqQuantParams_t p = quant_params(c);
  int transpose = c.integer("transpose", 1) != 0;
  DLTensor x = need(c, "x"), w = need(c, "w"), s = need(c, "scales"), idx = need(c, "rhs_indices"), b, g, bias;
  const DLTensor* pb = opt(c, "biases", &b);
  const DLTensor* pg = opt(c, "global_scale", &g);
  const DLTensor* pbias = opt(c, "bias", &bias);
  DLTensor out = dl(c, c.out.at(0));
  check(qqGatherQmm(nullptr, &x, &w, &s, pb, &idx, &p, transpose, pg, pbias, &out, stream(c)));
}

// ---- vmap: fold or loop ----------------------------------------------------------------------------
// Whether the vmap axes may be folded into the op's own leading batch axes, given which
// operands are batched (have the vmap sizes on their leading axes; the others have 1s).
// Folding must give exactly the per-example results laid out one after another.
bool only(const Call& c, const std::vector<bool>& batched, std::initializer_list<const char*> names) {
  for (size_t i = 0; i < c.in.size(); ++i) {
    bool listed = false;
    for (const char* n : names) listed = listed || c.in[i].name == n;
    if (batched[i] != listed) return false;
  }
  return true;
}

// Blocked scales are one padded matrix per batch entry of [..., M, K]: vmap axes can join
// the batch axes only where each example has its own M axis (rank >= 2).
bool rows_fold(const Call& c, int base_rank) { return c.integer("scale_layout", 0, false) == QQ_SCALE_LINEAR || base_rank >= 2; }

bool fold_quantize(const Call& c, const std::vector<bool>& b, int base_rank) {
  return only(c, b, {"x"}) && rows_fold(c, base_rank);
}
bool fold_colwise(const Call& c, const std::vector<bool>& b, int) { return only(c, b, {"x"}); }
bool fold_dequantize(const Call& c, const std::vector<bool>& b, int base_rank) {
  return only(c, b, {"w", "scales", "biases"}) && rows_fold(c, base_rank);  // (biases: affine only)
}
bool fold_never(const Call&, const std::vector<bool>&, int) { return false; }
bool fold_always(const Call&, const std::vector<bool>&, int) { return true; }
bool fold_qqmm(const Call& c, const std::vector<bool>& b, int base_rank) {
  // x (with its scales and C when given) batched, the weight side and the global scales not.
  bool xs = c.arg("x_scales") != nullptr, cc = c.arg("c") != nullptr;
  if (xs && c.integer("x_scale_layout", 0) != QQ_SCALE_LINEAR && base_rank < 2) return false;
  if (xs && cc) return only(c, b, {"x", "x_scales", "c"});
  if (xs) return only(c, b, {"x", "x_scales"});
  if (cc) return only(c, b, {"x", "c"});
  return only(c, b, {"x"});
}
bool fold_qmm(const Call& c, const std::vector<bool>& b, int) { return only(c, b, {"x"}); }

struct OpDef {
  const char* name;
  void (*run)(Call&);
  bool (*fold)(const Call&, const std::vector<bool>& batched, int base_rank);
};

// How many vmapped calls were folded into one libqq call, and how many looped: a
// diagnostic for the tests (qq_xla_vmap_counts), which check that both paths run.
std::atomic<int64_t> g_folded{0}, g_looped{0};

void run_batched(Call& c, const OpDef& op) {
  if (c.in.empty() || c.out.empty()) fail(kErrorInvalidArgument, std::string(c.op) + ": no operands or results");
  int64_t base_rank = c.integer("rank", 0);
  int64_t nb = static_cast<int64_t>(c.in[0].dims.size()) - base_rank;
  if (nb == 0) return op.run(c);
  if (nb < 0) fail(kErrorInvalidArgument, std::string(c.op) + ": operand 'x' has fewer axes than traced");
  // The vmap sizes are the results' leading axes.
  std::vector<int64_t> v(c.out[0].dims.begin(), c.out[0].dims.begin() + nb);
  std::vector<bool> batched(c.in.size(), false);
  for (size_t i = 0; i < c.in.size(); ++i) {
    const Arr& a = c.in[i];
    if (static_cast<int64_t>(a.dims.size()) < nb) fail(kErrorInternal, std::string(c.op) + ": vmap axes missing on operand " + a.name);
    for (int64_t j = 0; j < nb; ++j) {
      if (a.dims[j] != 1 && a.dims[j] != v[j]) fail(kErrorInternal, std::string(c.op) + ": vmap axis of operand " + a.name + " does not match");
      batched[i] = batched[i] || (a.dims[j] != 1);
    }
  }
  if (op.fold(c, batched, static_cast<int>(base_rank))) {
    // Batched operands keep the vmap axes as leading batch axes; the others drop their 1s.
    for (size_t i = 0; i < c.in.size(); ++i)
      if (!batched[i]) c.in[i].dims.erase(c.in[i].dims.begin(), c.in[i].dims.begin() + nb);
    g_folded.fetch_add(1, std::memory_order_relaxed);
    return op.run(c);
  }
  g_looped.fetch_add(1, std::memory_order_relaxed);
  // One libqq call per vmap index, every array sliced at it (broadcast along its 1s).
  Call one = c;
  auto slice_strides = [&](const Arr& a) {
    std::vector<int64_t> s(nb);
    int64_t inner = product(a.dims.data() + nb, a.dims.size() - nb) * element_size(a.dtype);
    for (int64_t j = nb - 1; j >= 0; --j) {
      s[j] = a.dims[j] == 1 ? 0 : inner;
      inner *= a.dims[j];
    }
    return s;
  };
  std::vector<std::vector<int64_t>> sin, sout;
  for (size_t i = 0; i < c.in.size(); ++i) {
    sin.push_back(slice_strides(c.in[i]));
    one.in[i].dims.erase(one.in[i].dims.begin(), one.in[i].dims.begin() + nb);
  }
  for (size_t i = 0; i < c.out.size(); ++i) {
    sout.push_back(slice_strides(c.out[i]));
    one.out[i].dims.erase(one.out[i].dims.begin(), one.out[i].dims.begin() + nb);
  }
  int64_t total = product(v.data(), v.size());
  std::vector<int64_t> idx(nb, 0);
  for (int64_t k = 0; k < total; ++k) {
    for (size_t i = 0; i < c.in.size(); ++i) {
      int64_t off = 0;
      for (int64_t j = 0; j < nb; ++j) off += idx[j] * sin[i][j];
      one.in[i].data = c.in[i].data ? static_cast<char*>(c.in[i].data) + off : nullptr;
    }
    for (size_t i = 0; i < c.out.size(); ++i) {
      int64_t off = 0;
      for (int64_t j = 0; j < nb; ++j) off += idx[j] * sout[i][j];
      one.out[i].data = c.out[i].data ? static_cast<char*>(c.out[i].data) + off : nullptr;
    }
    op.run(one);
    for (int64_t j = nb - 1; j >= 0; --j) {  // next index, row-major
      if (++idx[j] < v[j]) break;
      idx[j] = 0;
    }
  }
}

// ---- IEEE arithmetic on XLA's CPU threads ----------------------------------------------------------
// XLA's CPU runtime computes with denormals flushed to zero (x86: MXCSR's FTZ and DAZ bits;
// Arm: FPCR.FZ) on the threads that run its kernels - and so custom calls. libqq's numerics
// are exact IEEE arithmetic (docs/formats.md: subnormal inputs and scales are ordinary
// values), so on the CPU platform a handler runs libqq with that state cleared and
// round-to-nearest-even set, and restores XLA's state afterwards. (libqq's CPU worker
// threads are created by the calling thread and inherit its floating-point state.)
class IeeeFloatScope {
 public:
  IeeeFloatScope() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    // clear FTZ (bit 15), DAZ (bit 6) and the rounding control (bits 13-14: 00 = nearest)
    _mm_setcsr(saved_ & ~(0x8000u | 0x0040u | 0x6000u));
#elif defined(__aarch64__)
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    // clear FZ (bit 24), FZ16 (bit 19) and RMode (bits 22-23: 00 = nearest)
    uint64_t v = saved_ & ~((1ull << 24) | (1ull << 19) | (3ull << 22));
    __asm__ __volatile__("msr fpcr, %0" : : "r"(v));
#endif
  }
  ~IeeeFloatScope() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved_);
#elif defined(__aarch64__)
    __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_));
#endif
  }
  IeeeFloatScope(const IeeeFloatScope&) = delete;
  IeeeFloatScope& operator=(const IeeeFloatScope&) = delete;

 private:
#if defined(__aarch64__)
  uint64_t saved_ = 0;
#else
  unsigned saved_ = 0;
#endif
};

// ---- the entry points --------------------------------------------------------------------------
Error* make_error(const Api* api, ErrorCode code, const char* message) noexcept {
  if (!api || api->struct_size < QQ_XLA_SIZE_UPTO(Api, error_create) || !api->error_create) return nullptr;
  ErrorCreateArgs a{QQ_XLA_SIZE_UPTO(ErrorCreateArgs, errc), nullptr, message, code};
  return api->error_create(&a);
}

// XLA's metadata query (at registration): report the API version of xla_ffi.h.
bool answer_metadata(CallFrame* f) noexcept {
  ExtensionBase* e = f->extension_start;
  if (!e || e->type != kExtensionMetadata) return false;
  MetadataExtension* m = reinterpret_cast<MetadataExtension*>(e);
  if (e->struct_size >= QQ_XLA_SIZE_UPTO(MetadataExtension, metadata) && m->metadata &&
      m->metadata->struct_size >= QQ_XLA_SIZE_UPTO(Metadata, traits)) {
    m->metadata->api_version.major_version = kApiMajor;
    m->metadata->api_version.minor_version = kApiMinor;
    m->metadata->traits = 0;  // not declared command-buffer compatible (docs/adapters.md)
  }
  return true;
}

Error* run(CallFrame* f, const OpDef& op, Platform platform) noexcept {
  if (!f) return nullptr;
  if (answer_metadata(f)) return nullptr;
  const Api* api = f->api;
  try {
    if (f->stage != kStageExecute) return nullptr;  // only the execute stage is registered
    Call c;
    c.op = op.name;
    c.platform = platform;
    decode(f, c);
    if (platform == Platform::kCpu) {
      IeeeFloatScope ieee;
      run_batched(c, op);
    } else {
      run_batched(c, op);
    }
    return nullptr;
  } catch (const XlaFailure& e) {
    return e.error;
  } catch (const Failure& e) {
    return make_error(api, e.code, e.message.c_str());
  } catch (const std::bad_alloc&) {
    return make_error(api, kErrorResourceExhausted, (std::string(op.name) + ": out of host memory").c_str());
  } catch (const std::exception& e) {
    return make_error(api, kErrorInternal, e.what());
  } catch (...) {
    return make_error(api, kErrorInternal, "unknown C++ exception in a qq XLA handler (please report it)");
  }
}

const OpDef kQuantize{"quantize", op_quantize, fold_quantize};
const OpDef kQuantizeColwise{"quantize_colwise", op_quantize_colwise, fold_colwise};
const OpDef kDequantize{"dequantize", op_dequantize, fold_dequantize};
const OpDef kAmax{"amax", op_amax, fold_never};
const OpDef kQuantizeMoe{"quantize_moe", op_quantize_moe, fold_always};
const OpDef kSwiglu{"swiglu", op_swiglu, fold_always};
const OpDef kQqmm{"qqmm", op_qqmm, fold_qqmm};
const OpDef kQuantizedMatmul{"quantized_matmul", op_quantized_matmul, fold_qmm};
// (vmap loops: x's batch axes and the indices broadcast from the right, so leading vmap
// axes on both would line up only when their ranks agree)
const OpDef kGatherQmm{"gather_qmm", op_gather_qmm, fold_never};

}  // namespace

// qq_xla_<op>_cpu / qq_xla_<op>_cuda: the handlers jax.ffi.register_ffi_target registers for
// the "cpu" and "CUDA" platforms (qq/_jax_ffi.py).
#define QQ_XLA_HANDLERS(op, def)                                                                        \
  QQ_XLA_EXPORT Error* qq_xla_##op##_cpu(CallFrame* f) noexcept { return run(f, def, Platform::kCpu); } \
  QQ_XLA_EXPORT Error* qq_xla_##op##_cuda(CallFrame* f) noexcept { return run(f, def, Platform::kCuda); }

QQ_XLA_HANDLERS(quantize, kQuantize)
QQ_XLA_HANDLERS(quantize_colwise, kQuantizeColwise)
QQ_XLA_HANDLERS(dequantize, kDequantize)
QQ_XLA_HANDLERS(amax, kAmax)
QQ_XLA_HANDLERS(quantize_moe, kQuantizeMoe)
QQ_XLA_HANDLERS(qqmm, kQqmm)
QQ_XLA_HANDLERS(quantized_matmul, kQuantizedMatmul)
QQ_XLA_HANDLERS(gather_qmm, kGatherQmm)
QQ_XLA_HANDLERS(swiglu, kSwiglu)

// The API version the handlers report (major * 1000 + minor), for qq's diagnostics.
QQ_XLA_EXPORT int qq_xla_api_version(void) noexcept { return kApiMajor * 1000 + kApiMinor; }

// The number of vmapped calls run so far as one folded libqq call / as a loop.
QQ_XLA_EXPORT void qq_xla_vmap_counts(int64_t* folded, int64_t* looped) noexcept {
  if (folded) *folded = g_folded.load(std::memory_order_relaxed);
  if (looped) *looped = g_looped.load(std::memory_order_relaxed);
}
