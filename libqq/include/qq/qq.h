/*
 * qq.h - the one public header of libqq.
 *
 * libqq: block-scaled low-precision matrix math (NVFP4, MXFP4, MXFP8, affine
 * integer) with a C ABI. Formats and numerics: docs/formats.md; errors and
 * limits: docs/errors.md. Every function:
 *   - returns a qqStatus_t (QQ_STATUS_SUCCESS == 0); on failure a readable
 *     message naming the argument and the fix is kept per thread and returned
 *     by qqGetLastErrorMessage();
 *   - takes tensors as DLPack DLTensor (declared below from the DLPack spec
 *     unless dlpack.h was included first). kDLCPU tensors run on the CPU
 *     backend, kDLCUDA tensors on the GPU backend; mixing devices in one call
 *     is QQ_STATUS_INVALID_VALUE;
 *   - takes the stream last (a cudaStream_t cast to void*; 0 = legacy default
 *     stream; ignored for CPU tensors). GPU work is only ever enqueued on it.
 *
 * Status codes are never renumbered; new ones are appended.
 * Option structs carry their size in their first field so they can grow
 * without breaking the ABI: always initialize them with the *Init function.
 */
#ifndef QQ_QQ_H_
#define QQ_QQ_H_

#include <stddef.h>
#include <stdint.h>

#define QQ_VERSION_MAJOR 0
#define QQ_VERSION_MINOR 1
#define QQ_VERSION_PATCH 0
/* QQ_VERSION = major * 10000 + minor * 100 + patch, as returned by qqGetVersion(). */
#define QQ_VERSION (QQ_VERSION_MAJOR * 10000 + QQ_VERSION_MINOR * 100 + QQ_VERSION_PATCH)

#if defined(_WIN32)
#define QQ_API __declspec(dllexport)
#else
#define QQ_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * DLPack (https://dmlc.github.io/dlpack/latest/c_api.html), the subset libqq
 * reads. Declared here so that qq.h is self-contained; if the user includes
 * dlpack.h first, its (identical) definitions are used instead.
 * ------------------------------------------------------------------------- */
#ifndef DLPACK_MAJOR_VERSION
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLCUDAManaged = 13,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;          /* start of the allocation; add byte_offset */
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;    /* in elements; NULL = compact row-major */
  uint64_t byte_offset;
} DLTensor;
#endif /* DLPACK_MAJOR_VERSION */

/* ---------------------------------------------------------------------------
 * Status, errors, version
 * ------------------------------------------------------------------------- */
typedef enum {
  QQ_STATUS_SUCCESS = 0,
  QQ_STATUS_INVALID_VALUE = 1,  /* bad shape, stride, size, mode, group, layout, device mix */
  QQ_STATUS_INVALID_DTYPE = 2,  /* a tensor has a dtype the operation does not take */
  QQ_STATUS_NOT_SUPPORTED = 3,  /* valid request this build or backend cannot run */
  QQ_STATUS_ARCH_MISMATCH = 4,  /* the GPU's architecture lacks what the path needs */
  QQ_STATUS_ALLOC_FAILED = 5,   /* host or device allocation failed */
  QQ_STATUS_CUDA_ERROR = 6,     /* a CUDA runtime call failed (message has the CUDA error) */
  QQ_STATUS_CUBLAS_ERROR = 7,   /* a cuBLASLt call failed (message has its status) */
  QQ_STATUS_INTERNAL_ERROR = 8, /* a bug in libqq: please report it */
} qqStatus_t;

/* Static English name of a status ("QQ_STATUS_INVALID_VALUE"). Never NULL. */
QQ_API const char* qqGetStatusString(qqStatus_t status);

/* The message of the last failing call on this thread ("" if none). The
 * pointer stays valid until the next libqq call on the same thread. */
QQ_API const char* qqGetLastErrorMessage(void);

/* QQ_VERSION of the library actually loaded. */
QQ_API int qqGetVersion(void);

/* Build description, a static string of "key=value" pairs separated by ';':
 * version, cuda (ON/OFF), cuda_version, archs (e.g. "90a;100a;120a" joined by
 * ','), cublaslt (cuBLASLt version at build time, 0 if none). */
QQ_API const char* qqGetBuildInfo(void);

/* Number of CUDA devices visible (0 in a CPU-only build or without a driver;
 * never an error). */
QQ_API int qqGetDeviceCount(void);

/* Compute capability of a device, e.g. 9.0 -> major 9, minor 0.
 * QQ_STATUS_NOT_SUPPORTED in a CPU-only build; INVALID_VALUE for a bad id. */
QQ_API qqStatus_t qqGetDeviceCapability(int device, int* major, int* minor);

/* Device features libqq's dispatch depends on, answered as libqq decides them
 * (a caller keeps no table of its own). (0.2) */
typedef enum {
  QQ_DEVICE_FEATURE_BLOCKSCALED = 1, /* block-scaled fp4/fp8 tensor cores through cuBLASLt
                                        (compute capability 10.x, 11.0, 12.x): qqmm's
                                        blockscaled route reads packed operands, so a
                                        prepared weight needs no bf16 values there */
} qqDeviceFeature_t;

/* *has = 1 when `device` has `feature`, else 0. NOT_SUPPORTED in a CPU-only
 * build; INVALID_VALUE for a bad device id, an unknown feature or has == NULL. */
QQ_API qqStatus_t qqGetDeviceFeature(int device, qqDeviceFeature_t feature, int* has);

/* ---------------------------------------------------------------------------
 * Handle: one per CUDA device. Holds the cuBLASLt handle, the GEMM plan cache
 * and the workspace. Thread-safe: calls from several threads through one
 * handle are serialized where they share state (plan cache, workspace).
 * Every operation also accepts handle == NULL: libqq then uses an internal
 * default handle for the tensors' device, created on first use and kept for
 * the life of the process. CPU tensors need no handle.
 * ------------------------------------------------------------------------- */
typedef struct qqContext* qqHandle_t;

/* Create a handle bound to CUDA device `device` (>= 0).
 * Returns NOT_SUPPORTED in a CPU-only build, INVALID_VALUE for a bad device.
 * May be called while a stream is captured into a CUDA graph (so may the first
 * op that makes a default handle): the handle is made in relaxed capture mode,
 * no part of the graph, and the capture stays valid. */
QQ_API qqStatus_t qqCreate(qqHandle_t* handle, int device);
/* Destroy a handle (NULL is accepted). The caller must make sure no work
 * that uses it is still queued. Not during a capture: destroying the cuBLASLt
 * handle synchronizes the device. */
QQ_API qqStatus_t qqDestroy(qqHandle_t handle);

/* ---------------------------------------------------------------------------
 * Quantization parameters
 * ------------------------------------------------------------------------- */
typedef enum {
  QQ_MODE_AFFINE = 0, /* unsigned int of `bits` bits, scale and bias in x's dtype */
  QQ_MODE_NVFP4 = 1,  /* E2M1, group 16, E4M3 scale, optional fp32 global scale */
  QQ_MODE_MXFP4 = 2,  /* E2M1, group 32, UE8M0 scale */
  QQ_MODE_MXFP8 = 3,  /* E4M3FN (or E5M2), group 32, UE8M0 scale */
} qqMode_t;

typedef enum {
  QQ_ROUNDING_CEIL = 0,  /* UE8M0 scale = smallest power of two >= amax/elem_max (default) */
  QQ_ROUNDING_FLOOR = 1, /* OCP MX v1.0: 2^(floor(log2 amax) - emax_elem) */
} qqRounding_t;

typedef enum {
  QQ_SCALE_LINEAR = 0,  /* [..., K/group] row-major */
  QQ_SCALE_BLOCKED = 1, /* cuBLASLt 1D block-scaling layout, see docs/formats.md */
} qqScaleLayout_t;

typedef enum {
  QQ_FP8_E4M3 = 0, /* E4M3FN, max 448 (default) */
  QQ_FP8_E5M2 = 1, /* E5M2, max 57344 */
} qqFp8Format_t;

typedef struct {
  size_t struct_size;           /* sizeof(qqQuantParams_t), set by qqQuantParamsInit */
  qqMode_t mode;
  int group_size;               /* 0 = the mode's default (affine 64, nvfp4 16, mx 32) */
  int bits;                     /* 0 = the mode's default (affine 4, fp4 4, fp8 8) */
  qqRounding_t rounding;        /* UE8M0 modes only; default CEIL */
  qqScaleLayout_t scale_layout; /* default LINEAR; BLOCKED for fp modes only */
  qqFp8Format_t fp8_format;     /* mxfp8 only; default E4M3 */
} qqQuantParams_t;

/* Fill *params with the defaults of `mode`. */
QQ_API qqStatus_t qqQuantParamsInit(qqQuantParams_t* params, qqMode_t mode);

/* Shapes of quantize's outputs for an input of shape x_shape[0..x_ndim).
 * data_shape gets x_ndim entries (last one K * bits / 8, bytes).
 * scales_shape gets *scales_ndim entries (at most x_ndim + 1):
 *   linear:  [..., K / group]
 *   blocked: [B..., roundup(M, 128), roundup(K / group, 4)] where x is
 *            [B..., M, K] (a 1D x counts as M = 1).
 * Affine biases have the linear scales' shape. */
QQ_API qqStatus_t qqQuantizedShapes(const qqQuantParams_t* params, int x_ndim,
                                    const int64_t* x_shape, int64_t* data_shape,
                                    int64_t* scales_shape, int* scales_ndim);

/* ---------------------------------------------------------------------------
 * Operations. Common rules:
 *  - float tensors: float32, float16 or bfloat16. Packed data: uint8 (int8
 *    and 1-byte float8 dtypes are read as bytes). fp scales: uint8 or a
 *    1-byte float8 dtype (read as bytes). Affine scales/biases: x's dtype.
 *  - The last axis must have stride 1; the leading axes must collapse to one
 *    row stride (a row-strided 2D view is fine, a transposed one is not).
 *  - Outputs must be compact row-major.
 *  - global_scale (nvfp4 only): a float32 tensor of one element on the same
 *    device, read on the device (no host synchronization); NULL = none.
 * ------------------------------------------------------------------------- */

/* Quantize x [..., K] along its last axis.
 * data:   uint8, shape per qqQuantizedShapes.
 * scales: uint8 (fp modes) or x's dtype (affine), shape per qqQuantizedShapes.
 * biases: affine only (x's dtype, scales' linear shape); must be NULL otherwise.
 * Errors: INVALID_DTYPE, INVALID_VALUE (K % group != 0, shapes, strides,
 * a global scale outside nvfp4, blocked scales for affine, ...). */
QQ_API qqStatus_t qqQuantize(qqHandle_t handle, const DLTensor* x,
                             const qqQuantParams_t* params,
                             const DLTensor* global_scale, DLTensor* data,
                             DLTensor* scales, DLTensor* biases, void* stream);

/* Quantize x [..., M, K] along its second-to-last axis (groups of `group`
 * consecutive rows of each column: the operand a backward-pass GEMM needs),
 * without materializing a transposed copy. The result is exactly
 * qqQuantize of x^T [..., K, M]:
 *   data_t   uint8 [..., K, M*bits/8]
 *   scales_t per qqQuantizedShapes of [..., K, M] (linear [..., K, M/group],
 *            or blocked [..., roundup(K,128), roundup(M/group,4)])
 *   biases_t affine only.
 * If `data` is not NULL, x is also quantized along its last axis into
 * data/scales/biases (as qqQuantize would) in the same call (on the GPU from one
 * read of x except for affine and for nvfp4 / mxfp4 from 16-bit x, which take
 * two passes: docs/api.md); scales or biases without data are
 * refused (QQ_STATUS_INVALID_VALUE).
 * M must be a multiple of the group (and K too when data is given). */
QQ_API qqStatus_t qqQuantizeColwise(qqHandle_t handle, const DLTensor* x,
                                    const qqQuantParams_t* params,
                                    const DLTensor* global_scale,
                                    DLTensor* data_t, DLTensor* scales_t,
                                    DLTensor* biases_t, DLTensor* data,
                                    DLTensor* scales, DLTensor* biases,
                                    void* stream);

/* MoE expert weights: MXFP8 quantization of w [E, D1, D2] (row-major, or the
 * transposed view with stride 1 on dim 1, e.g. w.transpose(-2, -1) of an
 * [E, D2, D1] tensor) along D1, with one scale per 32 consecutive D1
 * elements at each D2 index (QQ_MOE_32X1) or one per 32x32 tile
 * (QQ_MOE_32X32, so the same quantization serves the forward and the
 * transposed backward GEMM). D1 and D2 must be multiples of 32; params->mode
 * must be QQ_MODE_MXFP8 (rounding ceil/floor, e4m3/e5m2).
 *   data   uint8 [E, D1, D2] column-major per expert: strides (D1*D2, 1, D1)
 *   scales linear: [E, D1/32, D2] (32x1) or [E, D1/32, D2/32] (32x32);
 *          blocked (params->scale_layout): [E, roundup(D2,128), roundup(D1/32,4)],
 *          the blocked matrix of logical shape (D2, D1/32) per expert, the
 *          32x32 scale replicated over its 32 rows; padding zero. */
typedef enum { QQ_MOE_32X1 = 0, QQ_MOE_32X32 = 1 } qqMoeScaling_t;

QQ_API qqStatus_t qqQuantizeMoe(qqHandle_t handle, const DLTensor* w,
                                const qqQuantParams_t* params,
                                qqMoeScaling_t scaling, DLTensor* data,
                                DLTensor* scales, void* stream);

/* The scales shape qqQuantizeMoe takes for w of shape w_shape[0..3) = [E, D1,
 * D2] (data has w's shape): scales_shape gets 3 entries. Checks the
 * parameters and the shape as qqQuantizeMoe does. (0.2) */
QQ_API qqStatus_t qqQuantizeMoeShapes(const qqQuantParams_t* params,
                                      qqMoeScaling_t scaling,
                                      const int64_t* w_shape,
                                      int64_t* scales_shape);

/* Dequantize data [..., K*bits/8] with its scales (and biases for affine)
 * into out [..., K] (float32, float16 or bfloat16; all math in fp32, one
 * rounding to out's dtype at the end). For BLOCKED scales the rows are
 * data's second-to-last axis (or 1 for 1D data). */
QQ_API qqStatus_t qqDequantize(qqHandle_t handle, const DLTensor* data,
                               const DLTensor* scales, const DLTensor* biases,
                               const qqQuantParams_t* params,
                               const DLTensor* global_scale, DLTensor* out,
                               void* stream);

/* Quantize and dequantize in one pass: q(x)'s values in bfloat16, as the
 * exact path's GEMM reads them (a training step's operands, fake
 * quantization). The values leave out nvfp4's global scale, as a prepared
 * operand of qqQqmm does (qqQqmmParams_t.x_prepared / w_prepared): there they
 * are exact in bfloat16 (docs/formats.md's range caveat aside) and the
 * global scale goes into qqQqmm's alpha. (0.2)
 *  x:     float [M, K].
 *  out:   bfloat16 [M, K], compact: x quantized along K (qqQuantize's blocks;
 *         K a multiple of the group), or NULL.
 *  out_t: bfloat16 [M, K], compact: x quantized along M (qqQuantizeColwise's
 *         blocks: `group` consecutive rows of each column from row 0, a ragged
 *         last block counting its missing rows as zeros), written in x's own
 *         orientation, or NULL.
 *  At least one of the two; on the GPU both come from one read of x for
 *  the fp8 elements (MXFP8) when x's rows are 8-byte aligned, two passes
 *  otherwise. CUDA outputs must start on a 16-byte boundary.
 *  params: mode nvfp4, mxfp4 or mxfp8, rounding, fp8_format; group_size and
 *  bits the mode's; scale_layout is ignored (no scales are written).
 *  global_scale: nvfp4 only, as qqQuantize's. */
QQ_API qqStatus_t qqQuantizeDequantize(qqHandle_t handle, const DLTensor* x,
                                       const qqQuantParams_t* params,
                                       const DLTensor* global_scale,
                                       DLTensor* out, DLTensor* out_t,
                                       void* stream);

/* MoE (or dense) weights as q's bfloat16 values, MXFP8 with one UE8M0 scale
 * per 32x32 tile (qqQuantizeMoe's QQ_MOE_32X32 rule: the values equal
 * dequantize of its codes, without a global scale): w float [E, D1, D2] or
 * [D1, D2], row-major (stride 1 on the last axis), D1 and D2 multiples of 32.
 *  out:   bfloat16 of w's shape, compact, or NULL.
 *  out_t: bfloat16 [E, D2, D1] ([D2, D1]), compact: the same values transposed
 *         (the tiles make one quantization serve both GEMM directions), or NULL.
 *  At least one; both from one read of w on the GPU (CUDA outputs must start
 *  on a 16-byte boundary). params: mode MXFP8,
 *  rounding, fp8_format; scale_layout ignored. (0.2) */
QQ_API qqStatus_t qqQuantizeDequantizeMoe(qqHandle_t handle, const DLTensor* w,
                                          const qqQuantParams_t* params,
                                          DLTensor* out, DLTensor* out_t,
                                          void* stream);

/* Convert linear scales [B..., R, C] (uint8) to the blocked layout
 * [B..., roundup(R,128), roundup(C,4)] (zero padding) and back. A 1D input
 * counts as R = 1. unswizzle reads R and C from `linear`'s shape. */
QQ_API qqStatus_t qqSwizzleScales(qqHandle_t handle, const DLTensor* linear,
                                  DLTensor* blocked, void* stream);
QQ_API qqStatus_t qqUnswizzleScales(qqHandle_t handle, const DLTensor* blocked,
                                    DLTensor* linear, void* stream);

/* out (float32, one element) = max |x| over all of x. NaN anywhere gives
 * NaN; +-Inf gives Inf. An empty x gives 0. */
QQ_API qqStatus_t qqAmax(qqHandle_t handle, const DLTensor* x, DLTensor* out,
                         void* stream);

/* The SwiGLU activation between a gated MLP's two matmuls (what vLLM calls
 * silu_and_mul): x [..., 2F] holds the gate in its first F columns and the up
 * projection in its last F; out [..., F] (compact, x's dtype: float32, float16
 * or bfloat16) = silu(g) * u with silu(g) = g / (1 + exp(-g)), computed in
 * float32 and rounded to the dtype once (torch's silu(g) * u rounds twice).
 * NaN gives NaN, as does a gate of -Inf (torch's rule). On compute capability
 * 9.0+ the kernel is launched for programmatic dependent launch; for one row
 * the next kernel may start its own prologue (a decode-layout matmul
 * prefetches its weights) while this one runs. docs/api.md, swiglu. */
QQ_API qqStatus_t qqSwiglu(qqHandle_t handle, const DLTensor* x, DLTensor* out,
                           void* stream);

/* ---------------------------------------------------------------------------
 * Routes: which implementation computed a product. qqGetLastRoute says which
 * one the last qqQqmm / qqQuantizedMatmul call on this thread took (for a
 * batched w or qqGroupedQqmm: the last product it ran). The GPU routes and
 * when AUTO takes each are listed in docs/api.md ("Dispatch"); a Blackwell
 * user confirms the block-scaled one with docs/blackwell.md.
 * ------------------------------------------------------------------------- */
typedef enum {
  QQ_ROUTE_AUTO = 0,        /* request: libqq picks. Query: no product recorded yet */
  QQ_ROUTE_CPU = 1,         /* the CPU backend (CPU tensors) */
  QQ_ROUTE_EXACT = 2,       /* bf16 values of q(x), q(w) (exact) + cuBLASLt bf16 GEMM, fp32
                               accumulation; quantized_matmul: dequantize w + cuBLASLt GEMM */
  QQ_ROUTE_BLOCKSCALED = 3, /* cuBLASLt block-scaled fp4/fp8 GEMM (compute capability 10.x,
                               11.0, 12.x; nvfp4 and mxfp8-e4m3 only) */
  QQ_ROUTE_QMMA = 4,        /* weight-only tensor-core kernel on q(x) in bf16 (M <= 64, packed w) */
  QQ_ROUTE_QMV = 5,         /* weight-only CUDA-core kernel (M <= 4, packed w) */
  QQ_ROUTE_DECODE = 6,      /* weight-only kernel on the decode layout (qqDecodeMatmul; reported only,
                               not a route a call can request) */
} qqRoute_t;

/* The route of the last qqQqmm / qqQuantizedMatmul call on this thread that
 * computed a product; QQ_ROUTE_AUTO if none did (no call yet, the last one
 * failed, or its output was empty). Each such call resets it first.
 * INVALID_VALUE if route is NULL. */
QQ_API qqStatus_t qqGetLastRoute(qqRoute_t* route);

/* Static lowercase name of a route: "auto", "cpu", "exact", "blockscaled",
 * "qmma", "qmv" (the strings qq.qqmm's route= takes), "decode"; "unknown"
 * otherwise. */
QQ_API const char* qqGetRouteString(qqRoute_t route);

/* qqmm: out [..., M, N] = alpha * q(x) @ q(w)^T (+ bias[N]) (+ beta * C).
 *  x: float [..., M, K] (quantized on the fly with params) or packed uint8
 *     [..., M, K*bits/8] with x_scales in params->x_scale_layout.
 *  w: float [N, K] (quantized on the fly) or packed [N, K*bits/8] with
 *     w_scales in params->w_scale_layout (a batched w [B, N, K] goes with x
 *     [B, M, K] or [M, K], out [B, M, N] and one scale matrix per entry); or, with params->w_prepared, a
 *     float [N, K] holding q(w)'s values already (dequantize without the
 *     global scale, e.g. in bfloat16, where they are exact): used as is, so
 *     a layer that keeps it skips w's dequantization on every call (the
 *     Hopper path's one per-call cost besides x). Its global scale, if any,
 *     still comes as global_scale_w.
 *  On-the-fly quantization uses params->quant (its scale_layout is ignored).
 *  alpha = gx * gw / 2688^2 for nvfp4 when global scales are given (either
 *  may be NULL = 2688, i.e. a factor of 1).
 *  Modes: nvfp4, mxfp4, mxfp8 (affine: INVALID_VALUE, use
 *  qqQuantizedMatmul). out: float32, float16 or bfloat16. */
typedef struct {
  size_t struct_size;             /* sizeof(qqQqmmParams_t) */
  qqQuantParams_t quant;          /* mode, group, rounding used on the fly, fp8_format */
  qqScaleLayout_t x_scale_layout; /* layout of x_scales when x is pre-quantized */
  qqScaleLayout_t w_scale_layout; /* layout of w_scales when w is pre-quantized */
  int w_prepared;                 /* 1: w holds q(w)'s values (see above); 0 by default */
  /* beta * C (qqQqmm only): C has out's shape, float32/float16/bfloat16, on
   * out's device; it may be out itself (accumulate in place). The product
   * (+ bias) is formed in fp32, then out = product + beta * C is rounded once
   * to out's dtype. C is not read when beta == 0 or c is NULL (defaults). */
  const DLTensor* c;
  float beta;
  /* Which implementation computes the product (see qqRoute_t below). AUTO
   * (the default) lets libqq pick and fall back; any other value means "this
   * route or fail": QQ_STATUS_ARCH_MISMATCH when the GPU lacks it,
   * QQ_STATUS_NOT_SUPPORTED (with the reason) when the route does not cover
   * the call (shape, mode, layout, build); never a silent fallback. */
  qqRoute_t route;
  /* Optional (0.2): q(w)'s values in float [N, K] (bfloat16 holds them exactly:
   * dequantize without the global scale) next to a packed 2-D w, as
   * qq.prepare_weight keeps them. libqq then picks the form per call: the
   * weight-only routes read the packed w at small M (it is 2-4x fewer bytes),
   * the GEMM routes use these values instead of dequantizing w on every call.
   * NULL (the default): w alone. Not with w_prepared. */
  const DLTensor* w_values;
  /* (0.2) 1: x holds q(x)'s values already (qqQuantizeDequantize's form:
   * float, without the global scale), used as is; the call takes the exact
   * route (a bf16 GEMM; QQ_STATUS_NOT_SUPPORTED for any other route
   * requested). 0 by default. A prepared x or w may be a 2-D transposed view
   * (stride 1 on its first axis, e.g. t.T of a row-major tensor): the GEMM
   * reads it transposed (bf16 values without a copy; f32 / f16 ones are
   * converted to bf16 first, as any prepared operand). */
  int x_prepared;
} qqQqmmParams_t;

QQ_API qqStatus_t qqQqmmParamsInit(qqQqmmParams_t* params, qqMode_t mode);

QQ_API qqStatus_t qqQqmm(qqHandle_t handle, const DLTensor* x,
                         const DLTensor* x_scales, const DLTensor* w,
                         const DLTensor* w_scales, const qqQqmmParams_t* params,
                         const DLTensor* global_scale_x,
                         const DLTensor* global_scale_w, const DLTensor* bias,
                         DLTensor* out, void* stream);

/* quantized_matmul (weight-only): out = x @ W^T (transpose != 0) or x @ W
 * (transpose == 0), W = dequantize(w, scales, biases[, global_scale]).
 *  x:   float [..., M, K]
 *  w:   packed uint8; transpose: [..., N, K*bits/8] (groups along K);
 *       no transpose: [..., K, N*bits/8] (groups along N, as in MLX).
 *       Batch axes of x and w broadcast (NumPy rules).
 *  scales/biases: linear [..., N, K/g] resp. [..., K, N/g] (blocked scales
 *       accepted for fp modes with transpose, one blocked matrix per batch).
 *  bias: optional float [N] added to every row (any float dtype).
 *  out:  [broadcast batch..., M, N], float32/float16/bfloat16.
 *  Accumulation in fp32. It takes no route request; qqGetLastRoute reports
 *  QQ_ROUTE_CPU, QMMA, QMV or EXACT (dequantize w, then a cuBLASLt GEMM). */
/* Grouped qqmm (mixture of experts): tokens sorted by expert.
 *  x: float [T, K] or packed [T, K*bits/8] with x_scales linear [T, K/group].
 *  offsets: int32 [E], cumulative group ends (offsets[E-1] == T; rows
 *     offsets[e-1] .. offsets[e] belong to expert e; empty groups are legal).
 *  w: float [E, N, K] or packed [E, N, K*bits/8] with w_scales [E, N, K/group]
 *     (linear) or [E, roundup(N,128), roundup(K/group,4)] (blocked, one matrix
 *     per expert; also what qqQuantizeMoe writes for its [E, D1=K, D2=N]
 *     weights, whose data read as [E, N, K] row-major).
 *     With params->w_prepared: bf16 (or f16/f32) [E, N, K] holding q(w)'s
 *     values (qq.prepare_weight), used as they are.
 *  global_scale_x: scalar; global_scale_w: float32 [E] (nvfp4, per expert)
 *     or one scalar for every expert.
 *  out [T, N] = per expert e, alpha_e * q(x_e) @ q(w_e)^T.
 *  Hopper (sm_90, built with CUTLASS's headers), bf16 out, N and K multiples
 *  of 8: the offsets are read on the device only (one grouped GEMM over every
 *  expert; no host synchronization, capturable in a CUDA graph); offsets that
 *  are not non-decreasing ends in [0, T] ending at T give an out of NaN.
 *  Blackwell (compute capability 10.x / 11.0), nvfp4 or mxfp8 (e4m3), 1 to
 *  4096 experts, 16-byte rows, cuBLASLt 13.3 (mxfp8) / 13.4 (nvfp4) loaded:
 *  the same, in one cuBLASLt grouped block-scaled GEMM (built, never run by
 *  us: docs/blackwell.md); where it refuses (docs/api.md says when), as below.
 *  Elsewhere they are read on the host: for CUDA tensors this waits for
 *  `stream` once (then a loop over experts, each a qqQqmm), and bad offsets
 *  return QQ_STATUS_INVALID_VALUE. */
QQ_API qqStatus_t qqGroupedQqmm(qqHandle_t handle, const DLTensor* x,
                                const DLTensor* x_scales, const DLTensor* offsets,
                                const DLTensor* w, const DLTensor* w_scales,
                                const qqQqmmParams_t* params,
                                const DLTensor* global_scale_x,
                                const DLTensor* global_scale_w, DLTensor* out,
                                void* stream);

/* The weight gradient of qqGroupedQqmm (mixture of experts, tokens sorted by
 * expert): out[e] = alpha * q(x_e)^T @ q(dy_e) for the rows x_e, dy_e of
 * expert e, both quantized along the tokens (fp modes: blocks of 32, nvfp4
 * 16) in blocks that start at the expert's first token, the last one
 * zero-padded; fp32 accumulation. An empty expert gives out[e] = 0.
 *  x: float [T, K]; dy: float [T, N]; offsets: int32 [E] as qqGroupedQqmm's.
 *  params: mode (nvfp4, mxfp4, mxfp8), rounding, fp8_format; group_size and
 *     bits 0 (the mode's); scale_layout LINEAR.
 *  global_scale_x, global_scale_dy: nvfp4's per-tensor global scales (float32,
 *     one element; both or neither); alpha = their factors.
 *  out: compact [E, K, N], float32, bfloat16 or float16.
 *  The offsets are read like qqGroupedQqmm's: on the device on Hopper
 *  (built with CUTLASS's headers, K and N multiples of 8, float32 or bfloat16
 *  out: a fixed number of launches, capturable; bad offsets give NaN), on
 *  Blackwell for nvfp4 / mxfp8 (e4m3), 2 to 4096 experts, 16-byte out rows
 *  (no float16 out with nvfp4) where cuBLASLt's grouped block-scaled GEMM takes
 *  the call (the same; built, never run by us: docs/blackwell.md), and for one
 *  expert on every GPU; on the host elsewhere (bad offsets:
 *  QQ_STATUS_INVALID_VALUE). */
QQ_API qqStatus_t qqGroupedQqmmWgrad(qqHandle_t handle, const DLTensor* x,
                                     const DLTensor* dy, const DLTensor* offsets,
                                     const qqQuantParams_t* params,
                                     const DLTensor* global_scale_x,
                                     const DLTensor* global_scale_dy,
                                     DLTensor* out, void* stream);

QQ_API qqStatus_t qqQuantizedMatmul(qqHandle_t handle, const DLTensor* x,
                                    const DLTensor* w, const DLTensor* scales,
                                    const DLTensor* biases,
                                    const qqQuantParams_t* params, int transpose,
                                    const DLTensor* global_scale,
                                    const DLTensor* bias, DLTensor* out,
                                    void* stream);

/* ---------------------------------------------------------------------------
 * The decode layout (docs/formats.md, "Decode layout"): nvfp4, mxfp4, mxfp8
 * (E4M3) and affine 4-bit (group 64 or 128) or 8-bit weights rearranged once
 * so that the weight-only matmul at decode shapes (M <= 64 rows of bfloat16 x (32 of float16),
 * compute capability 9.0+) reads them at close to copy bandwidth. Opaque
 * bytes; the packed layout stays the interchange form.
 * ------------------------------------------------------------------------- */
/* Bytes of the decode layout of an [n, k] weight quantized with `params` (k a
 * multiple of 256): 4-bit roundup(n, 64) / 16 * (k / 64) * 576, mxfp8
 * roundup(n, 64) / 16 * (k / 32) * 528, affine 8-bit roundup(n, 64) / 16 *
 * (k / 32) * 576. INVALID_VALUE for a mode the layout does not hold, a bad n,
 * k or NULL. */
QQ_API qqStatus_t qqDecodeLayoutSize(const qqQuantParams_t* params, int64_t n,
                                     int64_t k, int64_t* bytes);

/* w: packed uint8 [N, K*bits/8] (K a multiple of 256) or experts [E, N,
 * K*bits/8], scales in params->scale_layout (fp modes: uint8, linear [(E,) N,
 * K/group] or blocked, one matrix per expert; affine: float [(E,) N, K/group]
 * with biases of the same dtype and shape; biases NULL otherwise); params:
 * mode NVFP4, MXFP4, MXFP8 with E4M3 elements (group 0 or the mode's), or
 * AFFINE with bits 4 (group_size 64 or 128) or 8 (32, 64 or 128). out: uint8,
 * compact, E * qqDecodeLayoutSize bytes (any shape; [E, bytes] for
 * qqDecodeGatherQmm), expert e's layout at e * qqDecodeLayoutSize. nvfp4's
 * global scale is not part of the layout: pass it to qqDecodeMatmul.
 * NOT_SUPPORTED when the weight cannot be encoded (a NaN scale or mxfp8
 * element; an mx scale outside its window over non-zero codes: mxfp4 2^-20 ..
 * 2^10, mxfp8 2^-108 .. 2^16; an affine scale or bias that is not exactly a
 * bfloat16 value): keep the packed weight then. On the GPU this waits for
 * `stream` once (to learn that); not capturable in a CUDA graph: on a stream
 * being captured it returns NOT_SUPPORTED before queuing anything. */
QQ_API qqStatus_t qqToDecodeLayout(qqHandle_t handle, const DLTensor* w,
                                   const DLTensor* scales,
                                   const DLTensor* biases,
                                   const qqQuantParams_t* params, DLTensor* out,
                                   void* stream);

/* out [..., M, N] = x [..., M, K] @ W^T (* nvfp4's global factor) (+ bias[N]),
 * W [N, K] given in the decode layout w_decode (qqToDecodeLayout; N from out's
 * last axis). x: float, its rows (all leading axes) of uniform stride, stride
 * 1 along K, not overlapping (NOT_SUPPORTED otherwise: the packed weight takes
 * any x); out:
 * float32, float16 or bfloat16, compact. params: the weight's mode (and
 * fp8_format, or affine bits and group_size), as given to qqToDecodeLayout: the
 * layout carries no format tag. fp32 accumulation. On the GPU:
 * compute capability 9.0+, bfloat16 x of at most 64 rows or float16 x of at
 * most 32 (qqDecodeMatmul only), rows 16-byte aligned (NOT_SUPPORTED otherwise: use the packed weight with
 * qqQuantizedMatmul); no host synchronization, capturable (17..64 rows use
 * stream-ordered scratch for x); the same bits on every run and for every M. qqGetLastRoute: QQ_ROUTE_DECODE (GPU) or QQ_ROUTE_CPU. */
QQ_API qqStatus_t qqDecodeMatmul(qqHandle_t handle, const DLTensor* x,
                                 const DLTensor* w_decode,
                                 const qqQuantParams_t* params,
                                 const DLTensor* global_scale,
                                 const DLTensor* bias, DLTensor* out,
                                 void* stream);

/* A gate/up weight in a gated decode layout, for qqDecodeGatedMatmul: w [2F,
 * K*bits/8] (one weight: experts are INVALID_VALUE) holds the gate projection's F rows,
 * then the up projection's (F a multiple of 32), with scales and biases as for
 * qqToDecodeLayout. The layout is qqToDecodeLayout's of w with its rows
 * interleaved so that each 64-row tile t holds gate rows 32t .. 32t + 31, then up
 * rows 32t .. 32t + 31 (docs/formats.md, "Gated decode layout"); same size, same
 * refusals. The bytes carry no mark of the order: read them with qqDecodeGatedMatmul
 * only (qqDecodeMatmul would return the columns interleaved, and qqDecodeGatedMatmul
 * reads a plain layout as if gated). */
QQ_API qqStatus_t qqToDecodeLayoutGated(qqHandle_t handle, const DLTensor* w,
                                        const DLTensor* scales,
                                        const DLTensor* biases,
                                        const qqQuantParams_t* params, DLTensor* out,
                                        void* stream);

/* qqDecodeMatmul on a gated layout (qqToDecodeLayoutGated of W [2F, K]):
 * swiglu = 0: out [..., M, 2F] = x @ W^T (* nvfp4's global factor) (+ bias[2F]),
 * columns in W's row order, as qqDecodeMatmul of the plain layout gives;
 * swiglu = 1: out [..., M, F] = qqSwiglu of that product: silu(gate) * up in
 * float32, each of the product's values rounded to out's dtype first, so the
 * same bits as the product stored and then qqSwiglu, from one kernel on the GPU
 * at up to 16 rows of bf16 x (8 of float16: its epilogue has both sums of a
 * pair), past that the product in stream-ordered scratch and then the swiglu
 * kernel (faster there). x, params, global_scale and the GPU's
 * conditions (NOT_SUPPORTED) as qqDecodeMatmul. */
QQ_API qqStatus_t qqDecodeGatedMatmul(qqHandle_t handle, const DLTensor* x,
                                      const DLTensor* w_decode,
                                      const qqQuantParams_t* params,
                                      const DLTensor* global_scale,
                                      const DLTensor* bias, int swiglu,
                                      DLTensor* out, void* stream);

/* gather_qmm on experts in the decode layout: out[b..., :, :] = x[b..., :, :] @
 * W[rhs_indices[b...]]^T (* nvfp4's global factor) (+ bias[N]), as qqGatherQmm
 * (x's batch and rhs_indices' shape broadcast together; int32 indices read on
 * the device, no host synchronization, capturable; an index out of range gives
 * NaN rows on the GPU, INVALID_VALUE on the CPU). w_decode: uint8 [E, bytes],
 * qqToDecodeLayout of experts [E, N, K] (N from out's last axis). Each batch
 * entry reads its expert's layout, or, where the entries likely share experts
 * (E <= 4000, at most 16 rows per entry), a first small kernel groups them by
 * expert and each touched expert's layout is read once (two launches; stream-
 * ordered scratch from the handle's pool). GPU: as qqDecodeMatmul (bfloat16 x, M <=
 * 64, 16-byte aligned rows and batch entries; NOT_SUPPORTED otherwise; tuned
 * for M <= 16 per entry), at most 65535 entries. */
QQ_API qqStatus_t qqDecodeGatherQmm(qqHandle_t handle, const DLTensor* x,
                                    const DLTensor* w_decode,
                                    const DLTensor* rhs_indices,
                                    const qqQuantParams_t* params,
                                    const DLTensor* global_scale,
                                    const DLTensor* bias, DLTensor* out,
                                    void* stream);

/* Weight-only matmul with a weight picked per batch entry (mixture-of-experts
 * decode; MLX's gather_qmm with rhs_indices):
 *   out[b..., :, :] = x[b..., :, :] @ W[rhs_indices[b...]]^T   (transpose)
 *  x: float [..., M, K]; w: packed [E, N, K*bits/8] (transpose) or
 *     [E, K, N*bits/8], scales / biases [E, ...] as qqQuantizedMatmul's per
 *     entry; rhs_indices: int32 [...] on x's device, any strides. x's batch
 *     dims and rhs_indices' shape broadcast together (NumPy rules) into out's
 *     batch: x [T, 1, M, K] with rhs_indices [T, top_k] sends each token to
 *     its top_k experts. out: [broadcast batch..., M, N].
 *  global_scale (nvfp4): one scalar for all experts; bias [N] as above.
 *  The indices are read on the device: no host synchronization, capturable
 *  in a CUDA graph. A fixed number of launches whatever E is: with bf16 x,
 *  entries that likely share experts are first grouped by expert (a small
 *  plan kernel), then one tensor-core kernel reads each touched expert once;
 *  other x dtypes and modes take ceil(M / 4) launches of the CUDA-core kernel
 *  (docs/api.md, gather_qmm).
 *  An index outside [0, E): INVALID_VALUE on the CPU; on the GPU, which
 *  cannot stop the stream, that entry's rows of out are NaN. */
QQ_API qqStatus_t qqGatherQmm(qqHandle_t handle, const DLTensor* x,
                              const DLTensor* w, const DLTensor* scales,
                              const DLTensor* biases,
                              const DLTensor* rhs_indices,
                              const qqQuantParams_t* params, int transpose,
                              const DLTensor* global_scale,
                              const DLTensor* bias, DLTensor* out,
                              void* stream);

/* ---------------------------------------------------------------------------
 * Device memory helpers for bindings that must hand out libqq-owned buffers
 * (stream-ordered: cudaMallocAsync / cudaFreeAsync on `stream`). qqDeviceFree
 * may be called while the thread captures a CUDA graph on another stream (a
 * garbage collector's free): it frees in relaxed capture mode, outside the
 * capture, which stays valid.
 * NOT_SUPPORTED in a CPU-only build.
 * ------------------------------------------------------------------------- */
QQ_API qqStatus_t qqDeviceAlloc(int device, size_t bytes, void** ptr, void* stream);
QQ_API qqStatus_t qqDeviceFree(int device, void* ptr, void* stream);

/* Block the calling host thread until the work queued on `stream` of CUDA
 * device `device` has finished (cudaStreamSynchronize with the device
 * current). For bindings whose framework cannot wait on another's stream.
 * NOT_SUPPORTED in a CPU-only build and on a stream being captured into a
 * CUDA graph; INVALID_VALUE for a bad device. */
QQ_API qqStatus_t qqStreamSynchronize(int device, void* stream);

/* ---------------------------------------------------------------------------
 * The CUDA backend at run time: why there are no devices, and whether
 * cuBLASLt could be loaded. libqq does not link cuBLASLt: it loads
 * libcublasLt.so.<major> with dlopen the first time a handle is made (or
 * here), from a copy already in the process, libqq's RUNPATH, LD_LIBRARY_PATH
 * or the system's library path (QQ_CUBLASLT_LIBRARY, an environment variable,
 * names a file to load instead). Without it the operations that need a
 * cuBLASLt GEMM return NOT_SUPPORTED saying so; the others run on the GPU.
 *
 * Size-tagged: set struct_size = sizeof(qqCudaInfo_t) before the call; libqq
 * fills the fields that fit in struct_size (later versions add fields at the
 * end only). The strings are static: valid for the life of the process.
 * INVALID_VALUE for NULL or a struct_size smaller than this first version.
 * ------------------------------------------------------------------------- */
typedef struct {
  size_t struct_size;          /* sizeof(qqCudaInfo_t), set by the caller */
  int cuda_built;              /* 1: this libqq has the CUDA backend; 0: CPU-only build */
  int device_count;            /* as qqGetDeviceCount() */
  const char* device_note;     /* "" when device_count > 0; else why none: CPU-only build,
                                  no NVIDIA driver, no device, or the CUDA error */
  int driver_version;          /* cudaDriverGetVersion(), e.g. 13000; 0 without a driver */
  int runtime_version;         /* the CUDA runtime linked into libqq, e.g. 13000; 0 if none */
  int cublaslt_loaded;         /* 1: cuBLASLt is loaded (loads it if that was not tried yet) */
  size_t cublaslt_version;     /* cublasLtGetVersion() of the loaded library,
                                  major * 10000 + minor * 100 + patch; 0 if not loaded */
  const char* cublaslt_path;   /* the file it was loaded from ("" if not loaded) */
  const char* cublaslt_note;   /* "" when loaded; else why not and how to get it */
} qqCudaInfo_t;

QQ_API qqStatus_t qqGetCudaInfo(qqCudaInfo_t* info);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QQ_QQ_H_ */
