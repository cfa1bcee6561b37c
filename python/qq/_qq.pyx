# cython: language_level=3, embedsignature=True
"""qq._qq - the Cython layer between Python arrays and libqq's C ABI (qq/qq.h).

Nothing is computed here. Every public function
  1. maps its string parameters to the C enums (qqQuantParamsInit fills the defaults),
  2. opens a DLTensor *view* of every array argument (the DLPack section below),
  3. allocates the outputs in the caller's framework (the _Call section),
  4. calls libqq with the GIL released, and maps a failing qqStatus_t to an exception
     carrying qqGetLastErrorMessage(),
  5. releases every view exactly once, whatever happened.

Sections, in order: errors and library info; parameters and dtypes; DLPack (import:
_View; export: _DeviceBuffer); streams; per-call state (_Call); QuantizedArray; the
operations. The Python API is specified in docs/api.md.
"""

from cpython.buffer cimport PyBUF_STRIDES, PyBuffer_Release, PyObject_GetBuffer
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.pycapsule cimport (PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New,
                                PyCapsule_SetName)
from libc.stdint cimport int64_t, intptr_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from ._dlpack cimport (DLDataType, DLManagedTensor, DLManagedTensorVersioned, DLTensor,
                       DLPACK_FLAG_BITMASK_READ_ONLY, QQ_DLPACK_MAJOR, QQ_DLPACK_MINOR,
                       kDLBfloat, kDLBool, kDLComplex, kDLCPU, kDLCUDA, kDLCUDAHost,
                       kDLCUDAManaged, kDLFloat, kDLFloat8_e3m4, kDLFloat8_e4m3,
                       kDLFloat8_e4m3b11fnuz, kDLFloat8_e4m3fn, kDLFloat8_e4m3fnuz,
                       kDLFloat8_e5m2, kDLFloat8_e5m2fnuz, kDLFloat8_e8m0fnu, kDLInt,
                       kDLUInt)
from ._cqq cimport *

import numbers
import operator
import sys

import numpy as np


# =========================================================================================
# Errors and library information
# =========================================================================================

class QQError(RuntimeError):
    """A CUDA, cuBLASLt or internal failure inside libqq (the message is libqq's)."""


class NotSupportedError(NotImplementedError):
    """A valid request that this build, backend or GPU cannot run (yet)."""


cdef int _check(qqStatus_t status) except -1:
    """Raise the exception that docs/api.md assigns to `status`, with libqq's message.

    Must be called on the thread that made the failing call, before any other libqq call:
    the message is thread-local and overwritten by the next call.
    """
    if status == QQ_STATUS_SUCCESS:
        return 0
    cdef const char* c_msg = qqGetLastErrorMessage()
    msg = c_msg.decode("utf-8", "replace") if c_msg != NULL else ""
    if not msg:
        msg = qqGetStatusString(status).decode("ascii", "replace")
    if status == QQ_STATUS_INVALID_DTYPE:
        raise TypeError(msg)
    if status == QQ_STATUS_INVALID_VALUE:
        raise ValueError(msg)
    if status == QQ_STATUS_NOT_SUPPORTED or status == QQ_STATUS_ARCH_MISMATCH:
        raise NotSupportedError(msg)
    raise QQError(msg)


cdef str _version_string(int v):
    # QQ_VERSION = major * 10000 + minor * 100 + patch (qq.h).
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


# The version of the libqq actually loaded (not of the header we were compiled against).
__version__ = _version_string(qqGetVersion())

if qqGetVersion() // 10000 != QQ_VERSION_MAJOR:
    raise ImportError(
        f"qq._qq was compiled against libqq {_version_string(QQ_VERSION)} but loaded libqq "
        f"{__version__}: the major versions differ, so the C ABI does not match; reinstall qq")


def build_info():
    """How the loaded libqq was built: a dict with version (str), cuda (bool),
    cuda_version (str), archs (list of str) and cublaslt (int, 0 if none); any further
    keys libqq reports are kept as strings."""
    raw = qqGetBuildInfo().decode("utf-8", "replace")
    kv = {}
    for item in raw.split(";"):         # "key=value;key=value"; archs are joined by ','
        key, sep, value = item.partition("=")
        if sep:
            kv[key.strip()] = value.strip()
    info = dict(kv)
    info["version"] = kv.get("version", __version__)
    info["cuda"] = kv.get("cuda", "OFF").upper() in ("ON", "1", "TRUE", "YES")
    info["cuda_version"] = kv.get("cuda_version", "")
    info["archs"] = [a.strip() for a in kv.get("archs", "").split(",") if a.strip()]
    try:
        info["cublaslt"] = int(kv.get("cublaslt", "0") or 0)
    except ValueError:
        info["cublaslt"] = 0
    return info


def device_count():
    """Number of CUDA devices libqq sees (0 in a CPU-only build or without a driver)."""
    return qqGetDeviceCount()


def device_capability(int device=0):
    """Compute capability of CUDA device `device` as (major, minor), e.g. (9, 0)."""
    cdef int major = 0, minor = 0
    cdef qqStatus_t st
    with nogil:
        st = qqGetDeviceCapability(device, &major, &minor)
    _check(st)
    return (major, minor)


def last_route():
    """The route ('cpu', 'exact', 'blockscaled', 'qmma' or 'qmv') that the last qqmm or
    quantized_matmul call on this thread took (for a batched w or grouped_qqmm: its last
    product); None if no such call has computed a product yet, or the last one failed."""
    cdef qqRoute_t r = QQ_ROUTE_AUTO
    _check(qqGetLastRoute(&r))
    if r == QQ_ROUTE_AUTO:
        return None
    return qqGetRouteString(r).decode("ascii")


cdef extern from *:
    # Exported by libqq for the test suite only; deliberately not in qq.h (route.cpp).
    """
    #ifdef __cplusplus
    extern "C"
    #endif
    qqStatus_t qqInternalSetTestHook(const char* name, int value, int* old);
    """
    qqStatus_t qqInternalSetTestHook(const char* name, int value, int* old)


def _set_test_hook(str name, int value):
    """Tests only: set libqq's test hook `name` (route.cpp) to `value`; returns the
    previous value. "blockscaled_queries" is a counter: `value` is added."""
    cdef int old = 0
    _check(qqInternalSetTestHook(name.encode("ascii"), value, &old))
    return old


# =========================================================================================
# Parameters and dtypes
# =========================================================================================

_MODES = {"affine": QQ_MODE_AFFINE, "nvfp4": QQ_MODE_NVFP4, "mxfp4": QQ_MODE_MXFP4,
          "mxfp8": QQ_MODE_MXFP8}
_ROUNDINGS = {"ceil": QQ_ROUNDING_CEIL, "floor": QQ_ROUNDING_FLOOR}
_LAYOUTS = {"linear": QQ_SCALE_LINEAR, "blocked": QQ_SCALE_BLOCKED}
_FP8_FORMATS = {"e4m3": QQ_FP8_E4M3, "e5m2": QQ_FP8_E5M2}
# qqmm's route= (qq.h qqRoute_t; the names are qqGetRouteString's).
_ROUTES = {"auto": QQ_ROUTE_AUTO, "cpu": QQ_ROUTE_CPU, "exact": QQ_ROUTE_EXACT,
           "blockscaled": QQ_ROUTE_BLOCKSCALED, "qmma": QQ_ROUTE_QMMA, "qmv": QQ_ROUTE_QMV}

# Float dtypes libqq reads and writes; results are created in one of these or uint8.
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


cdef int _enum(str func, str arg, value, dict table) except -1:
    if not isinstance(value, str):
        raise TypeError(f"{func}: {arg}: expected a string, one of {', '.join(map(repr, table))}; "
                        f"got {type(value).__name__} {value!r}")
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{func}: {arg}: expected one of {', '.join(map(repr, table))}; "
                         f"got {value!r}") from None


cdef int _int_arg(str func, str arg, value) except? -1:
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{func}: {arg}: expected an int or None, got "
                        f"{type(value).__name__} {value!r}") from None
    if not -2**31 <= v < 2**31:
        raise ValueError(f"{func}: {arg}: {v} is out of range (see docs/api.md for the values "
                         f"each mode takes)")
    return v


# Resolved and validated parameters per (mode, group_size, bits, rounding, scale_layout,
# fp8_format): a call with parameters seen before costs one dict lookup and a copy.
cdef dict _PARAMS_CACHE = {}


cdef int _quant_params(str func, qqQuantParams_t* p, mode, group_size, bits, rounding,
                       scale_layout, fp8_format) except -1:
    """Fill *p: the mode's defaults (qqQuantParamsInit), then every explicit parameter,
    validated by libqq (so that a bad group_size or bits is named as such, not as a shape
    error of whatever array is read first).

    After this, p.group_size and p.bits hold the effective values (None -> the default),
    which is what QuantizedArray records.
    """
    key = (mode, group_size, bits, rounding, scale_layout, fp8_format)
    cdef bytes cached
    try:
        cached = _PARAMS_CACHE.get(key)
    except TypeError:               # an unhashable argument: no cache, the checks below name it
        cached = None
    if cached is not None:
        memcpy(p, <const char*>cached, sizeof(qqQuantParams_t))
        return 0
    cdef qqStatus_t st = qqQuantParamsInit(p, <qqMode_t>_enum(func, "mode", mode, _MODES))
    _check(st)
    if group_size is not None:
        p.group_size = _int_arg(func, "group_size", group_size)
        if p.group_size <= 0:
            raise ValueError(f"{func}: group_size: {p.group_size} is not a group size; pass None "
                             f"for the mode's default ({mode!r}: docs/api.md)")
    if bits is not None:
        p.bits = _int_arg(func, "bits", bits)
        if p.bits <= 0:
            raise ValueError(f"{func}: bits: {p.bits} is not a bit width; pass None for the "
                             f"mode's default ({mode!r}: docs/api.md)")
    p.rounding = <qqRounding_t>_enum(func, "rounding", rounding, _ROUNDINGS)
    p.scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", scale_layout, _LAYOUTS)
    p.fp8_format = <qqFp8Format_t>_enum(func, "fp8_format", fp8_format, _FP8_FORMATS)
    # libqq validates the combination (qqQuantizedShapes of one group's worth of x).
    cdef int64_t xs = p.group_size
    cdef int64_t ds, ss[2]
    cdef int sn = 0
    st = qqQuantizedShapes(p, 1, &xs, &ds, ss, &sn)
    if st != QQ_STATUS_SUCCESS:
        msg = qqGetLastErrorMessage().decode("utf-8", "replace").replace("quantized_shapes:", f"{func}:", 1)
        raise ValueError(msg)
    if len(_PARAMS_CACHE) < 256:
        _PARAMS_CACHE[key] = (<char*>p)[:sizeof(qqQuantParams_t)]
    return 0


cdef str _dtype_arg(str func, dtype):
    """The `dtype=` argument as one of _FLOAT_DTYPES, or None when not given."""
    if dtype is None:
        return None
    name = None
    if isinstance(dtype, str):
        name = dtype[6:] if dtype.startswith("torch.") else dtype
    elif (type(dtype).__module__ or "").startswith("torch"):
        name = str(dtype).rpartition(".")[2]        # torch.bfloat16 -> "bfloat16"
    else:
        try:                                         # NumPy, ml_dtypes, JAX and CuPy dtypes
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in _FLOAT_DTYPES:
        raise TypeError(f"{func}: dtype: expected 'float32', 'float16' or 'bfloat16' (or the "
                        f"matching NumPy / framework dtype), got {dtype!r}")
    return name


# NumPy dtype name -> DLPack (type code, bits). ml_dtypes' bfloat16 / float8 types are
# NumPy "void"-kind dtypes, recognised by name only; every other dtype maps by its kind
# so that libqq, not this table, decides what an operation accepts.
_NUMPY_TO_DL = {
    "float32": (kDLFloat, 32), "float16": (kDLFloat, 16), "bfloat16": (kDLBfloat, 16),
    "uint8": (kDLUInt, 8), "int8": (kDLInt, 8), "int32": (kDLInt, 32),
    "float8_e4m3fn": (kDLFloat8_e4m3fn, 8), "float8_e5m2": (kDLFloat8_e5m2, 8),
    "float8_e8m0fnu": (kDLFloat8_e8m0fnu, 8), "float8_e4m3fnuz": (kDLFloat8_e4m3fnuz, 8),
    "float8_e5m2fnuz": (kDLFloat8_e5m2fnuz, 8), "float8_e4m3b11fnuz": (kDLFloat8_e4m3b11fnuz, 8),
    "float8_e3m4": (kDLFloat8_e3m4, 8), "float8_e4m3": (kDLFloat8_e4m3, 8),
}
_KIND_TO_DL = {"f": kDLFloat, "i": kDLInt, "u": kDLUInt, "b": kDLBool, "c": kDLComplex}

# DLPack (type code, bits) -> the name we use for output dtypes (floats and uint8 only).
_DL_TO_NAME = {(kDLFloat, 32): "float32", (kDLFloat, 16): "float16",
               (kDLBfloat, 16): "bfloat16", (kDLUInt, 8): "uint8"}
_DL_TO_NAME_CODES = {"float32": (kDLFloat, 32), "float16": (kDLFloat, 16),
                     "bfloat16": (kDLBfloat, 16), "uint8": (kDLUInt, 8)}


cdef object _numpy_dtype(str name):
    if name == "bfloat16":
        import ml_dtypes                            # a dependency of qq; NumPy has no bfloat16
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# =========================================================================================
# DLPack import: a _View is a DLTensor describing someone else's memory for one call
# =========================================================================================

cdef const char* _CAPSULE = b"dltensor"
cdef const char* _CAPSULE_VERSIONED = b"dltensor_versioned"
cdef const char* _CAPSULE_USED = b"used_dltensor"
cdef const char* _CAPSULE_VERSIONED_USED = b"used_dltensor_versioned"

cdef enum:
    _MAX_NDIM = 64     # NumPy's limit; shapes are copied into stack arrays of this size


cdef class _View:
    """A DLTensor over an argument's memory, valid until _release_view.

    Exactly one of these owns the memory's lifetime for the call:
      - buf (NumPy arrays, via the buffer protocol; dims holds shape and strides),
      - versioned / legacy (a consumed DLPack capsule's managed tensor, whose deleter we
        call exactly once),
      - owner (a _DeviceBuffer of ours).
    """
    cdef DLTensor tensor
    cdef Py_buffer buf
    cdef bint has_buf
    cdef int64_t* dims
    cdef DLManagedTensorVersioned* versioned
    cdef DLManagedTensor* legacy
    cdef object owner
    cdef bint readonly
    cdef str name

    def __dealloc__(self):
        # Safety net only: _Call.release() has normally released the view already.
        _release_view(self)

    @property
    def shape(self):
        return tuple([self.tensor.shape[i] for i in range(self.tensor.ndim)])

    cdef str dtype_name(self):
        """'float32', 'float16', 'bfloat16', 'uint8', or None for anything else."""
        if self.tensor.dtype.lanes != 1:
            return None
        return _DL_TO_NAME.get((self.tensor.dtype.code, self.tensor.dtype.bits))

    cdef str float_dtype(self):
        """The view's float dtype, or float32 as a placeholder when it has none: the output
        is then only allocated so that libqq can reject the input dtype with its message."""
        name = self.dtype_name()
        return name if name in _FLOAT_DTYPES else "float32"


cdef void _release_view(_View v) noexcept:
    """Give everything a view holds back to its producer. Never raises; idempotent."""
    cdef DLManagedTensorVersioned* mv = v.versioned
    cdef DLManagedTensor* ml = v.legacy
    # Clear first, call after: whatever happens inside a deleter, it cannot run twice.
    v.versioned = NULL
    v.legacy = NULL
    if mv != NULL and mv.deleter != NULL:
        mv.deleter(mv)
    if ml != NULL and ml.deleter != NULL:
        ml.deleter(ml)
    if v.has_buf:
        v.has_buf = False
        PyBuffer_Release(&v.buf)
    if v.dims != NULL:
        PyMem_Free(v.dims)
        v.dims = NULL
    v.owner = None


cdef int _import_numpy(_View v, object arr, str where) except -1:
    """NumPy path: pointer, shape and strides from the buffer protocol, dtype by name.

    NumPy's own __dlpack__ refuses ml_dtypes' bfloat16 / float8 arrays, and its buffer
    export cannot describe them in a format string either, so we request the buffer
    without PyBUF_FORMAT and take the dtype from arr.dtype.
    """
    dt = arr.dtype
    if not dt.isnative:
        raise TypeError(f"{where}: byte-swapped (non-native) dtype {dt.str!r} is not supported; "
                        f"convert it with .astype({dt.name!r})")
    code_bits = _NUMPY_TO_DL.get(dt.name)
    if code_bits is None:
        code = _KIND_TO_DL.get(dt.kind)
        if code is None:
            raise TypeError(f"{where}: NumPy dtype {dt.name!r} has no DLPack equivalent; "
                            f"libqq takes float32, float16, bfloat16, uint8 and float8 arrays")
        code_bits = (code, dt.itemsize * 8)

    PyObject_GetBuffer(arr, &v.buf, PyBUF_STRIDES)
    v.has_buf = True                    # from here on _release_view releases the buffer
    cdef int nd = v.buf.ndim
    cdef Py_ssize_t itemsize = v.buf.itemsize
    cdef int i
    if nd > _MAX_NDIM:
        raise ValueError(f"{where}: {nd} dimensions; at most {_MAX_NDIM} are supported")
    v.dims = <int64_t*>PyMem_Malloc((2 * nd + 1) * sizeof(int64_t))
    if v.dims == NULL:
        raise MemoryError()
    for i in range(nd):
        v.dims[i] = v.buf.shape[i]
        # DLPack strides count elements, the buffer protocol's count bytes.
        if v.buf.strides[i] % itemsize != 0:
            raise ValueError(f"{where}: stride {v.buf.strides[i]} bytes of axis {i} is not a "
                             f"multiple of the item size {itemsize}; make the array contiguous "
                             f"(numpy.ascontiguousarray)")
        v.dims[nd + i] = v.buf.strides[i] // itemsize
    v.tensor.data = v.buf.buf
    v.tensor.device.device_type = kDLCPU
    v.tensor.device.device_id = 0
    v.tensor.ndim = nd
    v.tensor.dtype.code = <int>code_bits[0]
    v.tensor.dtype.bits = <int>code_bits[1]
    v.tensor.dtype.lanes = 1
    v.tensor.shape = v.dims
    v.tensor.strides = v.dims + nd
    v.tensor.byte_offset = 0
    v.readonly = v.buf.readonly != 0
    return 0


cdef dict _TORCH_TO_DL = {}


cdef bint _import_torch(_View v, object t, str where) except -1:
    """Fast path for torch tensors when the call runs on torch's current stream (or on the
    CPU): pointer, shape, strides and dtype read off the tensor, no DLPack capsule.

    torch's __dlpack__ costs tens of microseconds per tensor on CUDA (stream queries and
    synchronisation bookkeeping); with stream=None that synchronisation is a no-op by the
    DLPack contract (producer and consumer share torch's current stream), so reading the
    tensor directly is equivalent. Returns False (and touches nothing) for anything it does
    not describe exactly (conjugate/negative views, other devices, unknown dtypes): the
    DLPack path then handles or refuses it.
    """
    torch = sys.modules["torch"]
    if not _TORCH_TO_DL:
        for name, code_bits in (("float32", (kDLFloat, 32)), ("float16", (kDLFloat, 16)),
                                ("bfloat16", (kDLBfloat, 16)), ("float64", (kDLFloat, 64)),
                                ("uint8", (kDLUInt, 8)), ("int8", (kDLInt, 8)),
                                ("int32", (kDLInt, 32)), ("int64", (kDLInt, 64)),
                                ("float8_e4m3fn", (kDLFloat8_e4m3fn, 8)),
                                ("float8_e5m2", (kDLFloat8_e5m2, 8)),
                                ("float8_e8m0fnu", (kDLFloat8_e8m0fnu, 8))):
            dt = getattr(torch, name, None)
            if dt is not None:
                _TORCH_TO_DL[dt] = code_bits
    if not isinstance(t, torch.Tensor) or t.is_conj() or t.is_neg() or t.is_sparse:
        return False
    code_bits = _TORCH_TO_DL.get(t.dtype)
    dev = t.device
    if code_bits is None or dev.type not in ("cpu", "cuda"):
        return False
    shape = t.shape
    strides = t.stride()
    cdef int nd = len(shape)
    cdef int i
    if nd > _MAX_NDIM:
        return False
    v.dims = <int64_t*>PyMem_Malloc((2 * nd + 1) * sizeof(int64_t))
    if v.dims == NULL:
        raise MemoryError()
    for i in range(nd):
        v.dims[i] = shape[i]
        v.dims[nd + i] = strides[i]
    v.owner = t                         # keeps the tensor alive until the view is released
    v.tensor.data = <void*><intptr_t>t.data_ptr()
    if dev.type == "cuda":
        v.tensor.device.device_type = kDLCUDA
        v.tensor.device.device_id = dev.index if dev.index is not None else 0
    else:
        v.tensor.device.device_type = kDLCPU
        v.tensor.device.device_id = 0
    v.tensor.ndim = nd
    v.tensor.dtype.code = <int>code_bits[0]
    v.tensor.dtype.bits = <int>code_bits[1]
    v.tensor.dtype.lanes = 1
    v.tensor.shape = v.dims
    v.tensor.strides = v.dims + nd
    v.tensor.byte_offset = 0
    v.readonly = False
    return True


cdef int _consume_capsule(_View v, object capsule, str where) except -1:
    """Take ownership of the managed tensor in a DLPack capsule.

    Protocol (DLPack python_spec): a consumer renames the capsule to "used_dltensor[_versioned]"
    so that the capsule's destructor no longer frees the tensor, and then calls the
    tensor's deleter itself once it is done with the memory.
    """
    cdef DLManagedTensorVersioned* mv
    cdef DLManagedTensor* ml
    if PyCapsule_IsValid(capsule, _CAPSULE_VERSIONED):
        mv = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, _CAPSULE_VERSIONED)
        PyCapsule_SetName(capsule, _CAPSULE_VERSIONED_USED)
        # Ownership moved to us with the rename; record it at once so that every exit from
        # here on (including the version error below) calls the deleter exactly once.
        v.versioned = mv
        if mv.version.major != QQ_DLPACK_MAJOR:
            raise _DLPackError(
                f"{where}: the producer exported a DLPack {mv.version.major}.{mv.version.minor} "
                f"tensor; qq reads DLPack major version {QQ_DLPACK_MAJOR} (it asked for "
                f"max_version=({QQ_DLPACK_MAJOR}, {QQ_DLPACK_MINOR}))")
        v.tensor = mv.dl_tensor
        v.readonly = (mv.flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0
    elif PyCapsule_IsValid(capsule, _CAPSULE):
        ml = <DLManagedTensor*>PyCapsule_GetPointer(capsule, _CAPSULE)
        PyCapsule_SetName(capsule, _CAPSULE_USED)
        v.legacy = ml
        v.tensor = ml.dl_tensor
        v.readonly = False          # pre-1.0 DLPack cannot say; assume writable
    else:
        raise _DLPackError(
            f"{where}: __dlpack__ returned {capsule!r}, which is not an unconsumed DLPack capsule "
            f"(a capsule named 'dltensor_versioned' or 'dltensor'; a capsule can be consumed "
            f"only once)")
    if v.tensor.ndim < 0 or v.tensor.ndim > _MAX_NDIM or (v.tensor.ndim > 0 and v.tensor.shape == NULL):
        raise ValueError(f"{where}: malformed DLPack tensor (ndim={v.tensor.ndim})")
    return 0


class _DLPackError(BufferError, ValueError):
    """A DLPack capsule we cannot read (unknown major version, or already consumed).

    Both a BufferError (what the DLPack spec uses for exchange failures) and a ValueError
    (what docs/api.md promises for bad arguments).
    """


# =========================================================================================
# DLPack export: a _DeviceBuffer is device memory libqq allocated for a result
# =========================================================================================

cdef struct _Export:
    # One allocation per export: the managed tensor handed to the consumer (versioned or
    # legacy, whichever the consumer asked for), what the deleter needs to free the
    # memory, and then shape[ndim] and strides[ndim] right after the struct.
    DLManagedTensorVersioned versioned
    DLManagedTensor legacy
    void* ptr
    int device
    void* stream


cdef void _export_free(_Export* e) noexcept nogil:
    # Stream-ordered free on the stream the buffer was allocated and written on. A DLPack
    # deleter has no way to report an error, so the status is dropped.
    qqDeviceFree(e.device, e.ptr, e.stream)
    free(e)


cdef void _export_deleter_versioned(DLManagedTensorVersioned* m) noexcept nogil:
    _export_free(<_Export*>m.manager_ctx)


cdef void _export_deleter_legacy(DLManagedTensor* m) noexcept nogil:
    _export_free(<_Export*>m.manager_ctx)


cdef void _export_capsule_destructor(object capsule) noexcept:
    # A capsule still carrying its original name was never consumed: it still owns the
    # tensor. A "used_*" capsule was consumed and the consumer calls the deleter.
    cdef DLManagedTensorVersioned* mv
    cdef DLManagedTensor* ml
    if PyCapsule_IsValid(capsule, _CAPSULE_VERSIONED):
        mv = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, _CAPSULE_VERSIONED)
        mv.deleter(mv)
    elif PyCapsule_IsValid(capsule, _CAPSULE):
        ml = <DLManagedTensor*>PyCapsule_GetPointer(capsule, _CAPSULE)
        ml.deleter(ml)


cdef class _DeviceBuffer:
    """A compact row-major CUDA allocation made by libqq (qqDeviceAlloc), handed to the
    caller's framework through DLPack. It is the result type for JAX on CUDA (JAX arrays
    are immutable, so libqq cannot write into one) and for CUDA producers qq does not know.

    It can be exported once: __dlpack__ moves the memory into the capsule, whose deleter
    frees it (qqDeviceFree on the stream it was allocated on). Until then, or if it is
    never exported, dropping the object frees the memory the same way.
    """
    cdef void* ptr
    cdef int device
    cdef intptr_t stream
    cdef int ndim
    cdef int64_t* dims          # shape[ndim], then strides[ndim] (elements)
    cdef DLDataType dl_dtype
    cdef bint synced            # the host has waited for `stream` since the last write
    cdef readonly tuple shape
    cdef readonly str dtype         # 'float32', 'float16', 'bfloat16' or 'uint8'

    def __dealloc__(self):
        if self.ptr != NULL:
            qqDeviceFree(self.device, self.ptr, <void*>self.stream)
            self.ptr = NULL
        if self.dims != NULL:
            PyMem_Free(self.dims)
            self.dims = NULL

    def __repr__(self):
        state = "exported" if self.ptr == NULL else "live"
        return (f"<qq device buffer {self.dtype} {self.shape} on cuda:{self.device}, "
                f"{state}; consume it with from_dlpack>")

    def __dlpack_device__(self):
        return (<int>kDLCUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if self.ptr == NULL:
            raise BufferError("this qq device buffer was already exported through DLPack; "
                              "it can be consumed only once")
        if dl_device is not None and (int(dl_device[0]), int(dl_device[1])) != (<int>kDLCUDA, self.device):
            raise BufferError(f"dl_device={tuple(dl_device)!r}: this buffer lives on "
                              f"({<int>kDLCUDA}, {self.device}) (cuda:{self.device}) and qq does "
                              f"not copy across devices")
        if copy:
            raise BufferError("copy=True: qq does not copy its results on export; "
                              "copy after importing")
        self._ready_for(stream)

        cdef bint versioned = max_version is not None and int(max_version[0]) >= QQ_DLPACK_MAJOR
        cdef int nd = self.ndim
        cdef _Export* e = <_Export*>malloc(sizeof(_Export) + 2 * nd * sizeof(int64_t))
        if e == NULL:
            raise MemoryError()
        # This block must never raise: it initializes everything the deleters and the
        # capsule destructor use, before the capsule exists.
        cdef int64_t* dims = <int64_t*>(<char*>e + sizeof(_Export))
        cdef DLTensor* t
        cdef void* payload
        cdef const char* name
        memset(e, 0, sizeof(_Export))
        e.ptr = self.ptr
        e.device = self.device
        e.stream = <void*>self.stream
        memcpy(dims, self.dims, 2 * nd * sizeof(int64_t))
        if versioned:
            e.versioned.version.major = QQ_DLPACK_MAJOR
            e.versioned.version.minor = 0       # nothing we export needs more than 1.0
            e.versioned.manager_ctx = e
            e.versioned.deleter = _export_deleter_versioned
            e.versioned.flags = 0               # writable, not a copy
            t = &e.versioned.dl_tensor
            payload = &e.versioned
            name = _CAPSULE_VERSIONED
        else:
            e.legacy.manager_ctx = e
            e.legacy.deleter = _export_deleter_legacy
            t = &e.legacy.dl_tensor
            payload = &e.legacy
            name = _CAPSULE
        t.data = self.ptr
        t.device.device_type = kDLCUDA
        t.device.device_id = self.device
        t.ndim = nd
        t.dtype = self.dl_dtype
        t.shape = dims
        t.strides = dims + nd
        t.byte_offset = 0

        try:
            capsule = PyCapsule_New(payload, name, _export_capsule_destructor)
        except BaseException:
            free(e)
            raise
        # The capsule owns e, and through it the device memory: we must not free it now.
        self.ptr = NULL
        return capsule

    cdef _ready_for(self, consumer_stream):
        """Honour the consumer's stream (DLPack: the producer makes the data safe to use on
        the stream the consumer names; None = the legacy default stream for CUDA, -1 = no
        synchronization wanted)."""
        if self.synced or consumer_stream == -1:
            return
        consumer = 0 if consumer_stream is None else int(consumer_stream)
        if consumer == 1:
            consumer = 0        # 1 is cudaStreamLegacy; 0 (ambiguous in DLPack) read alike
        producer = 0 if self.stream == 1 else self.stream
        if consumer == producer:
            return              # same stream: ordered already
        # Different streams: libqq's C ABI has no event API yet (see _stream_synchronize),
        # so wait on the host for our stream, which is always safe.
        _stream_synchronize(self.device, self.stream)
        self.synced = True


cdef _DeviceBuffer _device_buffer(tuple shape, str dtype, int device, intptr_t stream):
    cdef _DeviceBuffer b = _DeviceBuffer.__new__(_DeviceBuffer)
    cdef int nd = len(shape)
    cdef int i
    cdef qqStatus_t st
    cdef void* ptr = NULL
    cdef size_t nbytes
    if nd > _MAX_NDIM:
        raise ValueError(f"{nd} dimensions; at most {_MAX_NDIM} are supported")
    code, bits = _DL_TO_NAME_CODES[dtype]
    b.device = device
    b.stream = stream
    b.ndim = nd
    b.shape = shape
    b.dtype = dtype
    b.dl_dtype.code = <int>code
    b.dl_dtype.bits = <int>bits
    b.dl_dtype.lanes = 1
    b.dims = <int64_t*>PyMem_Malloc((2 * nd + 1) * sizeof(int64_t))
    if b.dims == NULL:
        raise MemoryError()
    count = 1
    for i in range(nd - 1, -1, -1):          # compact row-major strides, in elements
        b.dims[i] = shape[i]
        b.dims[nd + i] = count
        count *= shape[i]
    total = count * _ITEMSIZE[dtype]
    # At least one byte: consumers may treat a NULL data pointer as an error.
    nbytes = max(total, 1)
    with nogil:
        st = qqDeviceAlloc(device, nbytes, &ptr, <void*>stream)
    _check(st)
    b.ptr = ptr
    return b


def _device_empty(shape, dtype="float32", int device=0):
    """An uninitialized libqq device buffer (used by `python -m qq` to probe the GPU paths
    without a CUDA framework)."""
    return _device_buffer(tuple(int(d) for d in shape), dtype, device, 0)


_cuda_driver = None


def _stream_synchronize(int device, intptr_t stream):
    """Block the host until all work queued on `stream` of `device` has finished.

    Stop-gap: qq.h has no stream or event API yet, so this calls the CUDA driver
    (libcuda.so.1, present wherever a CUDA tensor exists) through ctypes, retaining the
    device's primary context (the one the CUDA runtime, hence libqq, uses). Replace it
    by a libqq call once the C ABI has one.
    """
    global _cuda_driver
    import ctypes
    if _cuda_driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        c_int, c_void_p, POINTER = ctypes.c_int, ctypes.c_void_p, ctypes.POINTER
        for fname, argtypes in (
                ("cuInit", [ctypes.c_uint]),
                ("cuDeviceGet", [POINTER(c_int), c_int]),
                ("cuDevicePrimaryCtxRetain", [POINTER(c_void_p), c_int]),
                ("cuDevicePrimaryCtxRelease_v2", [c_int]),
                ("cuCtxPushCurrent_v2", [c_void_p]),
                ("cuCtxPopCurrent_v2", [POINTER(c_void_p)]),
                ("cuStreamSynchronize", [c_void_p])):
            fn = getattr(lib, fname)
            fn.argtypes = argtypes
            fn.restype = c_int
        _cuda_driver = lib
    lib = _cuda_driver

    def cu(result, what):
        if result != 0:
            raise QQError(f"{what} failed with CUresult {result} while waiting for CUDA stream "
                          f"{stream:#x} on device {device}")

    dev = ctypes.c_int(0)
    ctx = ctypes.c_void_p(0)
    popped = ctypes.c_void_p(0)
    cu(lib.cuInit(0), "cuInit")
    cu(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    cu(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    try:
        cu(lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            cu(lib.cuStreamSynchronize(ctypes.c_void_p(stream)), "cuStreamSynchronize")
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev)


# =========================================================================================
# Streams
# =========================================================================================

cdef bint _is_cuda_device(int device_type):
    return device_type == kDLCUDA or device_type == kDLCUDAManaged or device_type == kDLCUDAHost


cdef intptr_t _stream_arg(str func, stream) except? -1:
    """An explicit `stream=`: an int (a cudaStream_t value) or an object with
    __cuda_stream__ (CUDA stream protocol: a (version, handle) tuple, version 0).
    Anything else is refused rather than guessed at."""
    if isinstance(stream, bool):
        raise TypeError(f"{func}: stream: expected None, an int (a cudaStream_t value) or an "
                        f"object with __cuda_stream__, got bool {stream!r}")
    if isinstance(stream, numbers.Integral):
        s = int(stream)
        if s < 0:
            raise ValueError(f"{func}: stream: {s} is not a CUDA stream handle (expected a "
                             f"cudaStream_t value >= 0; 0 is the legacy default stream)")
        return s
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        t = proto() if callable(proto) else proto
        if not (isinstance(t, tuple) and len(t) == 2):
            raise TypeError(f"{func}: stream: {type(stream).__name__}.__cuda_stream__ returned "
                            f"{t!r}; expected a (version, handle) tuple")
        version, handle = t
        if version != 0:
            raise ValueError(f"{func}: stream: __cuda_stream__ protocol version {version!r} is "
                             f"not known to qq (it reads version 0)")
        return int(handle)
    hint = ""
    if hasattr(stream, "cuda_stream"):
        hint = "; pass its .cuda_stream"
    elif hasattr(stream, "ptr"):
        hint = "; pass its .ptr"
    raise TypeError(f"{func}: stream: expected None, an int (a cudaStream_t value) or an object "
                    f"with __cuda_stream__, got {type(stream).__name__}{hint}")


# =========================================================================================
# Per-call state: the caller's framework, device and stream; views; result allocation
# =========================================================================================

cdef str _framework_of(obj):
    """'numpy', 'torch', 'cupy', 'jax' or 'other', from the type's module, importing
    nothing (a framework that made `obj` is imported already)."""
    if isinstance(obj, np.ndarray):
        return "numpy"
    root = (type(obj).__module__ or "").partition(".")[0]
    if root == "torch" or root == "cupy":
        return root
    if root == "jax" or root == "jaxlib":
        return "jax"
    return "other"


cdef class _Call:
    """Everything one public call needs between parsing its arguments and returning.

    Outputs come back in the framework of the call's first array argument (the *anchor*)
    and on its device; CUDA work runs on `stream`:
      - torch / CuPy: stream=None -> the framework's current stream on the anchor's device.
      - JAX: stream=None -> we ask JAX for its arrays with __dlpack__(stream=None), which
        makes JAX wait on the host until they are ready, run on the legacy default stream
        (0), and wait on the host for that stream before returning. JAX on CUDA is thus
        synchronous: its streams are private to XLA, and an input JAX may free as soon as
        we release it must not still be read by queued work.
      - other producers: the legacy default stream.
    An explicit stream is used as is (also with JAX, which then waits on it for its
    inputs).
    """
    cdef str func
    cdef str fw
    cdef object anchor
    cdef int dev_type
    cdef bint on_gpu            # results go to device memory (kDLCUDA, kDLCUDAManaged)
    cdef int dev_id
    cdef intptr_t stream        # what libqq runs on (ignored for CPU tensors)
    cdef object dl_stream       # what CUDA producers get as __dlpack__(stream=...)
    cdef list views
    cdef list buffers           # _DeviceBuffers allocated for results in this call
    cdef bint torch_current     # torch tensors, work on torch's current stream (stream=None)
    cdef list torch_outs        # torch tensors the caller passed as out=: versions bumped in finish()

    def __cinit__(self, str func, anchor, str anchor_name, stream):
        self.func = func
        self.views = []
        self.buffers = []
        self.torch_outs = []
        if isinstance(anchor, QuantizedArray):
            anchor = anchor.data
        self.anchor = anchor
        self.fw = _framework_of(anchor)
        if isinstance(anchor, np.ndarray):
            dev = (kDLCPU, 0)
        elif isinstance(anchor, _DeviceBuffer):
            dev = (kDLCUDA, (<_DeviceBuffer>anchor).device)
        elif hasattr(anchor, "__dlpack_device__"):
            dev = anchor.__dlpack_device__()
        else:
            raise TypeError(_not_an_array(func, anchor_name, anchor))
        self.dev_type = int(dev[0])
        self.dev_id = int(dev[1])
        # As libqq dispatches: pinned host memory runs on the CPU backend, managed memory
        # on the GPU backend.
        if self.dev_type == kDLCPU or self.dev_type == kDLCUDAHost:
            self.on_gpu = False
        elif self.dev_type == kDLCUDA or self.dev_type == kDLCUDAManaged:
            self.on_gpu = True
        else:
            raise NotSupportedError(
                f"{func}: {anchor_name}: arrays on DLPack device type {self.dev_type} are not "
                f"supported (qq runs on kDLCPU = {<int>kDLCPU}, kDLCUDA = {<int>kDLCUDA}, "
                f"kDLCUDAHost = {<int>kDLCUDAHost} and kDLCUDAManaged = {<int>kDLCUDAManaged})")
        self._resolve_stream(stream)

    cdef _resolve_stream(self, stream):
        cdef intptr_t s
        if stream is not None:
            s = _stream_arg(self.func, stream)      # validated even where it is ignored
            if self.on_gpu:
                self.stream = s
                # DLPack reserves 0 (ambiguous); 1 names the legacy default stream.
                self.dl_stream = s if s != 0 else 1
            return
        if not self.on_gpu:
            self.stream = 0
            self.dl_stream = None
            self.torch_current = self.fw == "torch"
            return
        if self.fw == "torch":
            torch = sys.modules["torch"]
            s = torch.cuda.current_stream(self.dev_id).cuda_stream
            self.torch_current = True
        elif self.fw == "cupy":
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(self.dev_id):
                s = cupy.cuda.get_current_stream().ptr
        elif self.fw == "jax":
            self.stream = 0
            self.dl_stream = None       # producer-synchronised: JAX waits on the host
            return
        else:
            s = 0
        self.stream = s
        self.dl_stream = s if s != 0 else 1

    # --- views ---------------------------------------------------------------------------

    cdef _View view(self, obj, str name, bint writable=False):
        """A view of argument `obj` (None -> None), released with the call."""
        if obj is None:
            return None
        cdef str where = f"{self.func}: {name}"
        if _framework_of(obj) == "torch" and (obj.is_conj() or obj.is_neg()):
            # torch's lazy conjugate / negative views (t.conj().imag, t._neg_view()) share
            # memory holding the un-negated values: read through DLPack they come out as +t.
            if writable:
                raise ValueError(f"{where}: the tensor has torch's conjugate or negative bit set "
                                 f"(a lazy view); results written into it would read back "
                                 f"negated. Pass a plain tensor (e.g. out.resolve_neg())")
            obj = obj.resolve_conj().resolve_neg()
        cdef _View v = _View.__new__(_View)
        v.name = name
        self.views.append(v)        # first: whatever the import acquires is released with us
        if isinstance(obj, np.ndarray):
            _import_numpy(v, obj, where)
        elif isinstance(obj, _DeviceBuffer):
            _import_device_buffer(v, <_DeviceBuffer>obj, where)
        elif self.torch_current and type(obj).__module__ == "torch" and _import_torch(v, obj, where):
            pass
        elif hasattr(obj, "__dlpack__"):
            if writable and _framework_of(obj) == "jax":
                raise ValueError(f"{where}: JAX arrays are immutable and cannot be written into; "
                                 f"leave out=None to get a new array")
            if not writable and _framework_of(obj) == "torch" and obj.requires_grad:
                obj = obj.detach()      # torch refuses to export tensors that require grad
            _import_dlpack(v, obj, self.dl_stream, where)
        else:
            raise TypeError(_not_an_array(self.func, name, obj))
        if writable and v.readonly:
            raise ValueError(f"{where}: the array is read-only; out= must be a writable array")
        return v

    cdef _View out_view(self, obj, str name):
        """A caller's out= array. Like torch's own out= ops: a tensor that requires grad is
        refused while grad mode is on, and the version counter of a written tensor is bumped
        (in finish()) so that autograd notices the overwrite instead of using stale values."""
        if _framework_of(obj) == "torch":
            torch = sys.modules["torch"]
            if obj.requires_grad and torch.is_grad_enabled():
                raise ValueError(f"{self.func}: {name}: out= tensors that require grad are not "
                                 f"supported (qq's ops are not differentiable through out=, as "
                                 f"torch's out= ops are not); pass a tensor without requires_grad "
                                 f"or leave {name}=None")
            self.torch_outs.append(obj)
        return self.view(obj, name, True)

    cdef object scalar(self, value, str name):
        """A global scale: arrays pass through; a Python / NumPy real number becomes a
        float32 array of shape () on the anchor's device (NumPy for CPU callers, the
        caller's framework on CUDA)."""
        if value is None or not isinstance(value, numbers.Real) or isinstance(value, bool):
            return value
        v = float(value)
        if not self.on_gpu:
            return np.array(v, dtype=np.float32)
        if self.fw == "torch":
            torch = sys.modules["torch"]
            # a fill kernel with v as its argument: no host-to-device copy, so this also
            # works inside a CUDA graph capture
            return torch.full((), v, dtype=torch.float32, device=torch.device("cuda", self.dev_id))
        if self.fw == "cupy":
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(self.dev_id):
                return cupy.full((), v, dtype=cupy.float32)
        if self.fw == "jax":
            return _jax_put(np.array(v, dtype=np.float32), self.anchor)
        raise TypeError(f"{self.func}: {name}: a Python number can only be placed on the GPU "
                        f"for torch, CuPy or JAX callers; pass a float32 device array of one "
                        f"element instead")

    # --- results -------------------------------------------------------------------------

    cdef tuple empty(self, tuple shape, str dtype, str name):
        """(result, view): a new compact array in the caller's framework and a writable
        view of it. `result` goes through self.result() before it is returned."""
        try:
            return self._empty(shape, dtype, name)
        except MemoryError as e:
            raise MemoryError(f"{self.func}: cannot allocate the result '{name}' of shape {shape} "
                              f"({dtype}): {e}") from None
        except RuntimeError as e:   # torch.OutOfMemoryError and friends
            if "out of memory" not in str(e).lower():
                raise
            raise MemoryError(f"{self.func}: cannot allocate the result '{name}' of shape {shape} "
                              f"({dtype}) on the GPU: {e}") from None

    cdef tuple _empty(self, tuple shape, str dtype, str name):
        cdef _DeviceBuffer b
        if not self.on_gpu:
            if self.fw == "torch":
                torch = sys.modules["torch"]
                r = torch.empty(shape, dtype=getattr(torch, dtype))
            else:
                # NumPy, and JAX and unknown CPU producers: computed into NumPy (JAX arrays
                # are immutable), converted by self.result().
                r = np.empty(shape, dtype=_numpy_dtype(dtype))
        elif self.fw == "torch":
            torch = sys.modules["torch"]
            r = torch.empty(shape, dtype=getattr(torch, dtype),
                            device=torch.device("cuda", self.dev_id))
        elif self.fw == "cupy":
            r = _cupy_empty(self.func, shape, dtype, self.dev_id)
        else:
            b = _device_buffer(shape, dtype, self.dev_id, self.stream)
            self.buffers.append(b)
            r = b
        return r, self.view(r, name, True)

    cdef object result(self, obj):
        """Hand a result made by empty() to the caller's framework."""
        if obj is None or self.fw != "jax":
            return obj
        if isinstance(obj, np.ndarray):
            return _jax_put(obj, self.anchor)
        jnp = sys.modules["jax"].numpy
        if hasattr(jnp, "from_dlpack"):
            return jnp.from_dlpack(obj)
        return sys.modules["jax"].dlpack.from_dlpack(obj.__dlpack__())

    cdef void* cstream(self):
        return <void*>self.stream

    cdef finish(self):
        """After the C call succeeded, before the views are released."""
        if self.torch_outs:
            bump = sys.modules["torch"].autograd.graph.increment_version
            for t in self.torch_outs:
                bump(t)
        if self.fw == "jax" and self.on_gpu:
            _stream_synchronize(self.dev_id, self.stream)
            for b in self.buffers:
                (<_DeviceBuffer>b).synced = True

    cdef void release(self) noexcept:
        for v in self.views:
            _release_view(<_View>v)
        self.views = []


cdef str _not_an_array(str func, str name, obj):
    what = "a QuantizedArray" if isinstance(obj, QuantizedArray) else type(obj).__name__
    return (f"{func}: {name}: expected a NumPy array or an array with __dlpack__ (torch, CuPy, "
            f"JAX), got {what}")


cdef int _import_dlpack(_View v, obj, dl_stream, str where) except -1:
    dev = obj.__dlpack_device__()
    # Producers on a CUDA device get the consumer's stream; CPU producers must get None.
    stream = dl_stream if _is_cuda_device(int(dev[0])) else None
    try:
        capsule = obj.__dlpack__(stream=stream, max_version=(QQ_DLPACK_MAJOR, QQ_DLPACK_MINOR))
    except TypeError:
        # A producer from before DLPack 1.0 has no max_version and returns a legacy capsule.
        capsule = obj.__dlpack__(stream=stream)
    _consume_capsule(v, capsule, where)
    return 0


cdef int _import_device_buffer(_View v, _DeviceBuffer b, str where) except -1:
    # Our own buffers are viewed directly: no capsule, so no one-shot export is used up.
    if b.ptr == NULL:
        raise ValueError(f"{where}: this qq device buffer was already exported through DLPack; "
                         f"use the array it was imported into")
    v.owner = b
    v.tensor.data = b.ptr
    v.tensor.device.device_type = kDLCUDA
    v.tensor.device.device_id = b.device
    v.tensor.ndim = b.ndim
    v.tensor.dtype = b.dl_dtype
    v.tensor.shape = b.dims
    v.tensor.strides = b.dims + b.ndim
    v.tensor.byte_offset = 0
    v.readonly = False
    return 0


cdef object _jax_put(np_array, anchor):
    """A NumPy result as a JAX array on the anchor's device."""
    jax = sys.modules["jax"]
    try:
        device = next(iter(anchor.devices()))
    except Exception:
        return jax.numpy.asarray(np_array)
    return jax.device_put(np_array, device)


cdef object _cupy_empty(str func, tuple shape, str dtype, int dev_id):
    cupy = sys.modules["cupy"]
    dt = _numpy_dtype(dtype)
    with cupy.cuda.Device(dev_id):
        try:
            return cupy.empty(shape, dtype=dt)
        except Exception as e:
            if dtype != "bfloat16":
                raise
            raise TypeError(f"{func}: this CuPy cannot hold bfloat16 results ({e}); pass "
                            f"dtype='float16' or dtype='float32', or an out= array") from None


# =========================================================================================
# Shapes (libqq computes them; Python only asks)
# =========================================================================================

cdef tuple _quantized_shapes(str func, const qqQuantParams_t* p, tuple x_shape, str axis="K"):
    """(data_shape, scales_shape) of quantize(x) for x of shape x_shape, from
    qqQuantizedShapes. `axis` names the caller's quantized axis in a K/group error
    (quantize_colwise quantizes along M)."""
    cdef int64_t xs[_MAX_NDIM]
    cdef int64_t ds[_MAX_NDIM]
    cdef int64_t ss[_MAX_NDIM + 1]
    cdef int nd = len(x_shape)
    cdef int sn = 0
    cdef int i
    cdef qqStatus_t st
    if nd > _MAX_NDIM:
        raise ValueError(f"{func}: {nd} dimensions; at most {_MAX_NDIM} are supported")
    for i in range(nd):
        xs[i] = x_shape[i]
    with nogil:
        st = qqQuantizedShapes(p, nd, xs, ds, ss, &sn)
    try:
        _check(st)
    except ValueError as e:         # the message is about the caller's operation, not this helper
        msg = str(e).replace("quantized_shapes:", f"{func}:", 1)
        if axis != "K":
            msg = msg.replace(" K=", f" {axis}=").replace("pad K", f"pad {axis}")
        raise ValueError(msg) from None
    return tuple([ds[i] for i in range(nd)]), tuple([ss[i] for i in range(sn)])


cdef int64_t _unpacked_last(str func, str name, const qqQuantParams_t* p, tuple data_shape) except -1:
    """The logical (float) length of packed data's last axis: the K whose quantized data
    has data_shape's last axis, checked through qqQuantizedShapes."""
    if len(data_shape) == 0:
        raise ValueError(f"{func}: {name}: expected packed data with at least one axis, got a "
                         f"0-d array")
    if p.bits <= 0:
        raise QQError(f"{func}: qqQuantParamsInit left bits={p.bits}; please report this bug")
    nbytes = data_shape[-1]
    if nbytes * 8 % p.bits != 0:
        raise ValueError(f"{func}: {name}: the last axis holds {nbytes} bytes, which is not a "
                         f"whole number of {p.bits}-bit values")
    k = nbytes * 8 // p.bits
    try:
        ds, _ = _quantized_shapes(func, p, data_shape[:-1] + (k,))
    except ValueError as e:
        raise ValueError(f"{func}: {name}: packed data with {nbytes} bytes per row holds "
                         f"K={k} values of {p.bits} bits, which no quantize call produces: "
                         f"{e}") from None
    if ds[-1] != nbytes:
        raise ValueError(f"{func}: {name}: the last axis holds {nbytes} bytes, but K={k} "
                         f"values of {p.bits} bits pack into {ds[-1]} bytes")
    return k


cdef tuple _matmul_shape(str func, tuple x_shape, tuple w_shape, int64_t n):
    """[..., M, N] for x [..., M, K] and w [..., N or K, ...]: batch axes broadcast as in
    NumPy; a 1-D x [K] gives [..., N]."""
    if len(x_shape) < 1:
        raise ValueError(f"{func}: x: expected [..., M, K], got a 0-d array")
    if len(w_shape) < 2:
        raise ValueError(f"{func}: w: expected at least 2 dimensions, got shape {w_shape}")
    if len(x_shape) == 1:
        return tuple(w_shape[:-2]) + (n,)
    try:
        batch = tuple(np.broadcast_shapes(x_shape[:-2], w_shape[:-2]))
    except ValueError:
        raise ValueError(f"{func}: the batch axes of x {x_shape[:-2]} and w {w_shape[:-2]} do "
                         f"not broadcast") from None
    return batch + (x_shape[-2], n)


# =========================================================================================
# QuantizedArray
# =========================================================================================

cdef object _take(str func, str arg, given, default, qa_value, str qa_name):
    """An explicit argument next to a QuantizedArray must agree with it. An argument left
    at its default (or None) takes the QuantizedArray's value."""
    if given is None or given == default or given == qa_value:
        return qa_value
    raise ValueError(f"{func}: {arg}={given!r} contradicts {qa_name}.{arg}={qa_value!r}; "
                     f"leave {arg} out to use the QuantizedArray's value")


cdef object _take_array(str func, str arg, given, qa_value, str qa_name, str qa_field):
    if given is None or given is qa_value:
        return qa_value
    raise ValueError(f"{func}: {arg} was given both as an argument and as {qa_name}.{qa_field} "
                     f"(a QuantizedArray); pass it once")


def _array_summary(a):
    if a is None:
        return "None"
    mod = (type(a).__module__ or "").partition(".")[0]
    shape = tuple(getattr(a, "shape", ()))
    return f"<{mod} {getattr(a, 'dtype', '?')} {shape}>"


class QuantizedArray:
    """The result of qq.quantize: packed data, scales and (affine) biases with the
    parameters that produced them.

    Unpacks like MLX's result: ``data, scales = qq.quantize(w, mode="nvfp4")`` and
    ``data, scales, biases = qq.quantize(w)`` (affine); len() is 2 or 3 accordingly.
    Every qq function accepts it wherever it takes packed data and reads scales, biases,
    mode, group_size, bits, global_scale, scale_layout and fp8_format from it.

    Fields: data, scales, biases (None unless affine), mode, group_size, bits,
    global_scale (an array or None), rounding, scale_layout, fp8_format, and shape (the
    logical float shape, a tuple of ints).
    """
    __slots__ = ("data", "scales", "biases", "mode", "group_size", "bits", "global_scale",
                 "rounding", "scale_layout", "fp8_format", "shape")

    def __init__(self, data, scales, biases=None, *, mode="affine", group_size=None,
                 bits=None, global_scale=None, rounding="ceil", scale_layout="linear",
                 fp8_format="e4m3", shape=None):
        cdef qqQuantParams_t p
        func = "QuantizedArray"
        _quant_params(func, &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
        if mode == "affine" and biases is None:
            raise ValueError(f"{func}: biases: affine mode needs biases")
        if mode != "affine" and biases is not None:
            raise ValueError(f"{func}: biases: mode {mode!r} has no biases")
        if global_scale is not None and mode != "nvfp4":
            raise ValueError(f"{func}: global_scale: only nvfp4 has a global scale, got mode {mode!r}")
        if shape is None:
            data_shape = tuple(int(d) for d in data.shape)
            shape = data_shape[:-1] + (_unpacked_last(func, "data", &p, data_shape),)
        self.data = data
        self.scales = scales
        self.biases = biases
        self.mode = mode
        self.group_size = p.group_size
        self.bits = p.bits
        self.global_scale = global_scale
        self.rounding = rounding
        self.scale_layout = scale_layout
        self.fp8_format = fp8_format
        self.shape = tuple(int(d) for d in shape)

    def __len__(self):
        return 3 if self.mode == "affine" else 2

    def __iter__(self):
        yield self.data
        yield self.scales
        if self.mode == "affine":
            yield self.biases

    def __getitem__(self, index):
        return tuple(self)[index]

    def __repr__(self):
        parts = [f"mode={self.mode!r}", f"shape={self.shape}", f"group_size={self.group_size}",
                 f"bits={self.bits}", f"scale_layout={self.scale_layout!r}"]
        if self.mode in ("mxfp4", "mxfp8"):
            parts.append(f"rounding={self.rounding!r}")
        if self.mode == "mxfp8":
            parts.append(f"fp8_format={self.fp8_format!r}")
        if self.mode == "nvfp4":
            parts.append(f"global_scale={_array_summary(self.global_scale)}")
        parts.append(f"data={_array_summary(self.data)}")
        parts.append(f"scales={_array_summary(self.scales)}")
        if self.mode == "affine":
            parts.append(f"biases={_array_summary(self.biases)}")
        return f"QuantizedArray({', '.join(parts)})"


class PreparedWeight:
    """A qqmm weight kept in the form the current device multiplies fastest (from
    qq.prepare_weight): the QuantizedArray, plus - where qqmm dequantizes to bfloat16
    (Hopper, Ampere, the CPU) - q(w)'s exact values in bfloat16 without the global scale,
    so that no call dequantizes w again. qq.qqmm picks the form per call: the packed one
    for small M (the weight-only kernel reads it once), the values otherwise.

    Fields: quantized (QuantizedArray), values (bfloat16 [N, K] or None), mode,
    global_scale, shape.
    """
    __slots__ = ("quantized", "values", "mode", "global_scale", "shape")

    def __init__(self, quantized, values):
        self.quantized = quantized
        self.values = values
        self.mode = quantized.mode
        self.global_scale = quantized.global_scale
        self.shape = quantized.shape

    def __repr__(self):
        return (f"PreparedWeight(mode={self.mode!r}, shape={self.shape}, "
                f"values={_array_summary(self.values)}, quantized={self.quantized!r})")


def _blockscaled_device(w):
    """True when qqmm runs on block-scaled tensor cores for arrays like w (Blackwell)."""
    dev = w.__dlpack_device__() if hasattr(w, "__dlpack_device__") else (kDLCPU, 0)
    if int(dev[0]) not in (kDLCUDA, kDLCUDAManaged):
        return False
    major, minor = device_capability(int(dev[1]))
    return major in (10, 11, 12)    # as blockscaled_arch in libqq/src/cuda/qqmm.cu


def prepare_weight(w, mode="nvfp4", *, global_scale=None, rounding="ceil", fp8_format="e4m3",
                   stream=None):
    """Quantize a qqmm weight once and keep what qqmm needs per call (a PreparedWeight).

    w: float [N, K] (quantized here with mode, global_scale, rounding, fp8_format, blocked
    scales) or a QuantizedArray. On GPUs without block-scaled tensor cores (and on the
    CPU) the result also holds q(w)'s exact bfloat16 values, which costs 2 bytes per
    element of memory and saves qqmm a dequantization of w per call.
    """
    func = "prepare_weight"
    if isinstance(w, QuantizedArray):
        qa = w
    else:
        if mode == "affine":
            raise ValueError(f"{func}: mode 'affine' has no qqmm; use qq.quantize and "
                             f"qq.quantized_matmul for affine weights")
        try:
            qa = quantize(w, mode=mode, global_scale=global_scale, rounding=rounding,
                          scale_layout="blocked", fp8_format=fp8_format, stream=stream)
        except (ValueError, TypeError) as e:    # name this function, not the one it calls
            msg = str(e)
            if msg.startswith("quantize:"):
                msg = func + ":" + msg[len("quantize:"):].replace("argument 'x'", "argument 'w'")
            raise type(e)(msg) from None
    if len(qa.shape) != 2:
        raise ValueError(f"{func}: w: qqmm weights are [N, K]; got shape {qa.shape}")
    values = None
    if not _blockscaled_device(qa.data):
        values = dequantize(qa.data, qa.scales, group_size=qa.group_size, bits=qa.bits,
                            mode=qa.mode, scale_layout=qa.scale_layout, fp8_format=qa.fp8_format,
                            dtype="bfloat16", stream=stream)
    return PreparedWeight(qa, values)


# =========================================================================================
# Operations
# =========================================================================================

cdef inline DLTensor* _t(_View v):
    return NULL if v is None else &v.tensor


def quantize(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
             rounding="ceil", scale_layout="linear", fp8_format="e4m3", stream=None):
    """Quantize x [..., K] along its last axis; returns a QuantizedArray.

    mode: "affine" (default; group_size 64, bits 4), "nvfp4", "mxfp4" or "mxfp8".
    global_scale (nvfp4 only): a float32 array of one element (conventionally qq.amax(x))
    or a Python float. rounding ("ceil" | "floor"): UE8M0 scales of mxfp4/mxfp8.
    scale_layout ("linear" | "blocked"; blocked for fp modes only). fp8_format ("e4m3" |
    "e5m2"): mxfp8 elements. See docs/api.md.
    """
    cdef str func = "quantize"
    cdef _View vx, vg, vd, vs, vb
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tg
    cdef DLTensor *td
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef void* s
    _quant_params(func, &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
    cdef _Call call = _Call(func, x, "x", stream)
    biases = None
    try:
        vx = call.view(x, "x")
        global_scale = call.scalar(global_scale, "global_scale")
        vg = call.view(global_scale, "global_scale")
        data_shape, scales_shape = _quantized_shapes(func, &p, vx.shape)
        # fp scales are E4M3 / UE8M0 bytes; affine scales and biases have x's dtype.
        scale_dtype = vx.float_dtype() if p.mode == QQ_MODE_AFFINE else "uint8"
        data, vd = call.empty(data_shape, "uint8", "data")
        scales, vs = call.empty(scales_shape, scale_dtype, "scales")
        vb = None
        if p.mode == QQ_MODE_AFFINE:
            biases, vb = call.empty(scales_shape, scale_dtype, "biases")
        tx, tg, td, ts, tb = _t(vx), _t(vg), _t(vd), _t(vs), _t(vb)
        s = call.cstream()
        with nogil:
            st = qqQuantize(NULL, tx, &p, tg, td, ts, tb, s)
        _check(st)
        call.finish()
        x_shape = vx.shape
    finally:
        call.release()
    return QuantizedArray(call.result(data), call.result(scales), call.result(biases),
                          mode=mode, group_size=p.group_size, bits=p.bits,
                          global_scale=global_scale, rounding=rounding,
                          scale_layout=scale_layout, fp8_format=fp8_format, shape=x_shape)


def quantize_colwise(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
                     rounding="ceil", scale_layout="linear", fp8_format="e4m3", rowwise=False,
                     stream=None):
    """Quantize x [..., M, K] along its second-to-last axis (groups of rows of each column:
    the operand of a backward-pass GEMM) without materializing x^T.

    Returns the QuantizedArray of x^T [..., K, M] (exactly what quantize(x^T) gives).
    rowwise=True also quantizes x along its last axis from the same read and returns the
    pair (quantize(x), quantize_colwise(x)). Parameters as in quantize().
    """
    cdef str func = "quantize_colwise"
    cdef _View vx, vg, vd, vs, vb, vrd, vrs, vrb
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tg
    cdef DLTensor *td
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef DLTensor *trd
    cdef DLTensor *trs
    cdef DLTensor *trb
    cdef void* s
    _quant_params(func, &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
    cdef _Call call = _Call(func, x, "x", stream)
    biases = rdata = rscales = rbiases = None
    try:
        vx = call.view(x, "x")
        global_scale = call.scalar(global_scale, "global_scale")
        vg = call.view(global_scale, "global_scale")
        xs = vx.shape
        if len(xs) < 2:
            raise ValueError(f"{func}: argument 'x' has shape {xs}; expected [..., M, K]")
        t_shape = xs[:-2] + (xs[-1], xs[-2])
        data_shape, scales_shape = _quantized_shapes(func, &p, t_shape, "M")
        scale_dtype = vx.float_dtype() if p.mode == QQ_MODE_AFFINE else "uint8"
        data, vd = call.empty(data_shape, "uint8", "data_t")
        scales, vs = call.empty(scales_shape, scale_dtype, "scales_t")
        vb = vrd = vrs = vrb = None
        if p.mode == QQ_MODE_AFFINE:
            biases, vb = call.empty(scales_shape, scale_dtype, "biases_t")
        if rowwise:
            rdata_shape, rscales_shape = _quantized_shapes(func, &p, xs)
            rdata, vrd = call.empty(rdata_shape, "uint8", "data")
            rscales, vrs = call.empty(rscales_shape, scale_dtype, "scales")
            if p.mode == QQ_MODE_AFFINE:
                rbiases, vrb = call.empty(rscales_shape, scale_dtype, "biases")
        tx, tg, td, ts, tb = _t(vx), _t(vg), _t(vd), _t(vs), _t(vb)
        trd, trs, trb = _t(vrd), _t(vrs), _t(vrb)
        s = call.cstream()
        with nogil:
            st = qqQuantizeColwise(NULL, tx, &p, tg, td, ts, tb, trd, trs, trb, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    col = QuantizedArray(call.result(data), call.result(scales), call.result(biases),
                         mode=mode, group_size=p.group_size, bits=p.bits,
                         global_scale=global_scale, rounding=rounding,
                         scale_layout=scale_layout, fp8_format=fp8_format, shape=t_shape)
    if not rowwise:
        return col
    row = QuantizedArray(call.result(rdata), call.result(rscales), call.result(rbiases),
                         mode=mode, group_size=p.group_size, bits=p.bits,
                         global_scale=global_scale, rounding=rounding,
                         scale_layout=scale_layout, fp8_format=fp8_format, shape=xs)
    return row, col


def _swap_last_two(a):
    """A view of `a` with its last two axes swapped, in a's own framework."""
    if hasattr(a, "transpose") and type(a).__module__.split(".")[0] in ("numpy", "cupy"):
        return a.transpose(tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2))
    if type(a).__module__.split(".")[0] == "torch":
        return a.transpose(-2, -1)
    jnp = sys.modules.get("jax.numpy")
    if jnp is not None:
        return jnp.swapaxes(a, -2, -1)
    return a


def quantize_moe(w, scaling="32x1", *, rounding="ceil", scale_layout="linear", fp8_format="e4m3",
                 stream=None):
    """MXFP8 quantization of MoE expert weights w [E, D1, D2] along D1 (DESIGN.md section 3).

    scaling "32x1": one scale per 32 consecutive D1 elements at each D2 index; "32x32": one
    per 32x32 tile, so one quantization serves the forward GEMM and the transposed backward
    GEMM. w may be row-major or the transposed view of an [E, D2, D1] tensor (stride 1 on
    dim 1). Returns (data, scales): data uint8 [E, D1, D2], column-major per expert (strides
    (D1*D2, 1, D1)); scales linear [E, D1/32, D2] (32x1) or [E, D1/32, D2/32] (32x32), or
    blocked [E, roundup(D2,128), roundup(D1/32,4)] (the 32x32 scale replicated on its rows).
    rounding "ceil" (default) or "floor"; fp8_format "e4m3" or "e5m2".
    """
    cdef str func = "quantize_moe"
    cdef _View vx, vd, vs
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor td
    cdef DLTensor *ts
    cdef int64_t dshape[3]
    cdef int64_t dstrides[3]
    cdef void* s
    cdef qqMoeScaling_t sc
    if scaling == "32x1":
        sc = QQ_MOE_32X1
    elif scaling == "32x32":
        sc = QQ_MOE_32X32
    else:
        raise ValueError(f"{func}: scaling={scaling!r} is not supported; expected '32x1' or '32x32'")
    _quant_params(func, &p, "mxfp8", None, None, rounding, scale_layout, fp8_format)
    cdef _Call call = _Call(func, w, "w", stream)
    try:
        vx = call.view(w, "w")
        ws = vx.shape
        if len(ws) != 3 or ws[1] % 32 or ws[2] % 32:
            raise ValueError(f"{func}: argument 'w' has shape {ws}; expected [E, D1, D2] with D1 "
                             f"and D2 multiples of 32")
        E, D1, D2 = ws
        # data is written column-major per expert: allocate [E, D2, D1] and hand libqq
        # the [E, D1, D2] view of it with strides (D1*D2, 1, D1).
        data_t, vd = call.empty((E, D2, D1), "uint8", "data")
        if p.scale_layout == QQ_SCALE_BLOCKED:
            sshape = (E, -(-D2 // 128) * 128, -(-(D1 // 32) // 4) * 4)
        else:
            sshape = (E, D1 // 32, D2 // 32 if sc == QQ_MOE_32X32 else D2)
        scales, vs = call.empty(sshape, "uint8", "scales")
        td = vd.tensor
        dshape[0], dshape[1], dshape[2] = E, D1, D2
        dstrides[0], dstrides[1], dstrides[2] = D1 * D2, 1, D1
        td.shape = dshape
        td.strides = dstrides
        tx, ts = _t(vx), _t(vs)
        s = call.cstream()
        with nogil:
            st = qqQuantizeMoe(NULL, tx, &p, sc, &td, ts, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    return _swap_last_two(call.result(data_t)), call.result(scales)


def _unpack_weight(func, w, scales, biases, global_scale, mode, group_size, bits,
                   scale_layout, fp8_format):
    """The packed weight `w` of dequantize / quantized_matmul and its parameters, taken
    from a QuantizedArray when `w` is one (explicit arguments must agree with it), else as
    given. Returns (w, scales, biases, global_scale, mode, group_size, bits, scale_layout,
    fp8_format, logical_shape or None)."""
    if not isinstance(w, QuantizedArray):
        return (w, scales, biases, global_scale, mode, group_size, bits, scale_layout,
                fp8_format, None)
    qa = w
    return (qa.data,
            _take_array(func, "scales", scales, qa.scales, "w", "scales"),
            _take_array(func, "biases", biases, qa.biases, "w", "biases"),
            _take_array(func, "global_scale", global_scale, qa.global_scale, "w", "global_scale"),
            _take(func, "mode", mode, "affine", qa.mode, "w"),
            _take(func, "group_size", group_size, None, qa.group_size, "w"),
            _take(func, "bits", bits, None, qa.bits, "w"),
            _take(func, "scale_layout", scale_layout, "linear", qa.scale_layout, "w"),
            _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "w"),
            qa.shape)


def dequantize(w, scales=None, biases=None, group_size=None, bits=None, mode="affine", *,
               global_scale=None, scale_layout="linear", fp8_format="e4m3", dtype=None,
               out=None, stream=None):
    """Dequantize packed w [..., K*bits/8] (or a QuantizedArray) to [..., K].

    dtype: "bfloat16" (default), "float16" or "float32", or a NumPy / framework dtype.
    out: a writable, compact array of the result's shape and dtype (returned).
    """
    cdef str func = "dequantize"
    cdef _View vw, vs, vb, vg, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tw
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef DLTensor *tg
    cdef DLTensor *to
    cdef void* s
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     logical_shape) = _unpack_weight(func, w, scales, biases, global_scale, mode, group_size,
                                bits, scale_layout, fp8_format)
    _quant_params(func, &p, mode, group_size, bits, "ceil", scale_layout, fp8_format)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _Call(func, w, "w", stream)
    result = None
    try:
        vw = call.view(w, "w")
        vs = call.view(scales, "scales")
        vb = call.view(biases, "biases")
        vg = call.view(call.scalar(global_scale, "global_scale"), "global_scale")
        if out is None:
            if logical_shape is None:
                w_shape = vw.shape
                logical_shape = w_shape[:-1] + (_unpacked_last(func, "w", &p, w_shape),)
            result, vo = call.empty(tuple(logical_shape), out_dtype or "bfloat16", "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tw, ts, tb, tg, to = _t(vw), _t(vs), _t(vb), _t(vg), _t(vo)
        s = call.cstream()
        with nogil:
            st = qqDequantize(NULL, tw, ts, tb, &p, tg, to, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


cdef _View _out_view(_Call call, out, str dtype):
    cdef _View v = call.out_view(out, "out")
    if dtype is not None and v.dtype_name() != dtype:
        raise ValueError(f"{call.func}: out has dtype {v.dtype_name() or 'unsupported'} but "
                         f"dtype={dtype!r} was asked for")
    return v


def qqmm(x, w, scales=None, group_size=None, bits=None, mode="nvfp4", *,
         global_scale_x=None, global_scale_w=None, x_scales=None, bias=None, c=None, beta=1.0,
         rounding="ceil", scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
         stream=None, route="auto"):
    """y = alpha * q(x) @ q(w).T (+ bias) (+ beta * c), both operands quantized (nvfp4,
    mxfp4, mxfp8). c: an array of y's shape (float, on x's device; may be `out` itself, to
    accumulate in place); the product is formed in fp32 and y = product + beta * c rounded
    once to y's dtype (torch.addmm's beta; cuBLASLt's C).

    x: float [..., M, K] (quantized on the fly with `rounding`), a QuantizedArray, or
    packed uint8 with x_scales (in scale_layout). w: float [N, K], a QuantizedArray, or
    packed [N, K*bits/8] with scales in scale_layout. nvfp4 global scales give
    alpha = global_scale_x * global_scale_w / 2688**2. dtype default: x's dtype for a
    float x, else bfloat16. Affine mode: use quantized_matmul.

    route: "auto" (libqq picks, falling back where a faster path refuses), or one of
    "cpu", "exact", "blockscaled", "qmma", "qmv" to insist on that route: a call it does
    not cover raises NotSupportedError saying why (docs/api.md, "Dispatch"). The route a
    call took: qq.last_route().
    """
    cdef str func = "qqmm"
    cdef _View vx, vxs, vw, vws, vgx, vgw, vbias, vo, vc
    cdef qqQqmmParams_t qp
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *txs
    cdef DLTensor *tw
    cdef DLTensor *tws
    cdef DLTensor *tgx
    cdef DLTensor *tgw
    cdef DLTensor *tbias
    cdef DLTensor *to
    cdef void* s
    cdef int w_prepared = 0
    if w is None:
        raise TypeError(f"{func}: w: expected a float array, a QuantizedArray, a PreparedWeight "
                        f"or packed uint8 data; got None")
    _enum(func, "scale_layout", scale_layout, _LAYOUTS)     # checked even where a QuantizedArray decides
    if isinstance(w, PreparedWeight):
        pw = w
        rows = 1
        for d in x.shape[:-1]:
            rows *= int(d)
        qa = pw.quantized
        # small M: a weight-only kernel reads the packed form once. M <= 4 (qmv, every
        # shape) or M <= 16 with whole 16-byte chunks per row (qmma, tensor cores):
        # there it beats the bf16 GEMM on the prepared values (bench/results/qmm-h100.md;
        # thresholds kQmvMaxM / kQmmaMaxM in cuda/ops.cuh, docs/api.md).
        small = rows <= 4 or (rows <= 16 and (int(qa.shape[-1]) * qa.bits // 8) % 16 == 0)
        # these routes take the packed weight only
        packed_route = route in ("blockscaled", "qmma", "qmv")
        if pw.values is None or small or packed_route:
            w = qa
        else:
            w_prepared = 1
            w = pw.values
            mode_ = _take(func, "mode", mode, "nvfp4", pw.quantized.mode, "w")
            global_scale_w = _take_array(func, "global_scale_w", global_scale_w, pw.global_scale,
                                         "w", "global_scale")
            fp8_format = _take(func, "fp8_format", fp8_format, "e4m3", pw.quantized.fp8_format, "w")
            mode = mode_
    x_layout = scale_layout
    w_layout = scale_layout
    x_is_q = isinstance(x, QuantizedArray)
    w_is_q = isinstance(w, QuantizedArray)
    if x_is_q and w_is_q:
        for field in ("mode", "group_size", "bits", "fp8_format"):
            if getattr(x, field) != getattr(w, field):
                raise ValueError(f"{func}: x.{field}={getattr(x, field)!r} and "
                                 f"w.{field}={getattr(w, field)!r} differ; both operands "
                                 f"must be quantized alike")
    if w_is_q:
        qa = w
        scales = _take_array(func, "scales", scales, qa.scales, "w", "scales")
        global_scale_w = _take_array(func, "global_scale_w", global_scale_w, qa.global_scale,
                                     "w", "global_scale")
        mode_ = _take(func, "mode", mode, "nvfp4", qa.mode, "w")
        group_size_ = _take(func, "group_size", group_size, None, qa.group_size, "w")
        bits_ = _take(func, "bits", bits, None, qa.bits, "w")
        fp8_format_ = _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "w")
        w_layout = _take(func, "scale_layout", scale_layout, "linear", qa.scale_layout, "w")
        w = qa.data
    if x_is_q:
        qa = x
        x_scales = _take_array(func, "x_scales", x_scales, qa.scales, "x", "scales")
        global_scale_x = _take_array(func, "global_scale_x", global_scale_x, qa.global_scale,
                                     "x", "global_scale")
        mode_ = _take(func, "mode", mode, "nvfp4", qa.mode, "x")
        group_size_ = _take(func, "group_size", group_size, None, qa.group_size, "x")
        bits_ = _take(func, "bits", bits, None, qa.bits, "x")
        fp8_format_ = _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "x")
        x_layout = qa.scale_layout      # x's own; scale_layout describes w's scales
        x = qa.data
    if x_is_q or w_is_q:
        mode, group_size, bits, fp8_format = mode_, group_size_, bits_, fp8_format_
    if mode == "affine":
        raise ValueError(f"{func}: mode 'affine' has no quantized-activation GEMM; use "
                         f"qq.quantized_matmul (weight-only) for affine weights")
    cdef qqMode_t cmode = <qqMode_t>_enum(func, "mode", mode, _MODES)
    st = qqQqmmParamsInit(&qp, cmode)
    _check(st)
    _quant_params(func, &qp.quant, mode, group_size, bits, rounding, "linear", fp8_format)
    qp.x_scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", x_layout, _LAYOUTS)
    qp.w_scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", w_layout, _LAYOUTS)
    qp.w_prepared = w_prepared
    qp.route = <qqRoute_t>_enum(func, "route", route, _ROUTES)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _Call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vxs = call.view(x_scales, "x_scales")
        vw = call.view(w, "w")
        vws = call.view(scales, "scales")
        vgx = call.view(call.scalar(global_scale_x, "global_scale_x"), "global_scale_x")
        vgw = call.view(call.scalar(global_scale_w, "global_scale_w"), "global_scale_w")
        vbias = call.view(bias, "bias")
        vc = call.view(c, "c")
        qp.c = _t(vc)
        try:
            qp.beta = float(beta) if c is not None else 0.0
        except (TypeError, ValueError):
            raise TypeError(f"{func}: beta: expected a real number, got "
                            f"{type(beta).__name__} {beta!r}") from None
        if out is None:
            if out_dtype is None:
                x_dt = vx.dtype_name()
                out_dtype = x_dt if (not x_is_q and x_dt in _FLOAT_DTYPES) else "bfloat16"
            w_shape = vw.shape
            n = w_shape[-2] if len(w_shape) >= 2 else 0
            result, vo = call.empty(_matmul_shape(func, vx.shape, w_shape, n), out_dtype, "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, txs, tw, tws = _t(vx), _t(vxs), _t(vw), _t(vws)
        tgx, tgw, tbias, to = _t(vgx), _t(vgw), _t(vbias), _t(vo)
        s = call.cstream()
        with nogil:
            st = qqQqmm(NULL, tx, txs, tw, tws, &qp, tgx, tgw, tbias, to, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def grouped_qqmm(x, w, offsets, scales=None, group_size=None, bits=None, mode="mxfp8", *,
                 global_scale_x=None, global_scale_w=None, x_scales=None, rounding="ceil",
                 scale_layout="linear", fp8_format="e4m3", moe_scaling=None, dtype=None, out=None,
                 stream=None):
    """Grouped qqmm for mixture-of-experts layers: tokens x [T, K] sorted by expert,
    offsets int32 [E] (cumulative group ends, last = T; empty groups are legal), weights
    w [E, N, K] -> y [T, N] with y[rows of e] = alpha_e * q(x rows) @ q(w[e]).T.

    w: float [E, N, K] (quantized on the fly), a QuantizedArray of [E, N, K] (qq.quantize,
    linear or blocked scales), packed [E, N, K*bits/8] with `scales`, or - with
    moe_scaling="32x1" / "32x32" - the (data, scales) of qq.quantize_moe on the [E, K, N]
    weight (D1 = K, the contracted axis; scale_layout="blocked" required). x: float [T, K], a
    QuantizedArray or packed [T, K*bits/8] with linear x_scales. nvfp4: global_scale_x is a
    scalar, global_scale_w float32 [E]. The offsets are read on the host (one wait on the
    stream); each expert then runs as a qqmm.
    """
    cdef str func = "grouped_qqmm"
    cdef _View vx, vxs, voff, vw, vws, vgx, vgw, vo
    cdef qqQqmmParams_t qp
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *txs
    cdef DLTensor *toff
    cdef DLTensor *tw
    cdef DLTensor *tws
    cdef DLTensor *tgx
    cdef DLTensor *tgw
    cdef DLTensor *to
    cdef void* s
    x_layout = "linear"
    w_layout = scale_layout
    if moe_scaling is not None:
        if moe_scaling not in ("32x1", "32x32"):
            raise ValueError(f"{func}: moe_scaling must be None, '32x1' or '32x32'; got {moe_scaling!r}")
        if scale_layout != "blocked":
            raise ValueError(f"{func}: scale_layout: quantize_moe weights are taken with their blocked "
                             f"scales (qq.quantize_moe(..., scale_layout='blocked')); got {scale_layout!r}")
        if isinstance(w, tuple):
            w, scales = w
        w = _swap_last_two(w)   # [E, D1=K, D2=N] column-major per expert = [E, N, K] row-major
        mode = "mxfp8"
    if isinstance(w, QuantizedArray):
        qa = w
        scales = _take_array(func, "scales", scales, qa.scales, "w", "scales")
        global_scale_w = _take_array(func, "global_scale_w", global_scale_w, qa.global_scale,
                                     "w", "global_scale")
        mode = _take(func, "mode", mode, "mxfp8", qa.mode, "w")
        group_size = _take(func, "group_size", group_size, None, qa.group_size, "w")
        bits = _take(func, "bits", bits, None, qa.bits, "w")
        fp8_format = _take(func, "fp8_format", fp8_format, "e4m3", qa.fp8_format, "w")
        w_layout = _take(func, "scale_layout", scale_layout, "linear", qa.scale_layout, "w")
        w = qa.data
    x_is_q = isinstance(x, QuantizedArray)
    if x_is_q:
        qa = x
        x_scales = _take_array(func, "x_scales", x_scales, qa.scales, "x", "scales")
        global_scale_x = _take_array(func, "global_scale_x", global_scale_x, qa.global_scale,
                                     "x", "global_scale")
        x_layout = qa.scale_layout
        x = qa.data
    if mode == "affine":
        raise ValueError(f"{func}: mode 'affine' has no quantized-activation GEMM; use nvfp4, "
                         f"mxfp4 or mxfp8")
    cdef qqMode_t cmode = <qqMode_t>_enum(func, "mode", mode, _MODES)
    st = qqQqmmParamsInit(&qp, cmode)
    _check(st)
    _quant_params(func, &qp.quant, mode, group_size, bits, rounding, "linear", fp8_format)
    qp.x_scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", x_layout, _LAYOUTS)
    qp.w_scale_layout = <qqScaleLayout_t>_enum(func, "scale_layout", w_layout, _LAYOUTS)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _Call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vxs = call.view(x_scales, "x_scales")
        voff = call.view(offsets, "offsets")
        vw = call.view(w, "w")
        vws = call.view(scales, "scales")
        vgx = call.view(call.scalar(global_scale_x, "global_scale_x"), "global_scale_x")
        vgw = call.view(global_scale_w, "global_scale_w")
        if out is None:
            if out_dtype is None:
                x_dt = vx.dtype_name()
                out_dtype = x_dt if (not x_is_q and x_dt in _FLOAT_DTYPES) else "bfloat16"
            x_shape, w_shape = vx.shape, vw.shape
            if len(x_shape) != 2 or len(w_shape) != 3:
                raise ValueError(f"{func}: x must be [T, K] and w [E, N, K]; got x {tuple(x_shape)}, "
                                 f"w {tuple(w_shape)}")
            result, vo = call.empty((x_shape[0], w_shape[1]), out_dtype, "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, txs, toff, tw, tws = _t(vx), _t(vxs), _t(voff), _t(vw), _t(vws)
        tgx, tgw, to = _t(vgx), _t(vgw), _t(vo)
        s = call.cstream()
        with nogil:
            st = qqGroupedQqmm(NULL, tx, txs, toff, tw, tws, &qp, tgx, tgw, to, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def quantized_matmul(x, w, scales=None, biases=None, transpose=True, group_size=None,
                     bits=None, mode="affine", *, global_scale=None, bias=None,
                     scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
                     stream=None):
    """Weight-only matmul: x @ W.T (transpose=True, w packed [..., N, K*bits/8]) or x @ W
    (transpose=False, w packed [..., K, N*bits/8], groups along N as in MLX), with
    W = dequantize(w, ...). x is float [..., M, K]; batch axes broadcast; bias [N] is
    added; fp32 accumulation. dtype default: x's dtype.
    """
    cdef str func = "quantized_matmul"
    cdef _View vx, vw, vs, vb, vg, vbias, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *tw
    cdef DLTensor *ts
    cdef DLTensor *tb
    cdef DLTensor *tg
    cdef DLTensor *tbias
    cdef DLTensor *to
    cdef void* s
    cdef int ctranspose = 1 if transpose else 0
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     w_logical) = _unpack_weight(func, w, scales, biases, global_scale, mode, group_size,
                                bits, scale_layout, fp8_format)
    _quant_params(func, &p, mode, group_size, bits, "ceil", scale_layout, fp8_format)
    out_dtype = _dtype_arg(func, dtype)
    cdef _Call call = _Call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        vw = call.view(w, "w")
        vs = call.view(scales, "scales")
        vb = call.view(biases, "biases")
        vg = call.view(call.scalar(global_scale, "global_scale"), "global_scale")
        vbias = call.view(bias, "bias")
        if out is None:
            w_shape = vw.shape
            if ctranspose:
                n = w_shape[-2] if len(w_shape) >= 2 else 0         # w [..., N, K*bits/8]
            elif w_logical is not None:
                n = w_logical[-1]                                   # W [..., K, N]
            else:
                n = _unpacked_last(func, "w", &p, w_shape)
            result, vo = call.empty(_matmul_shape(func, vx.shape, w_shape, n),
                                    out_dtype or vx.float_dtype(), "out")
        else:
            vo = _out_view(call, out, out_dtype)
        tx, tw, ts, tb = _t(vx), _t(vw), _t(vs), _t(vb)
        tg, tbias, to = _t(vg), _t(vbias), _t(vo)
        s = call.cstream()
        with nogil:
            st = qqQuantizedMatmul(NULL, tx, tw, ts, tb, &p, ctranspose, tg, tbias, to, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def swizzle_scales(scales, *, out=None, stream=None):
    """Linear fp scales [B..., R, C] (uint8 or 1-byte float8) -> the blocked layout
    [B..., roundup(R, 128), roundup(C, 4)], zero-padded (a 1-D input counts as R = 1)."""
    cdef str func = "swizzle_scales"
    cdef _View vs, vo
    cdef qqQuantParams_t p
    cdef qqStatus_t st
    cdef DLTensor *ts
    cdef DLTensor *to
    cdef void* s
    cdef _Call call = _Call(func, scales, "scales", stream)
    result = None
    try:
        vs = call.view(scales, "scales")
        if out is None:
            shape = vs.shape
            if len(shape) == 0:
                raise ValueError(f"{func}: scales: expected [..., R, C], got a 0-d array")
            # The blocked shape of linear scales [B..., R, C] is the blocked scales shape
            # of an x [B..., R, C*group]: ask qqQuantizedShapes (any fp mode) rather than
            # repeat its padding rule here; C = 0 pads to 0 columns.
            _quant_params(func, &p, "mxfp8", None, None, "ceil", "blocked", "e4m3")
            _, blocked = _quantized_shapes(func, &p, shape[:-1] + (max(shape[-1], 1) * p.group_size,))
            if shape[-1] == 0:
                blocked = blocked[:-1] + (0,)
            result, vo = call.empty(blocked, "uint8", "out")
        else:
            vo = call.out_view(out, "out")
        ts, to = _t(vs), _t(vo)
        s = call.cstream()
        with nogil:
            st = qqSwizzleScales(NULL, ts, to, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def unswizzle_scales(scales, shape, *, out=None, stream=None):
    """Blocked fp scales -> linear scales of `shape` ([B..., R, C]; the padding is
    dropped)."""
    cdef str func = "unswizzle_scales"
    cdef _View vs, vo
    cdef qqStatus_t st
    cdef DLTensor *ts
    cdef DLTensor *to
    cdef void* s
    try:
        linear_shape = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"{func}: shape: expected a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in linear_shape):
        raise ValueError(f"{func}: shape: {linear_shape} has a negative extent; expected the "
                         f"linear scales' shape [..., R, C]")
    cdef _Call call = _Call(func, scales, "scales", stream)
    result = None
    try:
        vs = call.view(scales, "scales")
        if out is None:
            result, vo = call.empty(linear_shape, "uint8", "out")
        else:
            vo = call.out_view(out, "out")
            if vo.shape != linear_shape:
                raise ValueError(f"{func}: argument 'out' has shape {vo.shape}; expected the "
                                 f"linear shape {linear_shape} given as 'shape'")
        ts, to = _t(vs), _t(vo)
        s = call.cstream()
        with nogil:
            st = qqUnswizzleScales(NULL, ts, to, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def amax(x, *, out=None, stream=None):
    """max |x| over all of x as a float32 array of shape () in x's framework, computed on
    x's device without a host round trip (NaN if any NaN; 0 for an empty x)."""
    cdef str func = "amax"
    cdef _View vx, vo
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *to
    cdef void* s
    cdef _Call call = _Call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        if out is None:
            result, vo = call.empty((), "float32", "out")
        else:
            vo = call.out_view(out, "out")
        tx, to = _t(vx), _t(vo)
        s = call.cstream()
        with nogil:
            st = qqAmax(NULL, tx, to, s)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)
