# _ops_layout.pxi - included by _qq.pyx (one extension module, one file per job).
# Operations: swizzle_scales, unswizzle_scales, amax, swiglu.

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
    cdef _Call call = _new_call(func, scales, "scales", stream)
    result = None
    try:
        vs = call.view(scales, "scales")
        if out is None:
            shape = vs.pyshape()
            if len(shape) == 0:
                raise ValueError(f"{func}: scales: expected [..., R, C], got a 0-d array")
            # The blocked shape of linear scales [B..., R, C] is the blocked scales shape
            # of an x [B..., R, C*group]: ask qqQuantizedShapes (any fp mode) rather than
            # repeat its padding rule here; C = 0 pads to 0 columns.
            _quant_params(func, &p, "mxfp8", None, None, "ceil", "blocked", "e4m3")
            try:
                _, blocked = _quantized_shapes(func, &p, shape[:-1] + (max(shape[-1], 1) * p.group_size,))
            except ValueError:
                # (said of the caller's scales: the x of the question above is ours)
                raise ValueError(f"{func}: argument 'scales' has shape {shape}: its blocked layout "
                                 f"[..., roundup(R, 128), roundup(C, 4)] would be beyond what libqq "
                                 f"addresses (2^56 elements); split the scales") from None
            if shape[-1] == 0:
                blocked = blocked[:-1] + (0,)
            result, vo = call.empty(blocked, call.like_bytes(vs), "out")
        else:
            vo = call.out_view(out, "out")
        ts, to = _t(vs), _t(vo)
        s = call.cstream()
        _gil = call.unlock()
        st = qqSwizzleScales(NULL, ts, to, s)
        _relock(_gil)
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
    cdef _Call call = _new_call(func, scales, "scales", stream)
    result = None
    try:
        vs = call.view(scales, "scales")
        if out is None:
            # blocked scales are at least as large as the linear ones in every axis: a larger
            # `shape` is refused before its result is allocated
            if math.prod(linear_shape) > math.prod(vs.pyshape()):
                raise ValueError(f"{func}: shape: {linear_shape} holds more scales than the blocked "
                                 f"'scales' of shape {vs.pyshape()}; pass the linear scales' shape "
                                 f"[..., R, C] that these blocked scales were made from")
            result, vo = call.empty(linear_shape, call.like_bytes(vs), "out")
        else:
            vo = call.out_view(out, "out")
            if vo.pyshape() != linear_shape:
                raise ValueError(f"{func}: argument 'out' has shape {vo.pyshape()}; expected the "
                                 f"linear shape {linear_shape} given as 'shape'")
        ts, to = _t(vs), _t(vo)
        s = call.cstream()
        _gil = call.unlock()
        st = qqUnswizzleScales(NULL, ts, to, s)
        _relock(_gil)
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
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        if out is None:
            result, vo = call.empty((), "float32", "out")
        else:
            vo = call.out_view(out, "out")
        tx, to = _t(vx), _t(vo)
        s = call.cstream()
        _gil = call.unlock()
        st = qqAmax(NULL, tx, to, s)
        _relock(_gil)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)


def swiglu(x, *, out=None, stream=None):
    """silu(g) * u of x [..., 2F] = [g | u] (the gate in the first F columns, the up
    projection in the last F), as [..., F] in x's dtype and framework: vLLM's silu_and_mul,
    computed in float32 and rounded once. One kernel on the GPU, launched so that a
    following decode-layout matmul can prefetch its weights meanwhile (docs/api.md, swiglu).
    """
    cdef str func = "swiglu"
    cdef _View vx, vo
    cdef qqStatus_t st
    cdef DLTensor *tx
    cdef DLTensor *to
    cdef void* s
    cdef _Call call = _new_call(func, x, "x", stream)
    result = None
    try:
        vx = call.view(x, "x")
        if out is None:
            # (an odd last axis or a 0-d x: libqq refuses x, after its dtype, with its message)
            xs = vx.pyshape()
            result, vo = call.empty(xs[:-1] + (xs[-1] // 2,) if xs else (), vx.float_dtype(), "out")
        else:
            vo = call.out_view(out, "out")
        tx, to = _t(vx), _t(vo)
        s = call.cstream()
        _gil = call.unlock()
        st = qqSwiglu(NULL, tx, to, s)
        _relock(_gil)
        _check(st)
        call.finish()
    finally:
        call.release()
    return out if out is not None else call.result(result)
