# cython: language_level=3
#
# The C ABI of libqq (libqq/include/qq/qq.h), as qq._qq calls it. Declarations only:
# the header is the source of truth; keep this file a faithful subset of it.

from libc.stdint cimport int64_t

from ._dlpack cimport DLTensor


cdef extern from "qq/qq.h" nogil:
    int QQ_VERSION
    int QQ_VERSION_MAJOR
    int QQ_VERSION_MINOR
    int QQ_VERSION_PATCH

    ctypedef enum qqStatus_t:
        QQ_STATUS_SUCCESS
        QQ_STATUS_INVALID_VALUE
        QQ_STATUS_INVALID_DTYPE
        QQ_STATUS_NOT_SUPPORTED
        QQ_STATUS_ARCH_MISMATCH
        QQ_STATUS_ALLOC_FAILED
        QQ_STATUS_CUDA_ERROR
        QQ_STATUS_CUBLAS_ERROR
        QQ_STATUS_INTERNAL_ERROR

    const char* qqGetStatusString(qqStatus_t status)
    const char* qqGetLastErrorMessage()
    int qqGetVersion()
    const char* qqGetBuildInfo()
    int qqGetDeviceCount()
    qqStatus_t qqGetDeviceCapability(int device, int* major, int* minor)
    ctypedef enum qqDeviceFeature_t:
        QQ_DEVICE_FEATURE_BLOCKSCALED
    qqStatus_t qqGetDeviceFeature(int device, qqDeviceFeature_t feature, int* has)

    # Opaque in C (a pointer to an incomplete struct); this binding only ever passes NULL
    # (libqq's default handle per device), so its pointee needs no declaration.
    ctypedef void* qqHandle_t

    ctypedef enum qqMode_t:
        QQ_MODE_AFFINE
        QQ_MODE_NVFP4
        QQ_MODE_MXFP4
        QQ_MODE_MXFP8

    ctypedef enum qqRounding_t:
        QQ_ROUNDING_CEIL
        QQ_ROUNDING_FLOOR

    ctypedef enum qqScaleLayout_t:
        QQ_SCALE_LINEAR
        QQ_SCALE_BLOCKED

    ctypedef enum qqFp8Format_t:
        QQ_FP8_E4M3
        QQ_FP8_E5M2

    ctypedef struct qqQuantParams_t:
        size_t struct_size
        qqMode_t mode
        int group_size
        int bits
        qqRounding_t rounding
        qqScaleLayout_t scale_layout
        qqFp8Format_t fp8_format

    qqStatus_t qqQuantParamsInit(qqQuantParams_t* params, qqMode_t mode)
    qqStatus_t qqQuantizedShapes(const qqQuantParams_t* params, int x_ndim,
                                 const int64_t* x_shape, int64_t* data_shape,
                                 int64_t* scales_shape, int* scales_ndim)

    qqStatus_t qqQuantize(qqHandle_t handle, const DLTensor* x,
                          const qqQuantParams_t* params,
                          const DLTensor* global_scale, DLTensor* data,
                          DLTensor* scales, DLTensor* biases, void* stream)

    qqStatus_t qqQuantizeDequantize(qqHandle_t handle, const DLTensor* x,
                                    const qqQuantParams_t* params,
                                    const DLTensor* global_scale, DLTensor* out,
                                    DLTensor* out_t, void* stream) nogil
    qqStatus_t qqQuantizeDequantizeMoe(qqHandle_t handle, const DLTensor* w,
                                       const qqQuantParams_t* params, DLTensor* out,
                                       DLTensor* out_t, void* stream) nogil
    qqStatus_t qqQuantizeColwise(qqHandle_t handle, const DLTensor* x,
                                 const qqQuantParams_t* params,
                                 const DLTensor* global_scale, DLTensor* data_t,
                                 DLTensor* scales_t, DLTensor* biases_t, DLTensor* data,
                                 DLTensor* scales, DLTensor* biases, void* stream)

    ctypedef enum qqMoeScaling_t:
        QQ_MOE_32X1
        QQ_MOE_32X32

    qqStatus_t qqQuantizeMoe(qqHandle_t handle, const DLTensor* x,
                             const qqQuantParams_t* params, qqMoeScaling_t scaling,
                             DLTensor* data, DLTensor* scales, void* stream)
    qqStatus_t qqQuantizeMoeShapes(const qqQuantParams_t* params, qqMoeScaling_t scaling,
                                   const int64_t* w_shape, int64_t* scales_shape)

    qqStatus_t qqDequantize(qqHandle_t handle, const DLTensor* data,
                            const DLTensor* scales, const DLTensor* biases,
                            const qqQuantParams_t* params,
                            const DLTensor* global_scale, DLTensor* out,
                            void* stream)

    qqStatus_t qqSwizzleScales(qqHandle_t handle, const DLTensor* linear,
                               DLTensor* blocked, void* stream)
    qqStatus_t qqUnswizzleScales(qqHandle_t handle, const DLTensor* blocked,
                                 DLTensor* linear, void* stream)

    qqStatus_t qqAmax(qqHandle_t handle, const DLTensor* x, DLTensor* out,
                      void* stream)
    qqStatus_t qqSwiglu(qqHandle_t handle, const DLTensor* x, DLTensor* out,
                        void* stream)

    ctypedef enum qqRoute_t:
        QQ_ROUTE_AUTO
        QQ_ROUTE_CPU
        QQ_ROUTE_EXACT
        QQ_ROUTE_BLOCKSCALED
        QQ_ROUTE_QMMA
        QQ_ROUTE_QMV
        QQ_ROUTE_DECODE

    qqStatus_t qqGetLastRoute(qqRoute_t* route)
    const char* qqGetRouteString(qqRoute_t route)

    ctypedef struct qqQqmmParams_t:
        size_t struct_size
        qqQuantParams_t quant
        qqScaleLayout_t x_scale_layout
        qqScaleLayout_t w_scale_layout
        int w_prepared
        const DLTensor* c
        float beta
        qqRoute_t route
        const DLTensor* w_values
        int x_prepared

    qqStatus_t qqQqmmParamsInit(qqQqmmParams_t* params, qqMode_t mode)

    qqStatus_t qqQqmm(qqHandle_t handle, const DLTensor* x,
                      const DLTensor* x_scales, const DLTensor* w,
                      const DLTensor* w_scales, const qqQqmmParams_t* params,
                      const DLTensor* global_scale_x,
                      const DLTensor* global_scale_w, const DLTensor* bias,
                      DLTensor* out, void* stream)

    qqStatus_t qqGroupedQqmm(qqHandle_t handle, const DLTensor* x,
                             const DLTensor* x_scales, const DLTensor* offsets,
                             const DLTensor* w, const DLTensor* w_scales,
                             const qqQqmmParams_t* params,
                             const DLTensor* global_scale_x,
                             const DLTensor* global_scale_w, DLTensor* out, void* stream)
    qqStatus_t qqGroupedQqmmWgrad(qqHandle_t handle, const DLTensor* x, const DLTensor* dy,
                                  const DLTensor* offsets, const qqQuantParams_t* params,
                                  const DLTensor* global_scale_x, const DLTensor* global_scale_dy,
                                  DLTensor* out, void* stream)

    qqStatus_t qqQuantizedMatmul(qqHandle_t handle, const DLTensor* x,
                                 const DLTensor* w, const DLTensor* scales,
                                 const DLTensor* biases,
                                 const qqQuantParams_t* params, int transpose,
                                 const DLTensor* global_scale,
                                 const DLTensor* bias, DLTensor* out,
                                 void* stream)

    qqStatus_t qqDecodeLayoutSize(const qqQuantParams_t* params, int64_t n, int64_t k, int64_t* bytes)
    qqStatus_t qqToDecodeLayout(qqHandle_t handle, const DLTensor* w, const DLTensor* scales,
                                const DLTensor* biases, const qqQuantParams_t* params, DLTensor* out,
                                void* stream)
    qqStatus_t qqDecodeMatmul(qqHandle_t handle, const DLTensor* x, const DLTensor* w_decode,
                              const qqQuantParams_t* params, const DLTensor* global_scale,
                              const DLTensor* bias, DLTensor* out, void* stream)
    qqStatus_t qqToDecodeLayoutGated(qqHandle_t handle, const DLTensor* w, const DLTensor* scales,
                                     const DLTensor* biases, const qqQuantParams_t* params, DLTensor* out,
                                     void* stream)
    qqStatus_t qqDecodeGatedMatmul(qqHandle_t handle, const DLTensor* x, const DLTensor* w_decode,
                                   const qqQuantParams_t* params, const DLTensor* global_scale,
                                   const DLTensor* bias, int swiglu, DLTensor* out, void* stream)

    qqStatus_t qqDecodeGatherQmm(qqHandle_t handle, const DLTensor* x, const DLTensor* w_decode,
                                 const DLTensor* rhs_indices, const qqQuantParams_t* params,
                                 const DLTensor* global_scale, const DLTensor* bias, DLTensor* out,
                                 void* stream)

    qqStatus_t qqGatherQmm(qqHandle_t handle, const DLTensor* x,
                           const DLTensor* w, const DLTensor* scales,
                           const DLTensor* biases, const DLTensor* rhs_indices,
                           const qqQuantParams_t* params, int transpose,
                           const DLTensor* global_scale,
                           const DLTensor* bias, DLTensor* out,
                           void* stream)

    qqStatus_t qqDeviceAlloc(int device, size_t bytes, void** ptr, void* stream)
    qqStatus_t qqDeviceFree(int device, void* ptr, void* stream)
    qqStatus_t qqStreamSynchronize(int device, void* stream)

    ctypedef struct qqCudaInfo_t:
        size_t struct_size
        int cuda_built
        int device_count
        const char* device_note
        int driver_version
        int runtime_version
        int cublaslt_loaded
        size_t cublaslt_version
        const char* cublaslt_path
        const char* cublaslt_note

    qqStatus_t qqGetCudaInfo(qqCudaInfo_t* info)
