# cython: language_level=3
#
# DLPack declarations for qq._qq (the one DLPack module of the Python package).
#
# DLTensor and its parts come from qq/qq.h, which declares them from the DLPack spec
# (https://dmlc.github.io/dlpack/latest/c_api.html), so that the C library and this
# binding agree on one layout. qq.h does not declare the *managed* structs (the C ABI
# never transfers ownership), so they are declared here, from the same spec; they are
# plain C structs emitted into _qq.c and their layout must match the spec exactly:
#
#   DLManagedTensor          { DLTensor dl_tensor; void* manager_ctx; deleter }
#   DLManagedTensorVersioned { DLPackVersion version; void* manager_ctx; deleter;
#                              uint64_t flags; DLTensor dl_tensor }      (DLPack >= 1.0)

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "qq/qq.h" nogil:
    ctypedef enum DLDeviceType:
        kDLCPU
        kDLCUDA
        kDLCUDAHost
        kDLCUDAManaged

    ctypedef struct DLDevice:
        DLDeviceType device_type
        int32_t device_id

    ctypedef enum DLDataTypeCode:
        kDLInt
        kDLUInt
        kDLFloat
        kDLOpaqueHandle
        kDLBfloat
        kDLComplex
        kDLBool
        kDLFloat8_e3m4
        kDLFloat8_e4m3
        kDLFloat8_e4m3b11fnuz
        kDLFloat8_e4m3fn
        kDLFloat8_e4m3fnuz
        kDLFloat8_e5m2
        kDLFloat8_e5m2fnuz
        kDLFloat8_e8m0fnu
        kDLFloat6_e2m3fn
        kDLFloat6_e3m2fn
        kDLFloat4_e2m1fn

    ctypedef struct DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes

    ctypedef struct DLTensor:
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset


cdef struct DLPackVersion:
    uint32_t major
    uint32_t minor

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    # Called by whoever owns the tensor, exactly once, to hand it back to its producer.
    void (*deleter)(DLManagedTensor*) noexcept nogil

cdef struct DLManagedTensorVersioned:
    DLPackVersion version
    void* manager_ctx
    void (*deleter)(DLManagedTensorVersioned*) noexcept nogil
    uint64_t flags
    DLTensor dl_tensor


cdef enum:
    # The DLPack major version this module reads and writes; a versioned capsule of
    # another major version has an incompatible layout and is refused.
    QQ_DLPACK_MAJOR = 1
    # The newest minor version we understand (1.1 added the float8 / float4 type codes).
    QQ_DLPACK_MINOR = 1

# DLManagedTensorVersioned.flags bits (DLPack 1.0).
cdef enum:
    DLPACK_FLAG_BITMASK_READ_ONLY = 1
    DLPACK_FLAG_BITMASK_IS_COPIED = 2


# The DLPack C exchange API (DLPack >= 1.3, dlpack.h's "__dlpack_c_exchange_api__"): a
# framework's table of C functions on its tensor type, a PyCapsule named
# "dlpack_exchange_api". A consumer that launches work on the framework's current stream reads
# tensors and that stream through it with plain C calls, no Python attribute access and no
# capsule per tensor. Declared from the spec; the layout must match it exactly.
ctypedef void (*DLPackSetError)(void* error_ctx, const char* kind, const char* message) noexcept
ctypedef int (*DLPackManagedTensorAllocator)(DLTensor* prototype, DLManagedTensorVersioned** out,
                                             void* error_ctx, DLPackSetError set_error) noexcept
ctypedef int (*DLPackManagedTensorFromPyObjectNoSync)(void* py_object,
                                                      DLManagedTensorVersioned** out) noexcept
ctypedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned* tensor,
                                                    void** out_py_object) noexcept
# Fills a caller-owned DLTensor; shape and strides point into the producer's tensor (valid
# while it lives, unchanged). 0, or -1 with a Python exception set.
ctypedef int (*DLPackDLTensorFromPyObjectNoSync)(void* py_object, DLTensor* out) noexcept
ctypedef int (*DLPackCurrentWorkStream)(DLDeviceType device_type, int32_t device_id,
                                        void** out_current_stream) noexcept

cdef struct DLPackExchangeAPIHeader:
    DLPackVersion version
    DLPackExchangeAPIHeader* prev_api

cdef struct DLPackExchangeAPI:
    DLPackExchangeAPIHeader header
    DLPackManagedTensorAllocator managed_tensor_allocator
    DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync
    DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync
    DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync    # may be NULL
    DLPackCurrentWorkStream current_work_stream
