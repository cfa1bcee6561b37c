# _streams.pxi - included by _qq.pyx (one extension module, one file per job).
# Streams: the stream= argument and host synchronization.

# =========================================================================================
# Streams
# =========================================================================================

cdef bint _is_cuda_device(int device_type):
    return device_type == kDLCUDA or device_type == kDLCUDAManaged or device_type == kDLCUDAHost


cdef intptr_t _stream_arg(str func, stream) except? -1:
    """An explicit `stream=`: an int (a cudaStream_t value) or an object with
    __cuda_stream__ (CUDA stream protocol: a (version, handle) tuple, version 0).
    Anything else is refused rather than guessed at."""
    if type(stream) is int and stream >= 0:     # the common case, before the ABC checks
        return stream
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
