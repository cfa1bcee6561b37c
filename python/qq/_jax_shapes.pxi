# _jax_shapes.pxi - included by _qq.pyx (one extension module, one file per job).
# Parameters and result shapes for qq's JAX layer (qq/_jax_ffi.py).
#
# Under jax.jit the arrays are tracers: there is nothing for libqq to read until XLA runs
# the program. The JAX layer still has to state every result's shape and dtype when it
# traces, and to pass the parameters to the XLA FFI handlers (bindings/xla/handlers.cpp)
# as qq.h's enum values. It asks here: the same validation (_quant_params) and the same
# shape rules (qqQuantizedShapes, qqQuantizeMoeShapes, through _quantized_shapes) as the
# eager calls, so a bad argument raises the same message at trace time, and no shape rule
# is written twice.

def _jax_quant_params(func, mode, group_size, bits, rounding, scale_layout, fp8_format):
    """qqQuantParams_t's fields after validation and defaults, as a dict of ints (the
    attributes of the XLA handlers: mode, group_size, bits, rounding, scale_layout,
    fp8_format)."""
    cdef qqQuantParams_t p
    _quant_params(func, &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
    return {"mode": <int>p.mode, "group_size": p.group_size, "bits": p.bits,
            "rounding": <int>p.rounding, "scale_layout": <int>p.scale_layout,
            "fp8_format": <int>p.fp8_format}


def _jax_quantized_shapes(func, mode, group_size, bits, rounding, scale_layout, fp8_format,
                          x_shape, axis="K"):
    """(data_shape, scales_shape) of quantizing an x of shape x_shape along its last axis
    (qqQuantizedShapes); `axis` names that axis in a message (M for quantize_colwise)."""
    cdef qqQuantParams_t p
    _quant_params(func, &p, mode, group_size, bits, rounding, scale_layout, fp8_format)
    return _quantized_shapes(func, &p, tuple([int(d) for d in x_shape]), axis)


def _jax_unpacked_last(func, name, mode, group_size, bits, data_shape):
    """The logical length K of packed data's last axis (as dequantize computes it)."""
    cdef qqQuantParams_t p
    _quant_params(func, &p, mode, group_size, bits, "ceil", "linear", "e4m3")
    return _unpacked_last(func, name, &p, tuple([int(d) for d in data_shape]))


def _jax_matmul_shape(func, x_shape, w_shape, n):
    """[..., M, N] of qqmm / quantized_matmul (batch axes broadcast)."""
    return _matmul_shape(func, tuple([int(d) for d in x_shape]),
                         tuple([int(d) for d in w_shape]), n)


def _jax_weight_n(func, mode, group_size, bits, transpose, w_shape, w_logical):
    """N of quantized_matmul / gather_qmm (as the eager functions compute it)."""
    cdef qqQuantParams_t p
    _quant_params(func, &p, mode, group_size, bits, "ceil", "linear", "e4m3")
    return _weight_n(func, &p, bool(transpose), tuple([int(d) for d in w_shape]), w_logical)


def _jax_gather_shape(func, x_shape, w_shape, idx_shape, n):
    """out's shape of gather_qmm (checked as the eager function checks it)."""
    return _gather_shape(func, tuple([int(d) for d in x_shape]), tuple([int(d) for d in w_shape]),
                         tuple([int(d) for d in idx_shape]), n)


def _jax_moe(func, scaling, rounding, scale_layout, fp8_format, w_shape):
    """(scaling enum, quant params dict, scales shape) of quantize_moe for w [E, D1, D2],
    checked as qqQuantizeMoe checks them (qqQuantizeMoeShapes)."""
    cdef qqQuantParams_t p
    cdef qqMoeScaling_t sc
    cdef int64_t ws[3]
    cdef int64_t ss[3]
    if scaling == "32x1":
        sc = QQ_MOE_32X1
    elif scaling == "32x32":
        sc = QQ_MOE_32X32
    else:
        raise ValueError(f"{func}: scaling={scaling!r} is not supported; expected '32x1' or '32x32'")
    _quant_params(func, &p, "mxfp8", None, None, rounding, scale_layout, fp8_format)
    shape = tuple([int(d) for d in w_shape])
    if len(shape) != 3:
        raise ValueError(f"{func}: argument 'w' has shape {shape}; expected [E, D1, D2]")
    ws[0], ws[1], ws[2] = shape
    _check(qqQuantizeMoeShapes(&p, sc, ws, ss))
    return (<int>sc, {"rounding": <int>p.rounding, "scale_layout": <int>p.scale_layout,
                      "fp8_format": <int>p.fp8_format}, (ss[0], ss[1], ss[2]))


def _jax_enum(func, arg, value, str table):
    """An enum argument by name ("mode", "scale_layout", "route") as its qq.h value."""
    return _enum(func, arg, value, {"mode": _MODES, "scale_layout": _LAYOUTS,
                                    "route": _ROUTES}[table])


def _jax_dtype(func, dtype):
    """The dtype= argument as 'float32', 'float16' or 'bfloat16' (None when not given)."""
    return _dtype_arg(func, dtype)


def _jax_take(func, arg, given, default, qa_value, qa_name):
    """An explicit argument next to a QuantizedArray (must agree with it; see _take)."""
    return _take(func, arg, given, default, qa_value, qa_name)


def _jax_take_array(func, arg, given, qa_value, qa_name, qa_field):
    return _take_array(func, arg, given, qa_value, qa_name, qa_field)
