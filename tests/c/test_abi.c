/* test_abi.c - libqq's C ABI against hostile input (plain C99 + POSIX fork).
 *
 * Every check states what the library MUST do with an argument a C caller
 * can legally build: NULL shapes, empty batches, sizes whose products
 * overflow int64, out-of-range enum values, bogus devices, misaligned data,
 * NULL / short parameter structs. Each check runs in a child process (fork),
 * so a crash (segfault, abort, an uncaught C++ exception, a sanitizer
 * report) is one failing line and the remaining checks still run.
 *
 * Output: one line per check ("ok   name: ..." / "FAIL name: ..."), then
 * "N passed, N failed". Exit status 0 iff every check passed.
 * Set QQ_TEST_NOFORK=1 to run the checks in-process (for a debugger), and
 * QQ_TEST_ONLY=<substring> to run only the checks whose name contains it.
 *
 * Fake data pointers (FAKE) are never valid memory: the library must refuse
 * those calls before it reads anything. */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <qq/qq.h>

#define FAKE ((void*)(uintptr_t)0x1000) /* non-NULL, never mapped, never to be read */
#define P2(n) ((int64_t)1 << (n))
#define CHILD_FAIL 10 /* a child's exit status when its check failed (and it printed why) */

static const DLDataType F32 = {kDLFloat, 32, 1}, BF16 = {kDLBfloat, 16, 1}, U8 = {kDLUInt, 8, 1},
                        I32 = {kDLInt, 32, 1};

static DLTensor tens(void* data, DLDataType dt, int ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

/* ---- result reporting -------------------------------------------------- */
static char g_detail[2048];

static int fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_detail, sizeof g_detail, fmt, ap);
  va_end(ap);
  return 0;
}
static int pass(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_detail, sizeof g_detail, fmt, ap);
  va_end(ap);
  return 1;
}

#define ST(s) (1u << (s))
static const char* stname(qqStatus_t s) { return qqGetStatusString(s); }

/* The status must be one of `allowed` (a mask of ST(...)); if `needle` is
 * not NULL the last error message must contain it. */
static int expect(qqStatus_t st, unsigned allowed, const char* needle) {
  const char* msg = qqGetLastErrorMessage();
  if (!msg) return fail("qqGetLastErrorMessage() returned NULL");
  if ((unsigned)st >= 32 || !(allowed & ST(st)))
    return fail("got %s (message \"%s\")", stname(st), msg);
  if (st != QQ_STATUS_SUCCESS && msg[0] == '\0') return fail("got %s with an empty message", stname(st));
  if (needle && !strstr(msg, needle))
    return fail("got %s but the message does not contain \"%s\": \"%s\"", stname(st), needle, msg);
  return pass("%s: \"%s\"", stname(st), msg);
}

/* ---- a small valid quantize (nvfp4, x [1, 16] float32) ------------------ */
static const float kRow[16] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.5f};

/* ======================================================================== */
/* qqQqmm with NULL shapes in the batched-w path                            */
/* ======================================================================== */
static float xbuf[4 * 64], wbuf[2 * 8 * 64], obuf[2 * 4 * 8], cbuf[2 * 4 * 8];

static int qqmm_call(DLTensor* x, DLTensor* w, DLTensor* out, const DLTensor* c, qqStatus_t* st) {
  qqQqmmParams_t p;
  if (qqQqmmParamsInit(&p, QQ_MODE_MXFP8) != QQ_STATUS_SUCCESS) return fail("qqQqmmParamsInit failed");
  if (c) {
    p.c = c;
    p.beta = 1.0f;
  }
  *st = qqQqmm(NULL, x, NULL, w, NULL, &p, NULL, NULL, NULL, out, NULL);
  return 1;
}

static int t_qqmm_w3d_null_shape(void) {
  int64_t xs[2] = {4, 64}, os[3] = {2, 4, 8};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 3, NULL), out = tens(obuf, F32, 3, os);
  qqStatus_t st = QQ_STATUS_INTERNAL_ERROR;
  if (!qqmm_call(&x, &w, &out, NULL, &st)) return 0;
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "'w'");
}

static int t_qqmm_w3d_x_null_shape(void) {
  int64_t ws[3] = {2, 8, 64}, os[3] = {2, 4, 8};
  DLTensor x = tens(xbuf, F32, 3, NULL), w = tens(wbuf, F32, 3, ws), out = tens(obuf, F32, 3, os);
  qqStatus_t st = QQ_STATUS_INTERNAL_ERROR;
  if (!qqmm_call(&x, &w, &out, NULL, &st)) return 0;
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "'x'");
}

static int t_qqmm_w3d_out_null_shape(void) {
  int64_t xs[2] = {4, 64}, ws[3] = {2, 8, 64};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 3, ws), out = tens(obuf, F32, 3, NULL);
  qqStatus_t st = QQ_STATUS_INTERNAL_ERROR;
  if (!qqmm_call(&x, &w, &out, NULL, &st)) return 0;
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "'out'");
}

static int t_qqmm_w3d_c_null_shape(void) {
  int64_t xs[2] = {4, 64}, ws[3] = {2, 8, 64}, os[3] = {2, 4, 8};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 3, ws), out = tens(obuf, F32, 3, os);
  DLTensor c = tens(cbuf, F32, 3, NULL);
  qqStatus_t st = QQ_STATUS_INTERNAL_ERROR;
  if (!qqmm_call(&x, &w, &out, &c, &st)) return 0;
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "'c'");
}

static int t_qqmm_w3d_scales_null_shape(void) {
  /* packed mxfp8 w [2, 8, 64] with its scales [2, 8, 2] given as 3-D with a NULL shape */
  static uint8_t wq[2 * 8 * 64], ws_bytes[2 * 8 * 2];
  int64_t xs[2] = {4, 64}, ws[3] = {2, 8, 64}, os[3] = {2, 4, 8};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wq, U8, 3, ws), out = tens(obuf, F32, 3, os);
  DLTensor wsc = tens(ws_bytes, U8, 3, NULL);
  qqQqmmParams_t p;
  qqQqmmParamsInit(&p, QQ_MODE_MXFP8);
  qqStatus_t st = qqQqmm(NULL, &x, NULL, &w, &wsc, &p, NULL, NULL, NULL, &out, NULL);
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "scales");
}

static int t_qqmm_2d_c_null_shape(void) {
  int64_t xs[2] = {4, 64}, ws[2] = {8, 64}, os[2] = {4, 8};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 2, ws), out = tens(obuf, F32, 2, os);
  DLTensor c = tens(cbuf, F32, 2, NULL);
  qqStatus_t st = QQ_STATUS_INTERNAL_ERROR;
  if (!qqmm_call(&x, &w, &out, &c, &st)) return 0;
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "'c'");
}

/* ======================================================================== */
/* qqQqmm with an empty batch: the entries' arguments are never looked at   */
/* ======================================================================== */
static int t_qqmm_batch0_int32_w(void) {
  static int32_t wi[1];
  int64_t xs[2] = {4, 64}, ws[3] = {0, 8, 32}, os[3] = {0, 4, 8};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wi, I32, 3, ws), out = tens(obuf, F32, 3, os);
  qqStatus_t st = QQ_STATUS_INTERNAL_ERROR;
  if (!qqmm_call(&x, &w, &out, NULL, &st)) return 0;
  return expect(st, ST(QQ_STATUS_INVALID_DTYPE) | ST(QQ_STATUS_INVALID_VALUE), "'w'");
}

/* ======================================================================== */
/* sizes: allocation failure and int64 overflow                             */
/* ======================================================================== */
static int t_qqmm_huge_k(void) {
  /* K = 2^40: the fp32 working copies of x and w (tens of TB) cannot be
   * allocated; std::bad_alloc must not cross extern "C". */
  int64_t xs[2] = {1, P2(40)}, ws[2] = {8, P2(40)}, os[2] = {1, 8};
  float o[8];
  DLTensor x = tens(FAKE, F32, 2, xs), w = tens(FAKE, F32, 2, ws), out = tens(o, F32, 2, os);
  qqStatus_t st = QQ_STATUS_INTERNAL_ERROR;
  if (!qqmm_call(&x, &w, &out, NULL, &st)) return 0;
  return expect(st, ST(QQ_STATUS_ALLOC_FAILED) | ST(QQ_STATUS_INVALID_VALUE), NULL);
}

static int shapes_check(qqMode_t mode, int64_t k) {
  qqQuantParams_t p;
  qqQuantParamsInit(&p, mode);
  int64_t xs[2] = {4, k}, ds[2] = {-7, -7}, ss[3] = {-7, -7, -7};
  int snd = -7;
  qqStatus_t st = qqQuantizedShapes(&p, 2, xs, ds, ss, &snd);
  if (st == QQ_STATUS_SUCCESS)
    return fail("got QQ_STATUS_SUCCESS with data shape (%lld, %lld), scales shape (%lld, %lld)%s",
                (long long)ds[0], (long long)ds[1], (long long)ss[0], (long long)ss[1],
                (ds[1] < 0 || ss[1] < 0) ? " (wrapped: negative)" : "");
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), NULL);
}
static int t_shapes_k_2p60_nvfp4(void) { return shapes_check(QQ_MODE_NVFP4, P2(60)); }
static int t_shapes_k_2p60_mxfp8(void) { return shapes_check(QQ_MODE_MXFP8, P2(60)); }

static int t_quantize_numel_overflow(void) {
  /* x [2^40, 2^40, 16]: 2^84 elements, more than int64 counts */
  int64_t xs[3] = {P2(40), P2(40), 16}, ds[3] = {P2(40), P2(40), 8}, ss[3] = {P2(40), P2(40), 1};
  DLTensor x = tens(FAKE, F32, 3, xs), d = tens(FAKE, U8, 3, ds), s = tens(FAKE, U8, 3, ss);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  qqStatus_t st = qqQuantize(NULL, &x, &p, NULL, &d, &s, NULL, NULL);
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), NULL);
}

/* ======================================================================== */
/* out-of-range enum values (legal ints in C)                               */
/* ======================================================================== */
static qqStatus_t quantize_small(const qqQuantParams_t* p) {
  static float x[32];
  static uint8_t d[32], s[1];
  int64_t xs[2] = {1, 32}, ds[2] = {1, 32}, ss[2] = {1, 1};
  memcpy(x, kRow, sizeof kRow);
  DLTensor tx = tens(x, F32, 2, xs), td = tens(d, U8, 2, ds), ts = tens(s, U8, 2, ss);
  return qqQuantize(NULL, &tx, p, NULL, &td, &ts, NULL, NULL);
}

static int enum_check(size_t offset, int value, const char* field) {
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_MXFP8);
  memcpy((char*)&p + offset, &value, sizeof value); /* every enum field is int-sized */
  return expect(quantize_small(&p), ST(QQ_STATUS_INVALID_VALUE), field);
}
static int t_enum_mode_99(void) { return enum_check(offsetof(qqQuantParams_t, mode), 99, "mode"); }
static int t_enum_rounding_7(void) { return enum_check(offsetof(qqQuantParams_t, rounding), 7, "rounding"); }
static int t_enum_scale_layout_5(void) {
  return enum_check(offsetof(qqQuantParams_t, scale_layout), 5, "scale_layout");
}
static int t_enum_fp8_format_3(void) { return enum_check(offsetof(qqQuantParams_t, fp8_format), 3, "fp8_format"); }
static int t_enum_mode_negative(void) { return enum_check(offsetof(qqQuantParams_t, mode), -1, "mode"); }

/* qqQqmm of two float operands with `value` written as a raw int at `offset` of its params:
 * refused with a message containing `needle` */
static int qqmm_enum_check(size_t offset, int value, const char* needle) {
  int64_t xs[2] = {4, 64}, ws[2] = {8, 64}, os[2] = {4, 8};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 2, ws), out = tens(obuf, F32, 2, os);
  qqQqmmParams_t p;
  qqQqmmParamsInit(&p, QQ_MODE_MXFP8);
  memcpy((char*)&p + offset, &value, sizeof value);
  qqStatus_t st = qqQqmm(NULL, &x, NULL, &w, NULL, &p, NULL, NULL, NULL, &out, NULL);
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), needle);
}

static int t_enum_qqmm_mode_99(void) {
  return qqmm_enum_check(offsetof(qqQqmmParams_t, quant) + offsetof(qqQuantParams_t, mode), 99, "mode");
}

static int t_enum_moe_scaling_9(void) {
  static float x[32 * 32];
  static uint8_t d[32 * 32], s[32];
  int64_t xs[3] = {1, 32, 32}, ds[3] = {1, 32, 32}, dst[3] = {32 * 32, 1, 32}, ss[3] = {1, 1, 32};
  DLTensor tx = tens(x, F32, 3, xs), td = tens(d, U8, 3, ds), ts = tens(s, U8, 3, ss);
  td.strides = dst;
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_MXFP8);
  int v = 9;
  qqMoeScaling_t scaling;
  memcpy(&scaling, &v, sizeof v);
  return expect(qqQuantizeMoe(NULL, &tx, &p, scaling, &td, &ts, NULL), ST(QQ_STATUS_INVALID_VALUE), "scaling");
}

/* ======================================================================== */
/* devices                                                                  */
/* ======================================================================== */
static int device_check(int all_cuda) {
  /* host buffers labelled kDLCUDA with device_id -1: never to be run on the CPU */
  float x[16];
  uint8_t d[8], s[1];
  int64_t xs[1] = {16}, ds[1] = {8}, ss[1] = {1};
  memcpy(x, kRow, sizeof x);
  memset(d, 0xAB, sizeof d);
  s[0] = 0xAB;
  DLTensor tx = tens(x, F32, 1, xs), td = tens(d, U8, 1, ds), ts = tens(s, U8, 1, ss);
  tx.device.device_type = kDLCUDA;
  tx.device.device_id = -1;
  if (all_cuda) {
    td.device = tx.device;
    ts.device = tx.device;
  }
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  qqStatus_t st = qqQuantize(NULL, &tx, &p, NULL, &td, &ts, NULL, NULL);
  if (st == QQ_STATUS_SUCCESS || d[0] != 0xAB || s[0] != 0xAB)
    return fail("the call ran on the CPU backend (%s, data[0] = 0x%02x, scale = 0x%02x)", stname(st), d[0], s[0]);
  if (all_cuda)
    return expect(st, ST(QQ_STATUS_INVALID_VALUE) | ST(QQ_STATUS_NOT_SUPPORTED), NULL);
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), NULL);
}
static int t_cuda_device_minus1(void) { return device_check(1); }
static int t_cuda_device_minus1_mixed_cpu(void) { return device_check(0); }

/* ======================================================================== */
/* misaligned data (byte_offset 1): refuse naming the argument, or be right */
/* ======================================================================== */
static int quantize_ref(uint8_t* d, uint8_t* s) {
  float x[16];
  int64_t xs[1] = {16}, ds[1] = {8}, ss[1] = {1};
  memcpy(x, kRow, sizeof x);
  DLTensor tx = tens(x, F32, 1, xs), td = tens(d, U8, 1, ds), ts = tens(s, U8, 1, ss);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  return qqQuantize(NULL, &tx, &p, NULL, &td, &ts, NULL, NULL) == QQ_STATUS_SUCCESS;
}

static int misaligned_result(qqStatus_t st, const char* arg, const uint8_t* d, const uint8_t* s) {
  uint8_t rd[8], rs[1];
  if (st == QQ_STATUS_INVALID_VALUE) return expect(st, ST(QQ_STATUS_INVALID_VALUE), arg);
  if (st != QQ_STATUS_SUCCESS) return fail("got %s (\"%s\")", stname(st), qqGetLastErrorMessage());
  if (!quantize_ref(rd, rs)) return fail("the aligned reference call failed: %s", qqGetLastErrorMessage());
  if (memcmp(d, rd, 8) || s[0] != rs[0]) return fail("accepted but the result differs from the aligned call");
  return pass("accepted, same result as the aligned call");
}

static int t_misaligned_f32_x(void) {
  static union { double align; unsigned char b[1 + 16 * 4]; } buf;
  uint8_t d[8], s[1];
  int64_t xs[1] = {16}, ds[1] = {8}, ss[1] = {1};
  memcpy(buf.b + 1, kRow, sizeof kRow);
  DLTensor tx = tens(buf.b, F32, 1, xs), td = tens(d, U8, 1, ds), ts = tens(s, U8, 1, ss);
  tx.byte_offset = 1;
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  return misaligned_result(qqQuantize(NULL, &tx, &p, NULL, &td, &ts, NULL, NULL), "'x'", d, s);
}

static int t_misaligned_bf16_x(void) {
  /* the same row in bfloat16 (all values exact): upper halves of the floats */
  static union { double align; unsigned char b[1 + 16 * 2]; } buf;
  uint8_t d[8], s[1];
  int64_t xs[1] = {16}, ds[1] = {8}, ss[1] = {1};
  for (int i = 0; i < 16; ++i) {
    uint32_t u;
    memcpy(&u, &kRow[i], 4);
    uint16_t h = (uint16_t)(u >> 16);
    memcpy(buf.b + 1 + 2 * i, &h, 2);
  }
  DLTensor tx = tens(buf.b, BF16, 1, xs), td = tens(d, U8, 1, ds), ts = tens(s, U8, 1, ss);
  tx.byte_offset = 1;
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  return misaligned_result(qqQuantize(NULL, &tx, &p, NULL, &td, &ts, NULL, NULL), "'x'", d, s);
}

static int t_misaligned_global_scale(void) {
  /* global scale 2688 (a factor of 1): same result as without one */
  static union { double align; unsigned char b[1 + 4]; } gbuf;
  float x[16];
  uint8_t d[8], s[1];
  int64_t xs[1] = {16}, ds[1] = {8}, ss[1] = {1}, gs[1] = {1};
  const float g = 2688.0f;
  memcpy(x, kRow, sizeof x);
  memcpy(gbuf.b + 1, &g, 4);
  DLTensor tx = tens(x, F32, 1, xs), td = tens(d, U8, 1, ds), ts = tens(s, U8, 1, ss);
  DLTensor tg = tens(gbuf.b, F32, 1, gs);
  tg.byte_offset = 1;
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  return misaligned_result(qqQuantize(NULL, &tx, &p, &tg, &td, &ts, NULL, NULL), "'global_scale'", d, s);
}

static int t_misaligned_amax_out(void) {
  static union { double align; unsigned char b[1 + 4]; } obuf1;
  float x[16];
  int64_t xs[1] = {16}, os[1] = {1};
  memcpy(x, kRow, sizeof x);
  DLTensor tx = tens(x, F32, 1, xs), to = tens(obuf1.b, F32, 1, os);
  to.byte_offset = 1;
  qqStatus_t st = qqAmax(NULL, &tx, &to, NULL);
  if (st == QQ_STATUS_INVALID_VALUE) return expect(st, ST(QQ_STATUS_INVALID_VALUE), "'out'");
  if (st != QQ_STATUS_SUCCESS) return fail("got %s (\"%s\")", stname(st), qqGetLastErrorMessage());
  float v;
  memcpy(&v, obuf1.b + 1, 4);
  if (v != 6.0f) return fail("accepted but amax = %g, expected 6", (double)v);
  return pass("accepted, amax = 6");
}

/* ======================================================================== */
/* NULL / uninitialized parameter structs and outputs                       */
/* ======================================================================== */
static int t_quantize_null_params(void) { return expect(quantize_small(NULL), ST(QQ_STATUS_INVALID_VALUE), "params"); }

static int t_quantize_short_struct(void) {
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_MXFP8);
  p.struct_size = sizeof p - 1;
  return expect(quantize_small(&p), ST(QQ_STATUS_INVALID_VALUE), "struct_size");
}

static int t_shapes_null_params(void) {
  int64_t xs[1] = {32}, ds[1], ss[2];
  int snd;
  return expect(qqQuantizedShapes(NULL, 1, xs, ds, ss, &snd), ST(QQ_STATUS_INVALID_VALUE), "params");
}

static int t_quantize_null_data(void) {
  float x[32];
  uint8_t s[1];
  int64_t xs[1] = {32}, ss[1] = {1};
  memcpy(x, kRow, sizeof kRow);
  memset(x + 16, 0, 16 * sizeof(float));
  DLTensor tx = tens(x, F32, 1, xs), ts = tens(s, U8, 1, ss);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_MXFP8);
  return expect(qqQuantize(NULL, &tx, &p, NULL, NULL, &ts, NULL, NULL), ST(QQ_STATUS_INVALID_VALUE), "'data'");
}

static int t_qqmm_null_params(void) {
  int64_t xs[2] = {4, 64}, ws[2] = {8, 64}, os[2] = {4, 8};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 2, ws), out = tens(obuf, F32, 2, os);
  qqStatus_t st = qqQqmm(NULL, &x, NULL, &w, NULL, NULL, NULL, NULL, NULL, &out, NULL);
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "params");
}

static int t_qqmm_short_struct(void) {
  int64_t xs[2] = {4, 64}, ws[2] = {8, 64}, os[2] = {4, 8};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 2, ws), out = tens(obuf, F32, 2, os);
  qqQqmmParams_t p;
  qqQqmmParamsInit(&p, QQ_MODE_MXFP8);
  p.struct_size = sizeof(size_t); /* a caller built against an older, shorter struct */
  qqStatus_t st = qqQqmm(NULL, &x, NULL, &w, NULL, &p, NULL, NULL, NULL, &out, NULL);
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "params");
}

static int t_qqmm_null_out(void) {
  int64_t xs[2] = {4, 64}, ws[2] = {8, 64};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 2, ws);
  qqQqmmParams_t p;
  qqQqmmParamsInit(&p, QQ_MODE_MXFP8);
  qqStatus_t st = qqQqmm(NULL, &x, NULL, &w, NULL, &p, NULL, NULL, NULL, NULL, NULL);
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "'out'");
}

static int t_qqmm_w3d_null_out(void) {
  int64_t xs[2] = {4, 64}, ws[3] = {2, 8, 64};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 3, ws);
  qqQqmmParams_t p;
  qqQqmmParamsInit(&p, QQ_MODE_MXFP8);
  qqStatus_t st = qqQqmm(NULL, &x, NULL, &w, NULL, &p, NULL, NULL, NULL, NULL, NULL);
  return expect(st, ST(QQ_STATUS_INVALID_VALUE), "'out'");
}

static int t_amax_null_out(void) {
  float x[16];
  int64_t xs[1] = {16};
  memcpy(x, kRow, sizeof x);
  DLTensor tx = tens(x, F32, 1, xs);
  return expect(qqAmax(NULL, &tx, NULL, NULL), ST(QQ_STATUS_INVALID_VALUE), "'out'");
}

static int t_params_init_null(void) {
  return expect(qqQuantParamsInit(NULL, QQ_MODE_NVFP4), ST(QQ_STATUS_INVALID_VALUE), "params");
}

/* qqGetCudaInfo: NULL and a short struct_size refused; a full one filled,
 * with the strings never NULL and a reason whenever there is no device. */
static int t_cuda_info(void) {
  if (qqGetCudaInfo(NULL) != QQ_STATUS_INVALID_VALUE) return fail("qqGetCudaInfo(NULL) was not refused");
  qqCudaInfo_t info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof(size_t);
  if (qqGetCudaInfo(&info) != QQ_STATUS_INVALID_VALUE) return fail("a short struct_size was not refused");
  memset(&info, 0xab, sizeof info);
  info.struct_size = sizeof info;
  if (qqGetCudaInfo(&info) != QQ_STATUS_SUCCESS) return fail("qqGetCudaInfo failed: %s", qqGetLastErrorMessage());
  if (qqGetLastErrorMessage()[0] != '\0') return fail("message after success: \"%s\"", qqGetLastErrorMessage());
  if (info.struct_size != sizeof info) return fail("struct_size changed to %zu", info.struct_size);
  if (!info.device_note || !info.cublaslt_path || !info.cublaslt_note) return fail("a NULL string");
  if (info.device_count != qqGetDeviceCount())
    return fail("device_count %d, qqGetDeviceCount %d", info.device_count, qqGetDeviceCount());
  if (info.device_count == 0 && info.device_note[0] == '\0') return fail("no device and no reason");
  if (!info.cuda_built && (info.device_count || info.cublaslt_loaded)) return fail("CPU-only build with CUDA state");
  if (info.cublaslt_loaded != (info.cublaslt_note[0] == '\0')) return fail("cublaslt_loaded disagrees with the note");
  return pass("cuda_built %d, %d device(s) (%s), cuBLASLt version %zu (%s)", info.cuda_built, info.device_count,
              info.device_note, info.cublaslt_version, info.cublaslt_loaded ? info.cublaslt_path : info.cublaslt_note);
}

/* ======================================================================== */
/* the error message after success, and a golden valid call                 */
/* ======================================================================== */
static int t_valid_quantize_golden(void) {
  uint8_t d[8], s[1];
  if (!quantize_ref(d, s)) return fail("qqQuantize failed: %s", qqGetLastErrorMessage());
  uint32_t word = (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
  if (s[0] != 0x38 || word != 0x97654321u)
    return fail("scale 0x%02x word 0x%08x; expected 0x38 and 0x97654321", s[0], word);
  return pass("scale 0x38, packed word 0x97654321");
}

static int t_last_error_cleared(void) {
  uint8_t d[8], s[1];
  if (quantize_small(NULL) == QQ_STATUS_SUCCESS) return fail("the failing call succeeded");
  if (qqGetLastErrorMessage()[0] == '\0') return fail("no message after a failing call");
  if (!quantize_ref(d, s)) return fail("the valid call failed: %s", qqGetLastErrorMessage());
  const char* m = qqGetLastErrorMessage();
  if (m[0] != '\0') return fail("message after a successful qqQuantize: \"%s\"", m);
  /* the same for qqQqmm and qqQuantizedShapes */
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  int64_t xs[1] = {10}, ds[1], ss[2];
  int snd;
  if (qqQuantizedShapes(&p, 1, xs, ds, ss, &snd) == QQ_STATUS_SUCCESS) return fail("K=10 nvfp4 shapes succeeded");
  xs[0] = 32;
  if (qqQuantizedShapes(&p, 1, xs, ds, ss, &snd) != QQ_STATUS_SUCCESS) return fail("K=32 shapes failed");
  if (qqGetLastErrorMessage()[0] != '\0')
    return fail("message after a successful qqQuantizedShapes: \"%s\"", qqGetLastErrorMessage());
  int64_t xsm[2] = {4, 64}, ws[2] = {8, 64}, os[2] = {4, 8};
  DLTensor x = tens(xbuf, F32, 2, xsm), w = tens(wbuf, F32, 2, ws), out = tens(obuf, F32, 2, os);
  qqQqmmParams_t qp;
  qqQqmmParamsInit(&qp, QQ_MODE_MXFP8);
  (void)qqQqmm(NULL, &x, NULL, &w, NULL, NULL, NULL, NULL, NULL, &out, NULL);
  if (qqQqmm(NULL, &x, NULL, &w, NULL, &qp, NULL, NULL, NULL, &out, NULL) != QQ_STATUS_SUCCESS)
    return fail("a valid qqQqmm failed: %s", qqGetLastErrorMessage());
  if (qqGetLastErrorMessage()[0] != '\0')
    return fail("message after a successful qqQqmm: \"%s\"", qqGetLastErrorMessage());
  return pass("\"\" after successful qqQuantize, qqQuantizedShapes and qqQqmm");
}

/* ======================================================================== */
struct check {
  const char* name;
  int (*fn)(void);
  /* 1: a child killed by AddressSanitizer's out-of-memory report in
   * operator new counts as a pass. Under ASan, operator new never throws
   * std::bad_alloc (it reports and exits), so a libqq that catches bad_alloc
   * (the right behaviour, which an unsanitized build checks) still dies
   * there. A libqq that refuses the size up front passes either way. */
  int tolerate_asan_oom;
};
/* ---- qqGatherQmm: the indices are an argument like any other ------------ */
static uint8_t gw[2 * 8 * 32], gs[2 * 8 * 4];
static float gx[3 * 64], gout[3 * 8];

static qqStatus_t gather_call(const DLTensor* idx) {
  int64_t xs[3] = {3, 1, 64}, ws[3] = {2, 8, 32}, ss[3] = {2, 8, 4}, os[3] = {3, 1, 8};
  DLTensor x = tens(gx, F32, 3, xs), w = tens(gw, U8, 3, ws), s = tens(gs, U8, 3, ss), out = tens(gout, F32, 3, os);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  return qqGatherQmm(NULL, &x, &w, &s, NULL, idx, &p, 1, NULL, NULL, &out, NULL);
}
static int t_gather_null_indices(void) {
  return expect(gather_call(NULL), ST(QQ_STATUS_INVALID_VALUE), "rhs_indices");
}
static int t_gather_index_out_of_range(void) {
  static int32_t idx[3] = {0, 2, 1}; /* E = 2 */
  int64_t is[1] = {3};
  DLTensor t = tens(idx, I32, 1, is);
  return expect(gather_call(&t), ST(QQ_STATUS_INVALID_VALUE), "[0, E=2)");
}
static int t_gather_indices_null_shape(void) {
  static int32_t idx[3] = {0, 1, 1};
  DLTensor t = tens(idx, I32, 1, NULL);
  return expect(gather_call(&t), ST(QQ_STATUS_INVALID_VALUE), "rhs_indices");
}
static int t_gather_indices_float(void) {
  static float idx[3] = {0.0f, 1.0f, 1.0f};
  int64_t is[1] = {3};
  DLTensor t = tens(idx, F32, 1, is);
  return expect(gather_call(&t), ST(QQ_STATUS_INVALID_DTYPE), "int32");
}
static int t_gather_valid(void) {
  static int32_t idx[3] = {1, 0, 1};
  int64_t is[1] = {3};
  DLTensor t = tens(idx, I32, 1, is);
  return expect(gather_call(&t), ST(QQ_STATUS_SUCCESS), NULL);
}

/* qqGroupedQqmmWgrad: x [6, 32], dy [6, 8], two experts (4 + 2 tokens), out [2, 32, 8]. */
static qqStatus_t wgrad_call(const int32_t* ends_in, int n_ends, int null_out) {
  static float wx[6 * 32], wdy[6 * 8], wout[4 * 32 * 8];
  static int32_t ends[4];
  for (int i = 0; i < 6 * 32; ++i) wx[i] = kRow[i % 7];
  for (int i = 0; i < 6 * 8; ++i) wdy[i] = kRow[(i + 3) % 7];
  for (int i = 0; i < n_ends; ++i) ends[i] = ends_in[i];
  int64_t xs[2] = {6, 32}, ds[2] = {6, 8}, es[1] = {n_ends}, os[3] = {n_ends, 32, 8};
  DLTensor x = tens(wx, F32, 2, xs), dy = tens(wdy, F32, 2, ds), off = tens(ends, I32, 1, es);
  DLTensor out = tens(wout, F32, 3, os);
  qqQuantParams_t p;
  if (qqQuantParamsInit(&p, QQ_MODE_MXFP8) != QQ_STATUS_SUCCESS) return QQ_STATUS_INTERNAL_ERROR;
  return qqGroupedQqmmWgrad(NULL, &x, &dy, &off, &p, NULL, NULL, null_out ? NULL : &out, NULL);
}

static int t_wgrad_valid(void) {
  static const int32_t e[2] = {4, 6};
  return expect(wgrad_call(e, 2, 0), ST(QQ_STATUS_SUCCESS), NULL);
}
static int t_wgrad_bad_offsets(void) {
  static const int32_t e[2] = {5, 4};
  return expect(wgrad_call(e, 2, 0), ST(QQ_STATUS_INVALID_VALUE), "offsets");
}
static int t_wgrad_last_not_t(void) {
  static const int32_t e[2] = {4, 5};
  return expect(wgrad_call(e, 2, 0), ST(QQ_STATUS_INVALID_VALUE), "offsets");
}
static int t_wgrad_null_out(void) {
  static const int32_t e[2] = {4, 6};
  return expect(wgrad_call(e, 2, 1), ST(QQ_STATUS_INVALID_VALUE), "out");
}

/* ======================================================================== */
/* qqQuantizeDequantize                                                     */
/* ======================================================================== */
static float qx[2 * 32];
static uint16_t qr[2 * 32], qc[2 * 32];

static qqStatus_t qdq_call(int rows, int cols) {
  int64_t xs[2] = {2, 32};
  DLTensor x = tens(qx, F32, 2, xs), r = tens(qr, BF16, 2, xs), c = tens(qc, BF16, 2, xs);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_MXFP8);
  return qqQuantizeDequantize(NULL, &x, &p, NULL, rows ? &r : NULL, cols ? &c : NULL, NULL);
}
static int t_qdq_no_outputs(void) { return expect(qdq_call(0, 0), ST(QQ_STATUS_INVALID_VALUE), "out_t"); }
/* values a mxfp8 scale holds exactly: both orientations give them back, in bf16 */
static int t_qdq_valid(void) {
  for (int i = 0; i < 64; ++i) qx[i] = kRow[i % 8] * (i < 32 ? 1.0f : -2.0f);
  qqStatus_t st = qdq_call(1, 1);
  if (st != QQ_STATUS_SUCCESS) return fail("%s: %s", stname(st), qqGetLastErrorMessage());
  for (int i = 0; i < 64; ++i) {
    uint32_t b;
    memcpy(&b, &qx[i], 4);
    if (qr[i] != (uint16_t)(b >> 16) || qc[i] != (uint16_t)(b >> 16))
      return fail("element %d: rows 0x%04x cols 0x%04x, expected 0x%04x", i, qr[i], qc[i], (unsigned)(b >> 16));
  }
  return pass("64 values back along both axes");
}

/* ---- the decode layout ----------------------------------------------------- */
static int t_decode_size_null_params(void) {
  int64_t b = 0;
  return expect(qqDecodeLayoutSize(NULL, 64, 256, &b), ST(QQ_STATUS_INVALID_VALUE), "params");
}

static int t_decode_size_affine_3bit(void) {
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_AFFINE);
  p.bits = 3;
  int64_t b = 0;
  return expect(qqDecodeLayoutSize(&p, 64, 256, &b), ST(QQ_STATUS_INVALID_VALUE), "4 or 8 bits");
}

static int t_decode_size_huge_n(void) {
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  int64_t b = 0;
  return expect(qqDecodeLayoutSize(&p, P2(62), 256, &b), ST(QQ_STATUS_INVALID_VALUE), "n = ");
}

/* An affine [64, 256] weight of bf16 values, quantized here (bf16 scales and biases). */
enum { DN = 64, DK = 256 };
static uint16_t d_w[DN * DK], d_sc[DN * DK / 64], d_bi[DN * DK / 64];
static uint8_t d_q[DN * DK];
static int affine_weight(int bits) {
  for (int i = 0; i < DN * DK; ++i) {
    float v = kRow[(i * 7 + i / DK) % 8] * (1.0f + (float)(i % 13) * 0.25f);
    uint32_t u;
    memcpy(&u, &v, 4);
    d_w[i] = (uint16_t)(u >> 16);
  }
  int64_t ws[2] = {DN, DK}, qs[2] = {DN, DK * bits / 8}, ss[2] = {DN, DK / 64};
  DLTensor w = tens(d_w, BF16, 2, ws), q = tens(d_q, U8, 2, qs), sc = tens(d_sc, BF16, 2, ss),
           bi = tens(d_bi, BF16, 2, ss);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_AFFINE);
  p.bits = bits;
  return qqQuantize(NULL, &w, &p, NULL, &q, &sc, &bi, NULL) == QQ_STATUS_SUCCESS;
}

static int t_decode_affine_no_biases(void) {
  if (!affine_weight(4)) return fail("quantize failed: %s", qqGetLastErrorMessage());
  static uint8_t out[DN / 16 * (DK / 64) * 576];
  int64_t qs[2] = {DN, DK / 2}, ss[2] = {DN, DK / 64}, os[1] = {(int64_t)sizeof out};
  DLTensor q = tens(d_q, U8, 2, qs), sc = tens(d_sc, BF16, 2, ss), o = tens(out, U8, 1, os);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_AFFINE);
  return expect(qqToDecodeLayout(NULL, &q, &sc, NULL, &p, &o, NULL), ST(QQ_STATUS_INVALID_VALUE), "'biases'");
}

static int t_decode_nvfp4_with_biases(void) {
  int64_t qs[2] = {DN, DK / 2}, ss[2] = {DN, DK / 16}, os[1] = {DN / 16 * (DK / 64) * 576};
  static uint8_t q8[DN * DK / 2], s8[DN * DK / 16], out[DN / 16 * (DK / 64) * 576];
  DLTensor q = tens(q8, U8, 2, qs), sc = tens(s8, U8, 2, ss), bi = tens(s8, U8, 2, ss), o = tens(out, U8, 1, os);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  return expect(qqToDecodeLayout(NULL, &q, &sc, &bi, &p, &o, NULL), ST(QQ_STATUS_INVALID_VALUE), "'biases'");
}

static int t_decode_affine_fp32_scales(void) {
  if (!affine_weight(8)) return fail("quantize failed: %s", qqGetLastErrorMessage());
  static float sc32[DN * DK / 64], bi32[DN * DK / 64];
  static uint8_t out[DN / 16 * (DK / 32) * 576];
  for (int i = 0; i < DN * DK / 64; ++i) {
    /* the bf16 values in fp32, but for scale 5: one more fp32 ulp makes it no bf16 value */
    uint32_t u = ((uint32_t)d_sc[i] << 16) + (i == 5), v = (uint32_t)d_bi[i] << 16;
    memcpy(&sc32[i], &u, 4);
    memcpy(&bi32[i], &v, 4);
  }
  int64_t qs[2] = {DN, DK}, ss[2] = {DN, DK / 64}, os[1] = {(int64_t)sizeof out};
  DLTensor q = tens(d_q, U8, 2, qs), sc = tens(sc32, F32, 2, ss), bi = tens(bi32, F32, 2, ss),
           o = tens(out, U8, 1, os);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_AFFINE);
  p.bits = 8;
  return expect(qqToDecodeLayout(NULL, &q, &sc, &bi, &p, &o, NULL), ST(QQ_STATUS_NOT_SUPPORTED), "bfloat16");
}

/* The whole C path for an affine weight: size, layout, matmul; equal to qqQuantizedMatmul on
 * the packed weight bit for bit (both dequantize with fma(c, s, b) and sum in one order). */
static int decode_affine_matches(int bits) {
  if (!affine_weight(bits)) return fail("quantize failed: %s", qqGetLastErrorMessage());
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_AFFINE);
  p.bits = bits;
  int64_t nbytes = 0;
  qqStatus_t st = qqDecodeLayoutSize(&p, DN, DK, &nbytes);
  if (st != QQ_STATUS_SUCCESS) return fail("qqDecodeLayoutSize: %s", qqGetLastErrorMessage());
  if (nbytes != (int64_t)DN / 16 * (DK / (bits == 8 ? 32 : 64)) * 576)
    return fail("qqDecodeLayoutSize gave %lld bytes", (long long)nbytes);
  uint8_t* lay = (uint8_t*)malloc((size_t)nbytes);
  static float x[3 * DK], y0[3 * DN], y1[3 * DN];
  for (int i = 0; i < 3 * DK; ++i) x[i] = kRow[i % 7] * (i % 2 ? -0.5f : 1.0f);
  int64_t qs[2] = {DN, DK * bits / 8}, ss[2] = {DN, DK / 64}, ls[1] = {nbytes}, xs[2] = {3, DK}, ys[2] = {3, DN};
  DLTensor q = tens(d_q, U8, 2, qs), sc = tens(d_sc, BF16, 2, ss), bi = tens(d_bi, BF16, 2, ss),
           l = tens(lay, U8, 1, ls), tx = tens(x, F32, 2, xs), o0 = tens(y0, F32, 2, ys), o1 = tens(y1, F32, 2, ys);
  st = qqToDecodeLayout(NULL, &q, &sc, &bi, &p, &l, NULL);
  if (st == QQ_STATUS_SUCCESS) st = qqDecodeMatmul(NULL, &tx, &l, &p, NULL, NULL, &o0, NULL);
  if (st == QQ_STATUS_SUCCESS) st = qqQuantizedMatmul(NULL, &tx, &q, &sc, &bi, &p, 1, NULL, NULL, &o1, NULL);
  free(lay);
  if (st != QQ_STATUS_SUCCESS) return fail("%s: %s", stname(st), qqGetLastErrorMessage());
  if (memcmp(y0, y1, sizeof y0)) return fail("decode-layout result differs from the packed weight's");
  return pass("%d-bit: %lld layout bytes, the same %d results as the packed weight", bits, (long long)nbytes,
              3 * DN);
}
static int t_decode_affine4_matches(void) { return decode_affine_matches(4); }
static int t_decode_affine8_matches(void) { return decode_affine_matches(8); }

/* The gated layout through C: qqToDecodeLayoutGated of an nvfp4 W [2F, K] (F = 64: two
 * tiles, so the layout's row order differs from W's), then qqDecodeGatedMatmul: swiglu = 0
 * gives the packed weight's product bit for bit (columns back in W's order), swiglu = 1
 * qqSwiglu of it bit for bit, with a bias [2F] each time; a bad swiglu, a wrong out and
 * experts are refused by name. */
enum { GF = 64, GN = 2 * GF, GK = 256 };
static int t_decode_gated(void) {
  static float w[GN * GK], x[3 * GK], bias[GN], y0[3 * GN], y1[3 * GN], s0[3 * GF], s1[3 * GF];
  static uint8_t q8[GN * GK / 2], sc8[GN * GK / 16], lay[GN / 16 * (GK / 64) * 576];
  for (int i = 0; i < GN * GK; ++i) w[i] = kRow[(i * 5 + i / GK) % 8] * (1.0f + (float)(i % 11) * 0.125f);
  for (int i = 0; i < 3 * GK; ++i) x[i] = kRow[i % 7] * (i % 2 ? -0.25f : 0.5f);
  for (int i = 0; i < GN; ++i) bias[i] = (float)i * 0.5f;
  int64_t ws[2] = {GN, GK}, qs[2] = {GN, GK / 2}, ss[2] = {GN, GK / 16}, ls[1] = {(int64_t)sizeof lay},
          xs[2] = {3, GK}, bs[1] = {GN}, ys[2] = {3, GN}, fs[2] = {3, GF}, es[3] = {2, GF, GK / 2},
          ess[3] = {2, GF, GK / 16};
  DLTensor tw = tens(w, F32, 2, ws), q = tens(q8, U8, 2, qs), sc = tens(sc8, U8, 2, ss), l = tens(lay, U8, 1, ls),
           tx = tens(x, F32, 2, xs), tb = tens(bias, F32, 1, bs), o0 = tens(y0, F32, 2, ys),
           o1 = tens(y1, F32, 2, ys), f0 = tens(s0, F32, 2, fs), f1 = tens(s1, F32, 2, fs);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  qqStatus_t st = qqQuantize(NULL, &tw, &p, NULL, &q, &sc, NULL, NULL);
  if (st == QQ_STATUS_SUCCESS) st = qqToDecodeLayoutGated(NULL, &q, &sc, NULL, &p, &l, NULL);
  if (st == QQ_STATUS_SUCCESS) st = qqDecodeGatedMatmul(NULL, &tx, &l, &p, NULL, &tb, 0, &o0, NULL);
  if (st == QQ_STATUS_SUCCESS) st = qqQuantizedMatmul(NULL, &tx, &q, &sc, NULL, &p, 1, NULL, &tb, &o1, NULL);
  if (st == QQ_STATUS_SUCCESS) st = qqDecodeGatedMatmul(NULL, &tx, &l, &p, NULL, &tb, 1, &f0, NULL);
  if (st == QQ_STATUS_SUCCESS) st = qqSwiglu(NULL, &o1, &f1, NULL);
  if (st != QQ_STATUS_SUCCESS) return fail("%s: %s", stname(st), qqGetLastErrorMessage());
  if (memcmp(y0, y1, sizeof y0)) return fail("the gated layout's product differs from the packed weight's");
  if (memcmp(s0, s1, sizeof s0)) return fail("the gated SwiGLU differs from qqSwiglu of the product");
  if (!expect(qqDecodeGatedMatmul(NULL, &tx, &l, &p, NULL, NULL, 2, &f0, NULL), ST(QQ_STATUS_INVALID_VALUE),
              "argument 'swiglu' is 2"))
    return 0;
  int64_t bad[2] = {3, 24}; /* F = 24: not a multiple of 32 */
  DLTensor fb = tens(s0, F32, 2, bad);
  if (!expect(qqDecodeGatedMatmul(NULL, &tx, &l, &p, NULL, NULL, 1, &fb, NULL), ST(QQ_STATUS_INVALID_VALUE),
              "decode_gated_matmul: 'out'"))
    return 0;
  if (!expect(qqDecodeGatedMatmul(NULL, NULL, &l, &p, NULL, NULL, 1, &f0, NULL), ST(QQ_STATUS_INVALID_VALUE),
              "decode_gated_matmul: argument 'x'") ||
      !expect(qqDecodeGatedMatmul(NULL, &tx, &l, &p, NULL, NULL, 1, NULL, NULL), ST(QQ_STATUS_INVALID_VALUE),
              "decode_gated_matmul: argument 'out'") ||
      !expect(qqDecodeGatedMatmul(NULL, &tx, NULL, &p, NULL, NULL, 1, &f0, NULL), ST(QQ_STATUS_INVALID_VALUE),
              "'w_decode'") ||
      !expect(qqDecodeGatedMatmul(NULL, &tx, &l, NULL, NULL, NULL, 1, &f0, NULL), ST(QQ_STATUS_INVALID_VALUE),
              "params") ||
      !expect(qqToDecodeLayoutGated(NULL, NULL, &sc, NULL, &p, &l, NULL), ST(QQ_STATUS_INVALID_VALUE),
              "to_decode_layout_gated: argument 'w'"))
    return 0;
  DLTensor eq = tens(q8, U8, 3, es), esc = tens(sc8, U8, 3, ess);
  if (!expect(qqToDecodeLayoutGated(NULL, &eq, &esc, NULL, &p, &l, NULL), ST(QQ_STATUS_INVALID_VALUE),
              "to_decode_layout_gated: w holds 2 experts"))
    return 0;
  return pass("F = %d: product and SwiGLU (with a bias) equal the packed weight's and qqSwiglu's; bad swiglu, "
              "out, experts and NULL arguments refused", GF);
}

/* ======================================================================== */
/* Found by probing the C ABI (session z)                                   */
/* ======================================================================== */
/* qqQuantizeMoeShapes answers no shape qqQuantizeMoe refuses (more than 2^56 elements),
 * and computes no overflowing roundup */
static int t_moe_shapes_bound(void) {
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_MXFP8);
  p.scale_layout = QQ_SCALE_BLOCKED;
  int64_t w1[3] = {1, 32, INT64_MAX - 31}, w2[3] = {P2(40), P2(40), P2(40)}, s[3];
  if (!expect(qqQuantizeMoeShapes(&p, QQ_MOE_32X1, w1, s), ST(QQ_STATUS_INVALID_VALUE), "2^56")) return 0;
  if (!expect(qqQuantizeMoeShapes(&p, QQ_MOE_32X1, w2, s), ST(QQ_STATUS_INVALID_VALUE), "2^56")) return 0;
  int64_t ok[3] = {2, 64, 256};
  if (!expect(qqQuantizeMoeShapes(&p, QQ_MOE_32X1, ok, s), ST(QQ_STATUS_SUCCESS), NULL)) return 0;
  if (s[0] != 2 || s[1] != 256 || s[2] != 4) return fail("scales shape [%lld, %lld, %lld]", (long long)s[0],
                                                        (long long)s[1], (long long)s[2]);
  return pass("2^56 bound as qqQuantizeMoe's; [2, 64, 256] -> [2, 256, 4]");
}

/* a successful qqGetLastRoute leaves the message empty, as every successful call */
static int t_last_route_clears_message(void) {
  if (qqGetLastRoute(NULL) == QQ_STATUS_SUCCESS) return fail("qqGetLastRoute(NULL) succeeded");
  qqRoute_t r;
  if (!expect(qqGetLastRoute(&r), ST(QQ_STATUS_SUCCESS), NULL)) return 0;
  if (qqGetLastErrorMessage()[0] != '\0') return fail("message after success: \"%s\"", qqGetLastErrorMessage());
  return pass("message empty after a successful qqGetLastRoute");
}

/* an out-of-range scale layout is refused for a float operand too */
static int t_qqmm_layout_enum_float_operand(void) {
  return qqmm_enum_check(offsetof(qqQqmmParams_t, x_scale_layout), 9, "unknown scale layout 9");
}

/* quantize_colwise: scales or biases without data (the row-wise half) is refused */
static int t_colwise_scales_without_data(void) {
  static float x[64 * 64];
  static uint8_t dt[64 * 32], st[64 * 4], sc[7 * 7];
  int64_t xs[2] = {64, 64}, ds[2] = {64, 32}, ss[2] = {64, 4}, bogus[2] = {7, 7};
  DLTensor tx = tens(x, F32, 2, xs), tdt = tens(dt, U8, 2, ds), tst = tens(st, U8, 2, ss),
           tsc = tens(sc, U8, 2, bogus);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  return expect(qqQuantizeColwise(NULL, &tx, &p, NULL, &tdt, &tst, NULL, NULL, &tsc, NULL, NULL),
                ST(QQ_STATUS_INVALID_VALUE), "'data' is NULL");
}

/* a swizzle output of a wrong dtype is a wrong buffer (INVALID_VALUE), as every op's out */
static int t_swizzle_out_dtype(void) {
  static uint8_t lin[4 * 4];
  static int64_t blk[128 * 4];
  int64_t ls[2] = {4, 4}, bs[2] = {128, 4};
  DLDataType i64 = {kDLInt, 64, 1};
  DLTensor tl = tens(lin, U8, 2, ls), tb = tens(blk, i64, 2, bs);
  return expect(qqSwizzleScales(NULL, &tl, &tb, NULL), ST(QQ_STATUS_INVALID_VALUE), "out");
}

/* ======================================================================== */
/* empty tensors (session aa's probe): bounded extents, no work, no UB       */
/* ======================================================================== */
static int t_empty_huge_extents(void) {
  /* [2^62, 2^62, 0]: numel and to_mat's empty strides overflowed int64 (UBSan) */
  float o = 5.0f;
  int64_t xs[3] = {P2(62), P2(62), 0}, os[1] = {1};
  DLTensor x = tens(FAKE, F32, 3, xs), out = tens(&o, F32, 1, os);
  return expect(qqAmax(NULL, &x, &out, NULL), ST(QQ_STATUS_INVALID_VALUE), "2^56");
}

static int t_amax_empty_many_rows(void) {
  /* [3, 2^40, 0]: the CPU looped 3 * 2^40 empty rows (a hang); an empty x gives 0 */
  float o = 5.0f;
  int64_t xs[3] = {3, P2(40), 0}, os[1] = {1};
  DLTensor x = tens(FAKE, F32, 3, xs), out = tens(&o, F32, 1, os);
  qqStatus_t st = qqAmax(NULL, &x, &out, NULL);
  if (st != QQ_STATUS_SUCCESS || o != 0.0f) return fail("%s, out %g", stname(st), (double)o);
  return pass("0");
}

static int t_swizzle_empty(void) {
  /* linear [0, 5] -> blocked [0, 8] with NULL data (memset(NULL) under UBSan), and [2^40, 0] (a hang) */
  static uint8_t buf[16];
  int64_t ls[2] = {0, 5}, bs[2] = {0, 8}, ls2[2] = {P2(40), 0}, bs2[2] = {P2(40), 0};
  DLTensor l = tens(NULL, U8, 2, ls), b = tens(NULL, U8, 2, bs);
  DLTensor l2 = tens(buf, U8, 2, ls2), b2 = tens(buf + 8, U8, 2, bs2);
  qqStatus_t s1 = qqSwizzleScales(NULL, &l, &b, NULL), s2 = qqSwizzleScales(NULL, &l2, &b2, NULL);
  if (s1 != QQ_STATUS_SUCCESS || s2 != QQ_STATUS_SUCCESS) return fail("%s / %s", stname(s1), stname(s2));
  return pass("both SUCCESS");
}

static int t_decode_layout_empty(void) {
  /* N = 0: a layout of no bytes (memset(NULL, 0, 0) under UBSan) */
  int64_t ws[2] = {0, 128}, ss[2] = {0, 16}, os[1] = {0};
  DLTensor w = tens(NULL, U8, 2, ws), sc = tens(NULL, U8, 2, ss), out = tens(NULL, U8, 1, os);
  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  return expect(qqToDecodeLayout(NULL, &w, &sc, NULL, &p, &out, NULL), ST(QQ_STATUS_SUCCESS), "");
}

static int t_grouped_no_experts_validates(void) {
  /* E = 0, T = 0: mode affine (and any argument) was accepted without a look */
  static float xb[1], ob[1];
  int64_t xs[2] = {0, 32}, ws[3] = {0, 4, 32}, offs[1] = {0}, os[2] = {0, 4};
  DLTensor x = tens(xb, F32, 2, xs), w = tens(NULL, F32, 3, ws), off = tens(NULL, I32, 1, offs);
  DLTensor out = tens(ob, F32, 2, os);
  qqQqmmParams_t p;
  qqQqmmParamsInit(&p, QQ_MODE_AFFINE);
  return expect(qqGroupedQqmm(NULL, &x, NULL, &off, &w, NULL, &p, NULL, NULL, &out, NULL),
                ST(QQ_STATUS_INVALID_VALUE), "affine");
}

static int t_grouped_global_scale_dtype(void) {
  /* a float16 global_scale_w is INVALID_DTYPE, as qqQqmm says it (it was INVALID_VALUE) */
  static uint16_t g[2];
  int64_t xs[2] = {4, 32}, ws[3] = {2, 4, 32}, offs[1] = {2}, gs[1] = {2}, os[2] = {4, 4};
  static int32_t ends[2] = {2, 4};
  DLDataType F16 = {kDLFloat, 16, 1};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 3, ws), off = tens(ends, I32, 1, offs);
  DLTensor gw = tens(g, F16, 1, gs), out = tens(obuf, F32, 2, os);
  qqQqmmParams_t p;
  qqQqmmParamsInit(&p, QQ_MODE_NVFP4);
  return expect(qqGroupedQqmm(NULL, &x, NULL, &off, &w, NULL, &p, NULL, &gw, &out, NULL),
                ST(QQ_STATUS_INVALID_DTYPE), "global_scale_w");
}

static int t_qqmm_batched_0d_x_scales(void) {
  /* a 0-d x_scales beside a batched w: SubTensor read strides[0] of it (ASan: heap overflow) */
  static uint8_t sc[1];
  int64_t xs[2] = {2, 32}, ws[3] = {2, 4, 32}, os[3] = {2, 2, 4}, zero_strides[1] = {1};
  DLTensor x = tens(xbuf, F32, 2, xs), w = tens(wbuf, F32, 3, ws), out = tens(obuf, F32, 3, os);
  DLTensor xsc = tens(sc, U8, 0, NULL);
  xsc.strides = zero_strides;  /* non-NULL strides on a 0-d tensor: nothing to read */
  qqQqmmParams_t p;
  qqQqmmParamsInit(&p, QQ_MODE_MXFP8);
  return expect(qqQqmm(NULL, &x, &xsc, &w, NULL, &p, NULL, NULL, NULL, &out, NULL), ST(QQ_STATUS_INVALID_VALUE),
                "x_scales");
}

static const struct check kChecks[] = {
    {"empty_huge_extents", t_empty_huge_extents, 0},
    {"amax_empty_many_rows", t_amax_empty_many_rows, 0},
    {"swizzle_empty", t_swizzle_empty, 0},
    {"decode_layout_empty", t_decode_layout_empty, 0},
    {"grouped_no_experts_validates", t_grouped_no_experts_validates, 0},
    {"grouped_global_scale_dtype", t_grouped_global_scale_dtype, 0},
    {"qqmm_batched_0d_x_scales", t_qqmm_batched_0d_x_scales, 0},
    {"moe_shapes_bound", t_moe_shapes_bound, 0},
    {"last_route_clears_message", t_last_route_clears_message, 0},
    {"qqmm_layout_enum_float_operand", t_qqmm_layout_enum_float_operand, 0},
    {"colwise_scales_without_data", t_colwise_scales_without_data, 0},
    {"swizzle_out_dtype", t_swizzle_out_dtype, 0},
    {"qdq_no_outputs", t_qdq_no_outputs, 0},
    {"qdq_valid", t_qdq_valid, 0},
    {"wgrad_valid", t_wgrad_valid, 0},
    {"wgrad_bad_offsets", t_wgrad_bad_offsets, 0},
    {"wgrad_last_not_t", t_wgrad_last_not_t, 0},
    {"wgrad_null_out", t_wgrad_null_out, 0},
    {"gather_null_indices", t_gather_null_indices, 0},
    {"gather_index_out_of_range", t_gather_index_out_of_range, 0},
    {"gather_indices_null_shape", t_gather_indices_null_shape, 0},
    {"gather_indices_float", t_gather_indices_float, 0},
    {"gather_valid", t_gather_valid, 0},
    {"valid_quantize_golden", t_valid_quantize_golden, 0},
    {"cuda_info", t_cuda_info, 0},
    {"qqmm_w3d_null_shape", t_qqmm_w3d_null_shape, 0},
    {"qqmm_w3d_x_null_shape", t_qqmm_w3d_x_null_shape, 0},
    {"qqmm_w3d_out_null_shape", t_qqmm_w3d_out_null_shape, 0},
    {"qqmm_w3d_c_null_shape", t_qqmm_w3d_c_null_shape, 0},
    {"qqmm_w3d_scales_null_shape", t_qqmm_w3d_scales_null_shape, 0},
    {"qqmm_2d_c_null_shape", t_qqmm_2d_c_null_shape, 0},
    {"qqmm_batch0_int32_w", t_qqmm_batch0_int32_w, 0},
    {"qqmm_huge_k_2p40", t_qqmm_huge_k, 1},
    {"shapes_k_2p60_nvfp4", t_shapes_k_2p60_nvfp4, 0},
    {"shapes_k_2p60_mxfp8", t_shapes_k_2p60_mxfp8, 0},
    {"quantize_numel_overflow", t_quantize_numel_overflow, 0},
    {"enum_mode_99", t_enum_mode_99, 0},
    {"enum_mode_negative", t_enum_mode_negative, 0},
    {"enum_rounding_7", t_enum_rounding_7, 0},
    {"enum_scale_layout_5", t_enum_scale_layout_5, 0},
    {"enum_fp8_format_3", t_enum_fp8_format_3, 0},
    {"enum_qqmm_mode_99", t_enum_qqmm_mode_99, 0},
    {"enum_moe_scaling_9", t_enum_moe_scaling_9, 0},
    {"cuda_device_minus1", t_cuda_device_minus1, 0},
    {"cuda_device_minus1_mixed_cpu", t_cuda_device_minus1_mixed_cpu, 0},
    {"misaligned_f32_x", t_misaligned_f32_x, 0},
    {"misaligned_bf16_x", t_misaligned_bf16_x, 0},
    {"misaligned_global_scale", t_misaligned_global_scale, 0},
    {"misaligned_amax_out", t_misaligned_amax_out, 0},
    {"params_init_null", t_params_init_null, 0},
    {"quantize_null_params", t_quantize_null_params, 0},
    {"quantize_short_struct", t_quantize_short_struct, 0},
    {"shapes_null_params", t_shapes_null_params, 0},
    {"quantize_null_data", t_quantize_null_data, 0},
    {"qqmm_null_params", t_qqmm_null_params, 0},
    {"qqmm_short_struct", t_qqmm_short_struct, 0},
    {"qqmm_null_out", t_qqmm_null_out, 0},
    {"qqmm_w3d_null_out", t_qqmm_w3d_null_out, 0},
    {"amax_null_out", t_amax_null_out, 0},
    {"last_error_empty_after_success", t_last_error_cleared, 0},
    {"decode_size_null_params", t_decode_size_null_params, 0},
    {"decode_size_affine_3bit", t_decode_size_affine_3bit, 0},
    {"decode_size_huge_n", t_decode_size_huge_n, 0},
    {"decode_affine_no_biases", t_decode_affine_no_biases, 0},
    {"decode_nvfp4_with_biases", t_decode_nvfp4_with_biases, 0},
    {"decode_affine_fp32_scales", t_decode_affine_fp32_scales, 0},
    {"decode_affine4_matches", t_decode_affine4_matches, 0},
    {"decode_affine8_matches", t_decode_affine8_matches, 0},
    {"decode_gated", t_decode_gated, 0},
};

static int is_asan_oom(const char* err) {
  return strstr(err, "AddressSanitizer: allocation-size-too-big") || strstr(err, "AddressSanitizer: out-of-memory") ||
         strstr(err, "AddressSanitizer: requested allocation size exceeds");
}

/* Runs one check in a child process; the child's stderr goes through a
 * temporary file and is copied to ours afterwards (in order). */
static int run_in_child(const struct check* c) {
  static char err[1 << 16];
  FILE* tmp = tmpfile();
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(2);
  }
  if (pid == 0) {
    if (tmp) dup2(fileno(tmp), 2);
    int ok = c->fn();
    printf("%s %s: %s\n", ok ? "ok  " : "FAIL", c->name, g_detail);
    fflush(stdout);
    _exit(ok ? 0 : CHILD_FAIL);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) {
    perror("waitpid");
    exit(2);
  }
  size_t n = 0;
  err[0] = '\0';
  if (tmp) {
    rewind(tmp);
    n = fread(err, 1, sizeof err - 1, tmp);
    err[n] = '\0';
    fclose(tmp);
    fputs(err, stderr);
    fflush(stderr);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == CHILD_FAIL) return 0;
  if (c->tolerate_asan_oom && is_asan_oom(err)) {
    printf("ok   %s: tolerated: libqq attempted the allocation and AddressSanitizer's operator new aborted (it "
           "never throws std::bad_alloc); an unsanitized build must return an error status here\n", c->name);
    return 1;
  }
  if (WIFSIGNALED(status))
    printf("FAIL %s: crashed (signal %d)\n", c->name, WTERMSIG(status));
  else
    printf("FAIL %s: the process died with exit status %d (a sanitizer report or an abort; see stderr)\n",
           c->name, WEXITSTATUS(status));
  return 0;
}

int main(void) {
  const char* nofork = getenv("QQ_TEST_NOFORK");
  const char* only = getenv("QQ_TEST_ONLY");
  int passed = 0, failed = 0;
  printf("libqq %d (%s)\n", qqGetVersion(), qqGetBuildInfo());
  for (size_t i = 0; i < sizeof kChecks / sizeof kChecks[0]; ++i) {
    const struct check* c = &kChecks[i];
    if (only && *only && !strstr(c->name, only)) continue;
    int ok;
    if (nofork && *nofork && strcmp(nofork, "0") != 0) {
      ok = c->fn();
      printf("%s %s: %s\n", ok ? "ok  " : "FAIL", c->name, g_detail);
    } else {
      ok = run_in_child(c);
    }
    if (ok)
      ++passed;
    else
      ++failed;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
