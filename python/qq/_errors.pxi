# _errors.pxi - included by _qq.pyx (one extension module, one file per job).
# Errors (the status -> exception map) and library information.

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
    return _raise(status, _last_message(status))


cdef int _check_as(qqStatus_t status, str c_op, str func) except -1:
    """_check for a C function called on behalf of `func`: libqq's message names the C
    function (c_op, e.g. "quantized_shapes"); the exception names the caller's operation."""
    if status == QQ_STATUS_SUCCESS:
        return 0
    msg = _last_message(status)
    if msg.startswith(c_op + ":"):
        msg = func + msg[len(c_op):]
    return _raise(status, msg)


cdef str _last_message(qqStatus_t status):
    cdef const char* c_msg = qqGetLastErrorMessage()
    msg = c_msg.decode("utf-8", "replace") if c_msg != NULL else ""
    return msg or qqGetStatusString(status).decode("ascii", "replace")


cdef int _raise(qqStatus_t status, str msg) except -1:
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


cdef str _cstr(const char* p):
    return p.decode("utf-8", "replace") if p != NULL else ""


cdef str _cuda_version_string(int v):
    # cudaDriverGetVersion / cudaRuntimeGetVersion: major * 1000 + minor * 10.
    return f"{v // 1000}.{v % 1000 // 10}" if v else ""


def cuda_info():
    """The CUDA backend at run time (qqGetCudaInfo): a dict with cuda_built (bool),
    device_count (int), device_note ("" or why there is no device: CPU-only build, no
    driver, no GPU), driver_version and runtime_version ("13.0", "" if none),
    cublaslt_loaded (bool; asking loads cuBLASLt if libqq had not yet), cublaslt_version
    ("13.1.0", "" if not loaded), cublaslt_path and cublaslt_note ("" or why it could not
    be loaded, and how to get it)."""
    cdef qqCudaInfo_t info
    cdef qqStatus_t st
    memset(&info, 0, sizeof(info))
    info.struct_size = sizeof(info)
    with nogil:
        st = qqGetCudaInfo(&info)
    _check(st)
    v = info.cublaslt_version
    return {
        "cuda_built": bool(info.cuda_built),
        "device_count": info.device_count,
        "device_note": _cstr(info.device_note),
        "driver_version": _cuda_version_string(info.driver_version),
        "runtime_version": _cuda_version_string(info.runtime_version),
        "cublaslt_loaded": bool(info.cublaslt_loaded),
        "cublaslt_version": f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v else "",
        "cublaslt_path": _cstr(info.cublaslt_path),
        "cublaslt_note": _cstr(info.cublaslt_note),
    }


def device_capability(int device=0):
    """Compute capability of CUDA device `device` as (major, minor), e.g. (9, 0)."""
    cdef int major = 0, minor = 0
    cdef qqStatus_t st
    with nogil:
        st = qqGetDeviceCapability(device, &major, &minor)
    _check(st)
    return (major, minor)


cdef extern from *:
    """
    /* Set by the Python wrappers of the routed calls (qqmm, quantized_matmul, ...) on entry
       and cleared right after their C call: a call that fails before it reaches libqq (a
       refusal of its arguments in Python) leaves libqq's own record of the call before,
       so last_route() reads this first. Per thread, as libqq's record. */
    static __thread int qq_route_pending = 0;
    """
    int qq_route_pending


cdef inline void _route_pending() noexcept:
    global qq_route_pending
    qq_route_pending = 1


cdef inline void _route_recorded() noexcept:
    global qq_route_pending
    qq_route_pending = 0


def last_route():
    """The route ('cpu', 'exact', 'blockscaled', 'qmma' or 'qmv') that the last qqmm or
    quantized_matmul call on this thread took (for a batched w or grouped_qqmm: its last
    product); None if no such call has computed a product yet, or the last one failed."""
    cdef qqRoute_t r = QQ_ROUTE_AUTO
    if qq_route_pending:    # the last call failed in Python, before libqq ran
        return None
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
    previous value. "blockscaled_queries" and "grouped_blockscaled_queries" are counters:
    `value` is added."""
    cdef int old = 0
    _check(qqInternalSetTestHook(name.encode("ascii"), value, &old))
    return old
