// validate.cpp - the one validation layer: every check of a C argument and
// every message it gives (declared in validate.h), and the thread's last error.
//
// The entry points (api_*.cpp) read the DLTensors only through these checks
// and produce the plain views of internal.h from them; backends never see a
// DLTensor and never validate. Error messages name the operation and the
// argument, say what was expected and what was given, and where possible the fix.
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "codec.h"
#include "internal.h"
#include "validate.h"

#include "group_ends.h"

namespace qq {

// The one home of the last-error string: set_error writes it, guard() clears
// it on entry, qqGetLastErrorMessage reads it.
static thread_local std::string g_last_error;

qqStatus_t set_error(qqStatus_t st, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_last_error = buf;
  return st;
}

void clear_error() noexcept { g_last_error.clear(); }
const std::string& last_error() { return g_last_error; }

qqStatus_t fail_noexcept(qqStatus_t st, const char* op, const char* what) noexcept {
  try {
    set_error(st, "%s: %s", op, what);
  } catch (...) {  // not even the message could be stored: the status still goes back
  }
  return st;
}

const char* mode_name(qqMode_t m) {
  switch (m) {
    case QQ_MODE_AFFINE: return "affine";
    case QQ_MODE_NVFP4: return "nvfp4";
    case QQ_MODE_MXFP4: return "mxfp4";
    case QQ_MODE_MXFP8: return "mxfp8";
  }
  return "?";
}

std::string shape_str(int ndim, const int64_t* shape) {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) {
    s += std::to_string(shape[i]);
    if (i + 1 < ndim || ndim == 1) s += ",";
    if (i + 1 < ndim) s += " ";
  }
  return s + ")";
}

std::string dtype_str(DLDataType t) {
  if (t.code == kDLFloat4_e2m1fn && t.bits == 4 && t.lanes == 2) return "float4_e2m1fn_x2";
  if (t.lanes != 1) return "vector dtype (lanes=" + std::to_string(t.lanes) + ")";
  switch (t.code) {
    case kDLFloat: return "float" + std::to_string(t.bits);
    case kDLBfloat: return "bfloat" + std::to_string(t.bits);
    case kDLInt: return "int" + std::to_string(t.bits);
    case kDLUInt: return "uint" + std::to_string(t.bits);
    case kDLBool: return "bool";
    case kDLComplex: return "complex" + std::to_string(t.bits);
    default:
      if (t.code >= kDLFloat8_e3m4 && t.code <= kDLFloat8_e8m0fnu) return "float8";
      return "dtype code " + std::to_string(t.code) + " bits " + std::to_string(t.bits);
  }
}

namespace {

// DLPack dtype -> DType; returns false for dtypes libqq never takes.
bool parse_dtype(DLDataType t, DType* out) {
  // Packed fp4 as a framework's own dtype (torch.float4_e2m1fn_x2: two E2M1 codes per byte,
  // low nibble first, the shape counting bytes): the bytes of libqq's packed layout.
  if (t.code == kDLFloat4_e2m1fn && t.bits == 4 && t.lanes == 2) { *out = DType::U8; return true; }
  if (t.lanes != 1) return false;
  if (t.code == kDLFloat && t.bits == 32) { *out = DType::F32; return true; }
  if (t.code == kDLFloat && t.bits == 16) { *out = DType::F16; return true; }
  if (t.code == kDLBfloat && t.bits == 16) { *out = DType::BF16; return true; }
  if ((t.code == kDLUInt || t.code == kDLInt) && t.bits == 8) { *out = DType::U8; return true; }
  if (t.code >= kDLFloat8_e3m4 && t.code <= kDLFloat8_e8m0fnu && t.bits == 8) { *out = DType::U8; return true; }
  if (t.code == kDLInt && t.bits == 32) { *out = DType::I32; return true; }
  return false;
}

bool is_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

qqStatus_t check_device(Ctx& c, const char* name, const DLTensor* t) {
  int dev;
  const int type = raw_enum(t->device.device_type);
  if (type == kDLCPU || type == kDLCUDAHost) {
    dev = -1;
  } else if (type == kDLCUDA || type == kDLCUDAManaged) {
    dev = t->device.device_id;
    if (dev < 0)
      return set_error(QQ_STATUS_INVALID_VALUE,
                       "%s: argument '%s' is a CUDA tensor with device_id %d; a CUDA device id is >= 0", c.op,
                       name, dev);
  } else {
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: argument '%s' is on DLPack device type %d; libqq takes CPU (1) and CUDA (2) "
                     "tensors", c.op, name, type);
  }
  if (c.device == -2) {
    c.device = dev;
    c.device_arg = name;
  } else if (c.device != dev) {
    auto dn = [](int d) { return d < 0 ? std::string("cpu") : "cuda:" + std::to_string(d); };
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: argument '%s' is on %s but '%s' is on %s; move all tensors of one call to "
                     "the same device", c.op, name, dn(dev).c_str(), c.device_arg, dn(c.device).c_str());
  }
  return QQ_STATUS_SUCCESS;
}

// Sizes are bounded so that no index, byte count or packed-shape product
// (at most x 8 for bits, + 127 for the blocked padding) can overflow int64:
// 2^56 elements (or bytes) per tensor is far beyond any memory.
constexpr int64_t kMaxElems = int64_t(1) << 56;

}  // namespace

int64_t numel(const DLTensor* t) {
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] == 0) return 0;  // (first: the other extents' product may be anything)
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

// The product of the extents, or -1 if one is negative or the product of the non-zero ones
// exceeds 2^56: an empty tensor's other extents are bounded too, so that every partial
// product (numel, to_mat's empty strides) fits in int64 once a tensor has passed this.
int64_t bounded_product(int n, const int64_t* shape) {
  int64_t p = 1;
  bool empty = false;
  for (int i = 0; i < n; ++i) {
    if (shape[i] == 0) {
      empty = true;
      continue;
    }
    if (shape[i] < 0 || shape[i] > kMaxElems || p > kMaxElems / shape[i]) return -1;
    p *= shape[i];
  }
  return empty ? 0 : p;
}

int64_t stride_of(const DLTensor* t, int i) {
  if (t->strides) return t->strides[i];
  int64_t s = 1;
  for (int j = i + 1; j < t->ndim; ++j) s *= t->shape[j];
  return s;
}

namespace {

// The bytes a non-empty tensor touches, [lo, hi) relative to data +
// byte_offset; false if a stride times an extent is out of bounds.
bool byte_extent(const DLTensor* t, int64_t* lo, int64_t* hi) {
  const int64_t es = (t->dtype.bits * t->dtype.lanes + 7) / 8;
  // Compact row-major (no strides, or a framework's explicit compact ones: the common case,
  // checked several times a call) touches [0, numel * es): the loop below gives the same
  // [lo, hi), at a division per axis
  int64_t n = 1;
  bool compact = true;
  for (int i = t->ndim - 1; i >= 0 && compact; --i)
    compact = (!t->strides || t->shape[i] == 1 || t->strides[i] == n) && !__builtin_mul_overflow(n, t->shape[i], &n);
  if (compact && n > 0 && n - 1 <= kMaxElems) {
    *lo = 0;
    *hi = n * es;
    return true;
  }
  int64_t l = 0, h = 0;
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] <= 1) continue;
    const int64_t s = stride_of(t, i);
    if (s > kMaxElems || s < -kMaxElems || (t->shape[i] - 1) > kMaxElems / (s < 0 ? -s : (s ? s : 1)))
      return false;
    const int64_t span = s * (t->shape[i] - 1);
    if (span < 0) l += span; else h += span;
    if (h > kMaxElems || l < -kMaxElems) return false;
  }
  *lo = l * es;
  *hi = (h + 1) * es;
  return true;
}

}  // namespace

qqStatus_t check_header(Ctx& c, const char* name, const DLTensor* t) {
  if (!t) return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' is NULL", c.op, name);
  if (t->ndim < 0 || t->ndim > kMaxDims)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has %d dimensions; libqq takes 0 to %d", c.op,
                     name, t->ndim, kMaxDims);
  if (t->ndim > 0 && !t->shape)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has a NULL shape", c.op, name);
  return QQ_STATUS_SUCCESS;
}

qqStatus_t check_tensor(Ctx& c, const char* name, const DLTensor* t, DType* dt) {
  QQ_TRY(check_header(c, name, t));
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] < 0)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has a negative extent %lld in dim %d",
                       c.op, name, (long long)t->shape[i], i);
  if (bounded_product(t->ndim, t->shape) < 0)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has shape %s: more than 2^56 elements, "
                     "beyond what libqq addresses", c.op, name, shape_str(t->ndim, t->shape).c_str());
  if (!parse_dtype(t->dtype, dt))
    return set_error(QQ_STATUS_INVALID_DTYPE, "%s: argument '%s' has dtype %s, which libqq does not take "
                     "(values: float32, float16, bfloat16; packed data and scales: uint8, a float8 dtype or "
                     "float4_e2m1fn_x2; "
                     "group offsets and expert indices: int32)", c.op, name, dtype_str(t->dtype).c_str());
  if (numel(t) > 0) {
    if (!t->data)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has a NULL data pointer", c.op, name);
    int64_t lo, hi;
    if (!byte_extent(t, &lo, &hi))
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has strides %s for shape %s that reach "
                       "beyond 2^56 elements", c.op, name,
                       shape_str(t->ndim, t->strides ? t->strides : t->shape).c_str(),
                       shape_str(t->ndim, t->shape).c_str());
    // Elements are read in place with their natural alignment (a misaligned
    // fp32 load is undefined behaviour on the CPU and a fault on the GPU).
    const int es = dtype_size(*dt);
    if (((uintptr_t)t->data + t->byte_offset) % es != 0)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' starts at an address that is not a multiple "
                       "of its element size (%d bytes; byte_offset %llu); pass an aligned tensor (e.g. a copy)",
                       c.op, name, es, (unsigned long long)t->byte_offset);
  }
  return check_device(c, name, t);
}

bool same_view(const DLTensor* a, const DLTensor* b) {
  if ((const char*)a->data + a->byte_offset != (const char*)b->data + b->byte_offset) return false;
  if (a->ndim != b->ndim || a->dtype.bits != b->dtype.bits || a->dtype.code != b->dtype.code) return false;
  for (int i = 0; i < a->ndim; ++i)
    if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && stride_of(a, i) != stride_of(b, i))) return false;
  return true;
}

namespace {
// Where a tensor's bytes lie, for the overlap test: absent (NULL or empty: overlaps nothing),
// unbounded (strides beyond 2^56: taken to overlap everything on its device), or [lo, hi).
struct Span {
  const DLTensor* t;
  bool present, bounded;
  intptr_t lo, hi;
};
Span span_of(const DLTensor* t) {
  Span s{t, t && numel(t) > 0, false, 0, 0};
  int64_t lo, hi;
  if (s.present && byte_extent(t, &lo, &hi)) {
    const intptr_t base = (intptr_t)t->data + (intptr_t)t->byte_offset;
    s.bounded = true;
    s.lo = base + lo;
    s.hi = base + hi;
  }
  return s;
}
bool spans_overlap(const Span& a, const Span& b) {
  if (!a.present || !b.present) return false;
  if (raw_enum(a.t->device.device_type) != raw_enum(b.t->device.device_type) ||
      a.t->device.device_id != b.t->device.device_id)
    return false;
  if (!a.bounded || !b.bounded) return true;
  return a.lo < b.hi && b.lo < a.hi;
}
}  // namespace

bool overlap(const DLTensor* a, const DLTensor* b) { return spans_overlap(span_of(a), span_of(b)); }

qqStatus_t check_no_alias(Ctx& c, std::initializer_list<Arg> outs, std::initializer_list<Arg> ins) {
  // each tensor's extent once (a call checks up to ~10 pairs; byte_extent was most of a pair)
  constexpr size_t kInline = 16;
  const size_t no = outs.size(), n = no + ins.size();
  Span inline_spans[kInline];
  std::vector<Span> heap;
  Span* sp = n <= kInline ? inline_spans : (heap.resize(n), heap.data());
  const Arg* args[2] = {outs.begin(), ins.begin()};
  for (size_t k = 0; k < n; ++k) sp[k] = span_of(k < no ? args[0][k].t : args[1][k - no].t);
  for (size_t a = 0; a < no; ++a) {
    const char* oname = args[0][a].name;
    for (size_t b = no; b < n; ++b)
      if (spans_overlap(sp[a], sp[b]))
        return set_error(QQ_STATUS_INVALID_VALUE, "%s: output '%s' overlaps input '%s' in memory; pass a "
                         "separate output buffer", c.op, oname, args[1][b - no].name);
    for (size_t b = a + 1; b < no; ++b)
      if (spans_overlap(sp[a], sp[b]))
        return set_error(QQ_STATUS_INVALID_VALUE, "%s: outputs '%s' and '%s' overlap in memory; pass "
                         "separate buffers", c.op, oname, args[0][b].name);
  }
  return QQ_STATUS_SUCCESS;
}

qqStatus_t expect_float(Ctx& c, const char* name, const DLTensor* t, DType dt) {
  if (!is_float(dt))
    return set_error(QQ_STATUS_INVALID_DTYPE,
                     "%s: argument '%s' has dtype %s; expected float32, float16 or bfloat16", c.op, name,
                     dtype_str(t->dtype).c_str());
  return QQ_STATUS_SUCCESS;
}
qqStatus_t expect_bytes(Ctx& c, const char* name, const DLTensor* t, DType dt, const char* what) {
  if (dt != DType::U8)
    return set_error(QQ_STATUS_INVALID_DTYPE,
                     "%s: argument '%s' has dtype %s; expected uint8 (%s)", c.op, name,
                     dtype_str(t->dtype).c_str(), what);
  return QQ_STATUS_SUCCESS;
}

// A byte tensor in a framework's own float8 / float4 dtype (torch.float8_e4m3fn scales, ...)
// says what its bytes are; libqq reads them as uint8, so a type that contradicts the mode
// (UE8M0-typed scales for nvfp4, E4M3 data for mxfp8 with fp8_format e5m2, ...) would be a
// silent misreading. uint8 / int8 carry no claim and always pass.
qqStatus_t check_byte_kind(Ctx& c, const char* name, const DLTensor* t, const QSpec& q, ByteRole role) {
  const DLDataType d = t->dtype;
  const bool fp4 = d.code == kDLFloat4_e2m1fn && d.bits == 4 && d.lanes == 2;
  const bool fp8 = d.lanes == 1 && d.bits == 8 && d.code >= kDLFloat8_e3m4 && d.code <= kDLFloat8_e8m0fnu;
  if (!fp4 && !fp8) return QQ_STATUS_SUCCESS;
  int want = -1;   // the one typed DLPack code that fits, or -1: none does (affine)
  if (role == ByteRole::SCALES) {
    if (q.mode == QQ_MODE_NVFP4) want = kDLFloat8_e4m3fn;
    else if (q.mode == QQ_MODE_MXFP4 || q.mode == QQ_MODE_MXFP8) want = kDLFloat8_e8m0fnu;
  } else if (q.mode == QQ_MODE_NVFP4 || q.mode == QQ_MODE_MXFP4) {
    want = kDLFloat4_e2m1fn;
  } else if (q.mode == QQ_MODE_MXFP8) {
    want = q.elem == ELEM_E5M2 ? kDLFloat8_e5m2 : kDLFloat8_e4m3fn;
  }
  if ((int)d.code == want) return QQ_STATUS_SUCCESS;
  auto typed_name = [](int code) {
    switch (code) {
      case kDLFloat4_e2m1fn: return "float4_e2m1fn_x2";
      case kDLFloat8_e4m3fn: return "float8_e4m3fn";
      case kDLFloat8_e5m2: return "float8_e5m2";
      case kDLFloat8_e8m0fnu: return "float8_e8m0fnu";
      default: return "a float8 dtype";
    }
  };
  const char* have = typed_name(d.code);
  const char* what = role == ByteRole::SCALES ? "scales" : "data";
  if (want < 0)
    return set_error(QQ_STATUS_INVALID_DTYPE, "%s: argument '%s' has dtype %s, but %s %s are not %s values; pass "
                     "uint8", c.op, name, have, mode_name(q.mode), what, have);
  const char* fmt = q.mode == QQ_MODE_MXFP8 && role == ByteRole::DATA ? (q.elem == ELEM_E5M2 ? " (e5m2)" : " (e4m3)")
                                                                      : "";
  return set_error(QQ_STATUS_INVALID_DTYPE, "%s: argument '%s' has dtype %s, but %s%s %s are %s; pass %s or uint8 "
                   "(or the mode / fp8_format that wrote them)", c.op, name, have, mode_name(q.mode), fmt, what,
                   typed_name(want), typed_name(want));
}

qqStatus_t to_mat(Ctx& c, const char* name, const DLTensor* t, DType dt, Mat* m) {
  Mat r;
  r.dt = dt;
  r.device = c.device;
  r.ptr = (char*)t->data + t->byte_offset;
  const int nd = t->ndim;
  if (numel(t) == 0) {
    // Empty: strides are meaningless (NumPy gives zeros); nothing is read.
    r.rows = nd >= 2 ? t->shape[nd - 2] : (nd == 1 ? 1 : 1);
    r.cols = nd >= 1 ? t->shape[nd - 1] : 1;
    r.ld = r.cols;
    r.nb = nd >= 2 ? nd - 2 : 0;
    int64_t st = r.rows * r.cols;
    for (int i = r.nb - 1; i >= 0; --i) {
      r.bshape[i] = t->shape[i];
      r.bstride[i] = st;
      st *= t->shape[i];
    }
  } else if (nd == 0) {
    r.rows = r.cols = 1;
    r.ld = 1;
  } else {
    r.cols = t->shape[nd - 1];
    r.rows = nd >= 2 ? t->shape[nd - 2] : 1;
    if (r.cols > 1 && stride_of(t, nd - 1) != 1)
      return set_error(QQ_STATUS_INVALID_VALUE,
                       "%s: argument '%s' has stride %lld on its last axis; libqq needs stride 1 there "
                       "(pass a contiguous tensor, e.g. .contiguous() / np.ascontiguousarray)",
                       c.op, name, (long long)stride_of(t, nd - 1));
    r.ld = nd >= 2 ? stride_of(t, nd - 2) : r.cols;
    if (nd >= 2 && r.rows > 1 && r.ld < 0)
      return set_error(QQ_STATUS_INVALID_VALUE,
                       "%s: argument '%s' has a negative row stride %lld (its rows in reverse order, e.g. "
                       "x[::-1]); libqq reads rows in increasing memory order: pass a copy "
                       "(np.ascontiguousarray / .contiguous())", c.op, name, (long long)r.ld);
    if (nd >= 2 && r.rows > 1 && r.ld < r.cols)
      return set_error(QQ_STATUS_INVALID_VALUE,
                       "%s: argument '%s' has row stride %lld smaller than its row length %lld (a transposed "
                       "or overlapping view); pass a contiguous tensor", c.op, name, (long long)r.ld,
                       (long long)r.cols);
    if (r.rows <= 1) r.ld = r.cols;
    r.nb = nd >= 2 ? nd - 2 : 0;
    for (int i = 0; i < r.nb; ++i) {
      r.bshape[i] = t->shape[i];
      r.bstride[i] = t->shape[i] == 1 ? 0 : stride_of(t, i);
    }
  }
  *m = r;
  return QQ_STATUS_SUCCESS;
}

qqStatus_t expect_shape(Ctx& c, const char* name, const DLTensor* t, int ndim, const int64_t* shape,
                        const char* why) {
  bool ok = t->ndim == ndim;
  for (int i = 0; ok && i < ndim; ++i) ok = t->shape[i] == shape[i];
  if (!ok)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has shape %s; expected %s (%s)", c.op, name,
                     shape_str(t->ndim, t->shape).c_str(), shape_str(ndim, shape).c_str(), why);
  return QQ_STATUS_SUCCESS;
}

qqStatus_t expect_compact(Ctx& c, const char* name, const DLTensor* t) {
  if (!t->strides || numel(t) == 0) return QQ_STATUS_SUCCESS;  // empty: strides mean nothing (NumPy gives 0s)
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != s)
      return set_error(QQ_STATUS_INVALID_VALUE,
                       "%s: argument '%s' must be compact row-major (C-contiguous); its strides are %s for "
                       "shape %s", c.op, name, shape_str(t->ndim, t->strides).c_str(),
                       shape_str(t->ndim, t->shape).c_str());
    s *= t->shape[i];
  }
  return QQ_STATUS_SUCCESS;
}

qqStatus_t check_output(Ctx& c, const char* name, const DLTensor* t, bool need_float, DType* dt) {
  // A wrong output buffer is a value error of the call (INVALID_VALUE), not
  // a dtype the operation cannot take: docs/api.md.
  qqStatus_t st = check_tensor(c, name, t, dt);
  if (st == QQ_STATUS_INVALID_DTYPE) return QQ_STATUS_INVALID_VALUE;
  if (st) return st;
  if (need_float && expect_float(c, name, t, *dt)) return QQ_STATUS_INVALID_VALUE;
  return QQ_STATUS_SUCCESS;
}

qqStatus_t output_mat(Ctx& c, const char* name, const DLTensor* t, int ndim, const int64_t* shape,
                      int want, const char* why, Mat* m) {
  DType dt;
  QQ_TRY(check_output(c, name, t, want < 0, &dt));
  if (want >= 0 && (int)dt != want) {
    static const char* names[] = {"float32", "float16", "bfloat16", "uint8", "int32"};
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has dtype %s; expected %s (%s)", c.op, name,
                     dtype_str(t->dtype).c_str(), names[want], why);
  }
  QQ_TRY(expect_shape(c, name, t, ndim, shape, why));
  QQ_TRY(expect_compact(c, name, t));
  return to_mat(c, name, t, dt, m);
}

qqStatus_t resolve_params(Ctx& c, const qqQuantParams_t* p, QSpec* q) {
  if (!p) return set_error(QQ_STATUS_INVALID_VALUE, "%s: params is NULL; initialize it with qqQuantParamsInit",
                           c.op);
  if (p->struct_size < sizeof(qqQuantParams_t))
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: params.struct_size is %zu, expected %zu; initialize params with qqQuantParamsInit",
                     c.op, p->struct_size, sizeof(qqQuantParams_t));
  const int mode = raw_enum(p->mode), rounding = raw_enum(p->rounding), layout = raw_enum(p->scale_layout),
            fp8 = raw_enum(p->fp8_format);
  QSpec s{};
  switch (mode) {
    case QQ_MODE_AFFINE: s.group = 64; s.bits = 4; break;
    case QQ_MODE_NVFP4: s.group = 16; s.bits = 4; s.elem = ELEM_E2M1; break;
    case QQ_MODE_MXFP4: s.group = 32; s.bits = 4; s.elem = ELEM_E2M1; break;
    case QQ_MODE_MXFP8: s.group = 32; s.bits = 8; s.elem = ELEM_E4M3; break;
    default:
      return set_error(QQ_STATUS_INVALID_VALUE,
                       "%s: unknown mode %d; expected affine, nvfp4, mxfp4 or mxfp8", c.op, mode);
  }
  s.mode = (qqMode_t)mode;
  const char* mn = mode_name(s.mode);
  if (p->group_size != 0) {
    bool ok = s.mode == QQ_MODE_AFFINE
                  ? (p->group_size == 32 || p->group_size == 64 || p->group_size == 128)
                  : p->group_size == s.group;
    if (!ok)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: group_size=%d is not supported for %s; expected %s", c.op,
                       p->group_size, mn, s.mode == QQ_MODE_AFFINE ? "32, 64 or 128" :
                       (s.group == 16 ? "16" : "32"));
    s.group = p->group_size;
  }
  if (p->bits != 0) {
    const int b = p->bits;
    bool ok = s.mode == QQ_MODE_AFFINE ? (b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8)
                                        : b == s.bits;
    if (!ok)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: bits=%d is not supported for %s; expected %s", c.op, b, mn,
                       s.mode == QQ_MODE_AFFINE ? "2, 3, 4, 5, 6 or 8" : (s.bits == 4 ? "4" : "8"));
    s.bits = b;
  }
  if (rounding != QQ_ROUNDING_CEIL && rounding != QQ_ROUNDING_FLOOR)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: unknown rounding %d; expected ceil or floor", c.op,
                     rounding);
  if (rounding == QQ_ROUNDING_FLOOR && s.mode != QQ_MODE_MXFP4 && s.mode != QQ_MODE_MXFP8)
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: rounding='floor' applies to the UE8M0 scales of mxfp4/mxfp8 only, not %s; use the "
                     "default rounding", c.op, mn);
  s.floor_rounding = rounding == QQ_ROUNDING_FLOOR;
  if (layout != QQ_SCALE_LINEAR && layout != QQ_SCALE_BLOCKED)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: unknown scale_layout %d; expected linear or blocked", c.op,
                     layout);
  if (layout == QQ_SCALE_BLOCKED && s.mode == QQ_MODE_AFFINE)
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: scale_layout='blocked' is for the fp modes (nvfp4, mxfp4, mxfp8); affine scales are "
                     "always linear", c.op);
  s.blocked = layout == QQ_SCALE_BLOCKED;
  if (fp8 != QQ_FP8_E4M3 && fp8 != QQ_FP8_E5M2)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: unknown fp8_format %d; expected e4m3 or e5m2", c.op,
                     fp8);
  if (fp8 == QQ_FP8_E5M2) {
    if (s.mode != QQ_MODE_MXFP8)
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: fp8_format='e5m2' applies to mxfp8 only, not %s", c.op, mn);
    s.elem = ELEM_E5M2;
  }
  *q = s;
  return QQ_STATUS_SUCCESS;
}

void quantized_shapes(const QSpec& q, int nd, const int64_t* x, int64_t* data, int64_t* sc, int* snd) {
  const int64_t k = nd ? x[nd - 1] : 1;
  for (int i = 0; i < nd; ++i) data[i] = x[i];
  if (nd) data[nd - 1] = q.packed_cols(k);
  const int64_t g = k / q.group;
  if (!q.blocked) {
    for (int i = 0; i < nd; ++i) sc[i] = x[i];
    if (nd) sc[nd - 1] = g;
    *snd = nd;
  } else {
    const int64_t m = nd >= 2 ? x[nd - 2] : 1;
    int o = 0;
    for (int i = 0; i + 2 < nd; ++i) sc[o++] = x[i];
    sc[o++] = roundup(m, 128);
    sc[o++] = roundup(g, 4);
    *snd = o;
  }
}

qqStatus_t check_k(Ctx& c, const char* name, const char* axis, int64_t k, const QSpec& q) {
  if (k <= 0 || k % q.group != 0)
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: argument '%s': %s=%lld is not a positive multiple of group_size %d for %s; pad %s or "
                     "choose another group_size", c.op, name, axis, (long long)k, q.group, mode_name(q.mode), axis);
  return QQ_STATUS_SUCCESS;
}

qqStatus_t global_scale_ptr(Ctx& c, const char* name, const DLTensor* t, const QSpec& q, const float** out) {
  *out = nullptr;
  if (!t) return QQ_STATUS_SUCCESS;
  if (q.mode != QQ_MODE_NVFP4)
    return set_error(QQ_STATUS_INVALID_VALUE,
                     "%s: argument '%s' is given but mode is %s; a global scale exists only for nvfp4 (drop "
                     "it or use mode='nvfp4')", c.op, name, mode_name(q.mode));
  DType dt;
  QQ_TRY(check_tensor(c, name, t, &dt));
  if (dt != DType::F32)
    return set_error(QQ_STATUS_INVALID_DTYPE, "%s: argument '%s' has dtype %s; expected float32", c.op, name,
                     dtype_str(t->dtype).c_str());
  if (numel(t) != 1 || t->ndim > 1)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' has shape %s; expected one element, shape () "
                     "or (1,)", c.op, name, shape_str(t->ndim, t->shape).c_str());
  *out = (const float*)((const char*)t->data + t->byte_offset);
  // A host-resident global scale is checked here (it costs nothing). One on
  // the GPU cannot be read without a synchronization: there the codec treats
  // every value outside the valid range as "no global scale" (nvfp4_gs in
  // codec.h), as it does for 0, the amax of an all-zero tensor.
  if (c.device < 0) return check_host_global_scale(c, name, **out, -1);
  return QQ_STATUS_SUCCESS;
}

qqStatus_t check_host_global_scale(Ctx& c, const char* name, float g, int64_t entry) {
  if (g == 0.0f || nvfp4_gs_valid(g)) return QQ_STATUS_SUCCESS;
  const std::string where = entry < 0 ? "" : " (entry " + std::to_string(entry) + ")";
  return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' is %g%s; a global scale must be a positive finite "
                   "number of at least %g (the tensor's amax, e.g. qq.amax(x)), or 0 / None for none", c.op, name,
                   (double)g, where.c_str(), (double)kNvfp4MinGlobalScale);
}

qqStatus_t input_scales(Ctx& c, const char* name, const DLTensor* t, const QSpec& q, int fnd,
                        const int64_t* fshape, DType float_dt, bool is_bias, Mat* m) {
  if (!t)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument '%s' is required for mode %s", c.op, name,
                     mode_name(q.mode));
  DType dt;
  QQ_TRY(check_tensor(c, name, t, &dt));
  if (q.fp()) {
    QQ_TRY(expect_bytes(c, name, t, dt, q.mode == QQ_MODE_NVFP4 ? "E4M3 scale bytes" : "UE8M0 scale bytes"));
    QQ_TRY(check_byte_kind(c, name, t, q, ByteRole::SCALES));
  } else {
    QQ_TRY(expect_float(c, name, t, dt));
    if (float_dt != DType::U8 && dt != float_dt && is_bias)
      return set_error(QQ_STATUS_INVALID_DTYPE, "%s: argument '%s' must have the dtype of the scales", c.op,
                       name);
  }
  int64_t dshape[kMaxDims], sshape[kMaxDims + 1];
  int snd = 0;
  QSpec lin = q;
  if (is_bias) lin.blocked = 0;
  quantized_shapes(lin, fnd, fshape, dshape, sshape, &snd);
  QQ_TRY(expect_shape(c, name, t, snd, sshape,
                      lin.blocked ? "blocked layout: [batch..., roundup(rows,128), roundup(K/group,4)]"
                                  : "one scale per group along the last axis"));
  if (lin.blocked) QQ_TRY(expect_compact(c, name, t));
  return to_mat(c, name, t, dt, m);
}

qqStatus_t input_biases(Ctx& c, const DLTensor* t, const QSpec& q, int fnd, const int64_t* fshape,
                        DType scales_dt, Mat* m) {
  if (q.mode == QQ_MODE_AFFINE) return input_scales(c, "biases", t, q, fnd, fshape, scales_dt, true, m);
  if (t)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'biases' must be None for mode %s", c.op,
                     mode_name(q.mode));
  return QQ_STATUS_SUCCESS;
}

qqStatus_t broadcast_batch(Ctx& c, Mat* x, Mat* w, int* nb, int64_t* bshape, const char* wname) {
  const int n = x->nb > w->nb ? x->nb : w->nb;
  for (int i = 0; i < n; ++i) {
    const int ix = i - (n - x->nb), iw = i - (n - w->nb);
    const int64_t dx = ix >= 0 ? x->bshape[ix] : 1, dw = iw >= 0 ? w->bshape[iw] : 1;
    if (dx != dw && dx != 1 && dw != 1)
      return set_error(QQ_STATUS_INVALID_VALUE,
                       "%s: batch dimension %d of 'x' (%lld) and '%s' (%lld) do not broadcast", c.op, i,
                       (long long)dx, wname, (long long)dw);
    bshape[i] = dx == 1 ? dw : dx;  // NumPy: 1 broadcasts to the other extent, 0 included
  }
  *nb = n;
  return QQ_STATUS_SUCCESS;
}

void align_batch(Mat* m, int nb, const int64_t* bshape) {
  int64_t st[kMaxDims] = {0};
  for (int i = 0; i < nb; ++i) {
    const int im = i - (nb - m->nb);
    st[i] = (im >= 0 && m->bshape[im] != 1) ? m->bstride[im] : 0;
  }
  m->nb = nb;
  for (int i = 0; i < nb; ++i) {
    m->bshape[i] = bshape[i];
    m->bstride[i] = st[i];
  }
}

qqStatus_t check_group_ends(const char* op, const int32_t* ends, int64_t E, int64_t T) {
  if (E == 0 && T > 0)  // no group: the T tokens would belong to no expert (and out stay unwritten)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'offsets' is empty but x has T = %lld tokens; every "
                     "token belongs to one expert: give E group ends, the last = T", op, (long long)T);
  for (int64_t e = 0; e < E; ++e)
    if (group_end_bad(ends, e, E, T)) {
      if (e == E - 1 && ends[e] >= (e ? ends[e - 1] : 0) && ends[e] <= T)
        return set_error(QQ_STATUS_INVALID_VALUE, "%s: the last entry of 'offsets' (%d) must equal T = %lld (every "
                         "token belongs to one expert)", op, (int)ends[e], (long long)T);
      return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'offsets' must be non-decreasing group ends within "
                       "[0, T=%lld]; offsets[%lld] = %d after %d", op, (long long)T, (long long)e, (int)ends[e],
                       (int)(e ? ends[e - 1] : 0));
    }
  return QQ_STATUS_SUCCESS;
}

void blocked_batch_strides(Mat* s) {
  int64_t st = s->rows * s->cols;
  for (int i = s->nb - 1; i >= 0; --i) {
    s->bstride[i] = s->bshape[i] == 1 ? 0 : st;
    st *= s->bshape[i];
  }
}

qqStatus_t bias_mat(Ctx& c, const DLTensor* bias, int64_t n, Mat* m) {
  m->ptr = nullptr;
  if (!bias) return QQ_STATUS_SUCCESS;
  DType dt;
  QQ_TRY(check_tensor(c, "bias", bias, &dt));
  QQ_TRY(expect_float(c, "bias", bias, dt));
  if (numel(bias) != n || bias->ndim < 1 || bias->shape[bias->ndim - 1] != n)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: argument 'bias' has shape %s; expected (%lld,)", c.op,
                     shape_str(bias->ndim, bias->shape).c_str(), (long long)n);
  return to_mat(c, "bias", bias, dt, m);
}

qqStatus_t read_qqmm_params(Ctx& c, const qqQqmmParams_t* params, qqQqmmParams_t* p) {
  constexpr size_t kOldest = offsetof(qqQqmmParams_t, c);  // the 0.1.0 layout before beta * C
  if (!params || params->struct_size < kOldest)
    return set_error(QQ_STATUS_INVALID_VALUE, "%s: params is NULL or uninitialized; use qqQqmmParamsInit", c.op);
  memset(p, 0, sizeof *p);
  memcpy(p, params, params->struct_size < sizeof *p ? params->struct_size : sizeof *p);
  p->struct_size = sizeof *p;
  return QQ_STATUS_SUCCESS;
}


}  // namespace qq
