// validate.h - the one validation layer, shared by the entry points
// (api_core.cpp, api_quantize.cpp, api_layout.cpp, api_matmul.cpp).
//
// Every check of a C argument lives in validate.cpp: the entry points call
// these and never read a DLTensor field the checks have not vouched for.
// Messages name the operation (Ctx::op) and the argument, say what was
// expected and what was given, and where possible the fix (docs/errors.md).
#ifndef QQ_VALIDATE_H_
#define QQ_VALIDATE_H_

#include <string.h>

#include <exception>
#include <initializer_list>
#include <new>
#include <string>

#include "internal.h"

namespace qq {

// ---- the thread's last error (set_error is declared in internal.h) -------
// The storage is one thread_local string in validate.cpp; these are its only
// other readers and writers.
const std::string& last_error();

// No C++ exception may cross the C ABI: every entry point runs its body
// through guard(), which turns std::bad_alloc (a host allocation of the CPU
// backend, a plan-cache insert) into QQ_STATUS_ALLOC_FAILED and anything else
// into QQ_STATUS_INTERNAL_ERROR, with the message set.
qqStatus_t fail_noexcept(qqStatus_t st, const char* op, const char* what) noexcept;

template <class F>
qqStatus_t guard(const char* op, F&& body) noexcept {
  try {
    clear_error();
    return body();
  } catch (const std::bad_alloc&) {
    return fail_noexcept(QQ_STATUS_ALLOC_FAILED, op, "out of host memory (std::bad_alloc); the problem is "
                         "too large for this machine");
  } catch (const std::exception& e) {
    return fail_noexcept(QQ_STATUS_INTERNAL_ERROR, op, e.what());
  } catch (...) {
    return fail_noexcept(QQ_STATUS_INTERNAL_ERROR, op, "unknown C++ exception (a bug in libqq: please report it)");
  }
}

// ---- names for messages -----------------------------------------------------
const char* mode_name(qqMode_t m);
std::string shape_str(int ndim, const int64_t* shape);
std::string dtype_str(DLDataType t);

// The operation being validated, for messages.
struct Ctx {
  const char* op;
  int device = -2;  // -2 = not yet known; -1 = CPU; >= 0 CUDA id
  const char* device_arg = nullptr;
};

// Enum fields of caller-owned structs are read as plain ints: loading an
// out-of-range value through the enum type is undefined behaviour in C++
// (UBSan's -fsanitize=enum), and a hostile caller can store any int there.
template <class E>
int raw_enum(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "enums of qq.h are int-sized");
  int v;
  memcpy(&v, &e, sizeof v);
  return v;
}

// ---- tensors ----------------------------------------------------------------
int64_t numel(const DLTensor* t);  // only after check_tensor: cannot overflow
// The product of `n` extents, or -1 if it exceeds 2^56 (see validate.cpp).
int64_t bounded_product(int n, const int64_t* shape);
int64_t stride_of(const DLTensor* t, int i);

// Enough of a tensor to read its shape: not NULL, a dimension count in
// range, a shape pointer. (check_tensor does the rest where it is used.)
qqStatus_t check_header(Ctx& c, const char* name, const DLTensor* t);
// Basic checks common to every tensor argument; *dt gets its DType, and the
// first tensor checked fixes the call's device (c.device).
qqStatus_t check_tensor(Ctx& c, const char* name, const DLTensor* t, DType* dt);

// Outputs must not share memory with inputs or with each other: the kernels
// read and write in an order that would corrupt either (swizzle in place
// zeroes its input). Exact in-place is allowed only where an operation says
// so (qqmm's out = C); see docs/errors.md.
struct Arg {
  const char* name;
  const DLTensor* t;
};
bool same_view(const DLTensor* a, const DLTensor* b);
bool overlap(const DLTensor* a, const DLTensor* b);
qqStatus_t check_no_alias(Ctx& c, std::initializer_list<Arg> outs, std::initializer_list<Arg> ins);

qqStatus_t expect_float(Ctx& c, const char* name, const DLTensor* t, DType dt);
qqStatus_t expect_bytes(Ctx& c, const char* name, const DLTensor* t, DType dt, const char* what);
// Packed data / fp scales given in a framework's typed byte dtype (float8_*, float4_e2m1fn_x2)
// must be the type the mode stores there; uint8 / int8 always pass (validate.cpp).
enum class ByteRole { DATA, SCALES };
qqStatus_t check_byte_kind(Ctx& c, const char* name, const DLTensor* t, const QSpec& q, ByteRole role);
qqStatus_t expect_shape(Ctx& c, const char* name, const DLTensor* t, int ndim, const int64_t* shape,
                        const char* why);
// Outputs (and blocked scales) must be compact row-major.
qqStatus_t expect_compact(Ctx& c, const char* name, const DLTensor* t);

// View a tensor as a batched matrix [batch..., rows, cols] (a 1D tensor is
// one row, a 0D tensor one element). The last axis needs stride 1; rows may
// have any stride; batch axes any strides.
qqStatus_t to_mat(Ctx& c, const char* name, const DLTensor* t, DType dt, Mat* m);
// check_tensor of an output (a float one where need_float), a wrong dtype
// reported as INVALID_VALUE: a wrong out= buffer is a value error of the call
// (docs/api.md), not a dtype the operation cannot take.
qqStatus_t check_output(Ctx& c, const char* name, const DLTensor* t, bool need_float, DType* dt);
// A compact output of exactly `shape` and dtype `want` (or any float if want
// is -1), returned as a Mat.
qqStatus_t output_mat(Ctx& c, const char* name, const DLTensor* t, int ndim, const int64_t* shape,
                      int want, const char* why, Mat* m);

// ---- quantization parameters and the tensors they imply --------------------
qqStatus_t resolve_params(Ctx& c, const qqQuantParams_t* p, QSpec* q);
// Shapes of quantize's outputs (see qqQuantizedShapes).
void quantized_shapes(const QSpec& q, int nd, const int64_t* x, int64_t* data, int64_t* sc, int* snd);
// `axis` names the quantized axis in the message: K for a row-wise
// quantization, M for quantize_colwise, N for quantized_matmul's transpose=False.
qqStatus_t check_k(Ctx& c, const char* name, const char* axis, int64_t k, const QSpec& q);
// Global scale: float32, one element, same device; nvfp4 only.
qqStatus_t global_scale_ptr(Ctx& c, const char* name, const DLTensor* t, const QSpec& q, const float** out);
// A global scale read from host memory: 0 (none) or within nvfp4's range, else
// INVALID_VALUE naming it (and its entry, where entry >= 0, of a per-expert array).
qqStatus_t check_host_global_scale(Ctx& c, const char* name, float g, int64_t entry);
// Scales (and affine biases) given as input, checked against the logical
// float shape `fshape` of the operand they describe (ndim fnd).
qqStatus_t input_scales(Ctx& c, const char* name, const DLTensor* t, const QSpec& q, int fnd,
                        const int64_t* fshape, DType float_dt, bool is_bias, Mat* m);
// The 'biases' input of packed affine data (dequantize, quantized_matmul):
// required for affine, with the dtype of the scales; must be absent for the
// fp modes. *m is left as it is when there are none.
qqStatus_t input_biases(Ctx& c, const DLTensor* t, const QSpec& q, int fnd, const int64_t* fshape,
                        DType scales_dt, Mat* m);

// Host-side group ends of the MoE operations (int32 [E], cumulative; the rule is
// group_end_bad in group_ends.h): INVALID_VALUE naming `op`, the first bad
// entry and what is expected.
qqStatus_t check_group_ends(const char* op, const int32_t* ends, int64_t E, int64_t T);

// ---- matmul operands ----------------------------------------------------------
// Broadcast batch shapes of x and w (NumPy rules) into out's batch shape;
// align_batch then rewrites each operand's Mat to index with out's batch
// index (stride 0 on broadcast dims).
qqStatus_t broadcast_batch(Ctx& c, Mat* x, Mat* w, int* nb, int64_t* bshape, const char* wname = "w");
void align_batch(Mat* m, int nb, const int64_t* bshape);
// Blocked scales are one compact matrix per batch entry of the operand.
void blocked_batch_strides(Mat* s);
qqStatus_t bias_mat(Ctx& c, const DLTensor* bias, int64_t n, Mat* m);
// qqQqmmParams_t grows at its end (struct_size says how much the caller
// knows): a caller built against an older qq.h passes a shorter struct, and
// the fields it lacks take their defaults (all zero: no C, beta 0).
qqStatus_t read_qqmm_params(Ctx& c, const qqQqmmParams_t* params, qqQqmmParams_t* p);

}  // namespace qq

#endif  // QQ_VALIDATE_H_
