"""qq's operations on JAX tracers: XLA FFI custom calls into libqq (docs/adapters.md, "JAX").

Imported on demand - by the first qq call that JAX traces (qq._dispatch), by qq.jax, or by
`import qq` when jax is imported already - never by `import qq` alone: qq does not need jax.

Under jax.jit (and jax.vmap, and inside a jitted gradient) the arrays are tracers, which
libqq cannot read. qq's public functions then land here (qq._dispatch) and become
jax.ffi.ffi_call's of the handlers in libqq_xla.so (bindings/xla/handlers.cpp): XLA calls
libqq's C ABI on its own buffers when the program runs - on the CPU backend for jax's CPU
devices, on the GPU on XLA's stream for CUDA devices, never synchronizing. What Python
does here is what it does eagerly: resolve the arguments (QuantizedArray fields, defaults,
enum values, validated by the same code as the eager calls: qq._qq._jax_* helpers) and
state each result's shape and dtype, asked of libqq (qqQuantizedShapes).

The handlers are registered (jax.ffi.register_ffi_target, platforms "cpu" and "CUDA") on
the first traced call. If that is impossible (libqq_xla.so missing, a jaxlib whose XLA
FFI is too old), the traced call raises NotSupportedError saying why; qq.jax.qq_linear
then falls back to host callbacks (jax.pure_callback).

jax.vmap: every call uses vmap_method="expand_dims"; the handler folds the vmap axes into
the op's own batch axes where that gives the same result (e.g. x alone batched in
quantize or qqmm) and otherwise loops over them (per-example global scales, amax).
"""

from __future__ import annotations

import ctypes
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np

from . import _qq
from ._dispatch import check_flag, check_torch_dtypes, qqmm_operands, require_indices, swiglu_shape_error
from ._qq import DecodeWeight, NotSupportedError, PreparedWeight, QuantizedArray

#: The operations with XLA handlers (qq_xla_<op>_cpu / _cuda in libqq_xla.so).
OPS = ("quantize", "quantize_colwise", "dequantize", "amax", "quantize_moe", "qqmm",
       "quantized_matmul", "gather_qmm", "swiglu")
_PLATFORMS = (("cpu", "cpu"), ("CUDA", "cuda"))

_lock = threading.Lock()
_status = None          # None: not tried yet; "ok"; or why the handlers are unavailable
_platforms = []         # the platforms registered
_lib = None             # the loaded libqq_xla.so


def library_path() -> str:
    """Where libqq_xla.so is installed: next to libqq, in the package's lib/."""
    return os.path.join(os.path.dirname(os.path.abspath(_qq.__file__)), "lib", "libqq_xla.so")


def _register() -> str:
    try:
        import jax.ffi  # noqa: F401  (jax >= 0.4.32; earlier versions lack it)
        # Initialize the backends first: a registration XLA refuses (say, an FFI API version
        # it no longer supports) then raises here, instead of failing the backend's
        # initialization later, which would make every jax call fail.
        jax.devices()
    except Exception as e:  # noqa: BLE001
        return f"this jax has no usable jax.ffi: {type(e).__name__}: {e}"
    global _lib
    try:
        lib = ctypes.CDLL(library_path())
    except OSError as e:
        return f"cannot load {library_path()}: {e}"
    _lib = lib
    for op in OPS:
        for platform, suffix in _PLATFORMS:
            try:
                fn = getattr(lib, f"qq_xla_{op}_{suffix}")
            except AttributeError as e:
                return f"{library_path()} lacks a handler: {e}"
            try:
                jax.ffi.register_ffi_target(f"qq_{op}", jax.ffi.pycapsule(fn), platform=platform)
            except Exception as e:  # noqa: BLE001 - a platform this jaxlib cannot register
                if platform == "cpu":
                    return f"jax.ffi.register_ffi_target failed: {type(e).__name__}: {e}"
                continue
            if platform not in _platforms:
                _platforms.append(platform)
    return "ok"


def status() -> str:
    """"ok" when the XLA handlers are registered (registering them on first use), else why
    they cannot be."""
    global _status
    if _status is None:
        with _lock:
            if _status is None:
                _status = _register()
    return _status


def available() -> bool:
    """True when qq's calls can run inside jax.jit / vmap as XLA custom calls."""
    return status() == "ok"


def platforms() -> list:
    """The XLA platforms the handlers are registered for ("cpu", "CUDA")."""
    status()
    return list(_platforms)


def vmap_counts() -> tuple:
    """(folded, looped): how many vmapped calls the handlers ran as one libqq call with the
    vmap axes as batch axes, and how many as a loop over them (a diagnostic)."""
    if not available():
        return (0, 0)
    folded, looped = ctypes.c_int64(0), ctypes.c_int64(0)
    _lib.qq_xla_vmap_counts(ctypes.byref(folded), ctypes.byref(looped))
    return folded.value, looped.value


def _require(func):
    st = status()
    if st != "ok":
        raise NotSupportedError(
            f"{func}: called on a JAX tracer (inside jax.jit, vmap or grad), which runs qq "
            f"through its XLA FFI handlers, and those are unavailable: {st}. Call qq on "
            f"concrete arrays (outside jit), or reinstall qq")


# =========================================================================================
# QuantizedArray as a JAX pytree: its arrays are leaves, its parameters static
# =========================================================================================

def _qa_flatten(qa):
    return ((qa.data, qa.scales, qa.biases, qa.global_scale),
            (qa.mode, qa.group_size, qa.bits, qa.rounding, qa.scale_layout, qa.fp8_format,
             qa.shape))


def _qa_unflatten(aux, children):
    data, scales, biases, gs = children
    mode, group_size, bits, rounding, scale_layout, fp8_format, shape = aux
    qa = QuantizedArray.__new__(QuantizedArray)
    qa.data, qa.scales, qa.biases, qa.global_scale = data, scales, biases, gs
    qa.mode, qa.group_size, qa.bits = mode, group_size, bits
    qa.rounding, qa.scale_layout, qa.fp8_format = rounding, scale_layout, fp8_format
    # The logical shape follows the data's leading axes: jax.vmap rebuilds a per-example
    # QuantizedArray around batched leaves (the packed last axis keeps its logical length).
    ds = getattr(data, "shape", None)
    if isinstance(ds, tuple) and len(ds) >= 1 and len(shape) >= 1:
        shape = tuple(ds[:-1]) + (shape[-1],)
    qa.shape = shape
    return qa


jax.tree_util.register_pytree_node(QuantizedArray, _qa_flatten, _qa_unflatten)


# =========================================================================================
# The call
# =========================================================================================

def _ffi(op, operands, results, **attrs):
    """ffi_call of qq_<op> with the present operands (name, array) and the results
    (ShapeDtypeStructs); integer attributes as int32, `beta` as float32."""
    _require(op)
    names, arrays = [], []
    for name, a in operands:
        if a is not None:
            names.append(name)
            arrays.append(a)
    kw = {k: (np.float32(v) if k == "beta" else np.int32(v)) for k, v in attrs.items()}
    # A call whose results all have zero elements is dead code to XLA (its results are
    # constants), so it would never run, and the checks only libqq makes (an int32 x, a
    # wrong bias, a global scale outside nvfp4) would pass silently where the eager call
    # raises. Such a call is marked as having a side effect: XLA keeps and runs it, libqq
    # checks the arguments and writes nothing.
    empty = all(0 in tuple(r.shape) for r in results)
    call = jax.ffi.ffi_call(f"qq_{op}", results, vmap_method="expand_dims", has_side_effect=empty)
    return call(*arrays, operands=",".join(names), rank=np.int32(np.ndim(arrays[0])), **kw)


def _array(a):
    return None if a is None else jnp.asarray(a)


def _scalar(value):
    """A global scale: arrays as they are; a Python / NumPy real number as float32 ()."""
    if value is None:
        return None
    if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
        return jnp.asarray(value, jnp.float32)
    return jnp.asarray(value)


def _no_stream_or_out(func, stream=None, out=None):
    if stream is not None:
        raise ValueError(f"{func}: stream= cannot be used inside jax.jit / vmap: XLA runs qq on "
                         f"its own stream; leave stream=None")
    if out is not None:
        raise ValueError(f"{func}: out: JAX arrays are immutable and cannot be written into; "
                         f"leave out=None to get a new array")


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(int(d) for d in shape), jnp.dtype(dtype))


def _qa(data, scales, biases, mode, p, gs, rounding, scale_layout, fp8_format, shape):
    """A QuantizedArray of an op's results, its fields set directly: the parameters were
    validated already, and a combination only libqq refuses (a global scale outside nvfp4)
    is refused by libqq, with its message, when XLA runs the call."""
    qa = QuantizedArray.__new__(QuantizedArray)
    qa.data, qa.scales, qa.biases, qa.global_scale = data, scales, biases, gs
    qa.mode, qa.group_size, qa.bits = mode, p["group_size"], p["bits"]
    qa.rounding, qa.scale_layout, qa.fp8_format = rounding, scale_layout, fp8_format
    qa.shape = tuple(int(d) for d in shape)
    return qa


def _scale_dtype(mode, x):
    return x.dtype if mode == "affine" else jnp.uint8


# =========================================================================================
# The operations (qq's public signatures; docs/api.md)
# =========================================================================================

def quantize(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
             rounding="ceil", scale_layout="linear", fp8_format="e4m3", torch_dtypes=True, stream=None):
    func = "quantize"
    _no_stream_or_out(func, stream)
    check_torch_dtypes(func, torch_dtypes)   # taken for torch callers; JAX results are uint8
    p = _qq._jax_quant_params(func, mode, group_size, bits, rounding, scale_layout, fp8_format)
    x = jnp.asarray(x)
    gs = _scalar(global_scale)
    ds, ss = _qq._jax_quantized_shapes(func, mode, group_size, bits, rounding, scale_layout,
                                       fp8_format, x.shape)
    results = [_sds(ds, jnp.uint8), _sds(ss, _scale_dtype(mode, x))]
    if mode == "affine":
        results.append(_sds(ss, x.dtype))
    outs = _ffi("quantize", [("x", x), ("global_scale", gs)], results, **p)
    biases = outs[2] if mode == "affine" else None
    return _qa(outs[0], outs[1], biases, mode, p, gs, rounding, scale_layout, fp8_format, x.shape)


def quantize_colwise(x, group_size=None, bits=None, mode="affine", *, global_scale=None,
                     rounding="ceil", scale_layout="linear", fp8_format="e4m3", rowwise=False,
                     torch_dtypes=True, stream=None):
    func = "quantize_colwise"
    rowwise = check_flag(func, "rowwise", rowwise)
    _no_stream_or_out(func, stream)
    check_torch_dtypes(func, torch_dtypes)   # taken for torch callers; JAX results are uint8
    p = _qq._jax_quant_params(func, mode, group_size, bits, rounding, scale_layout, fp8_format)
    x = jnp.asarray(x)
    gs = _scalar(global_scale)
    xs = tuple(x.shape)
    if len(xs) < 2:
        raise ValueError(f"{func}: argument 'x' has shape {xs}; expected [..., M, K]")
    t_shape = xs[:-2] + (xs[-1], xs[-2])
    shapes = [_qq._jax_quantized_shapes(func, mode, group_size, bits, rounding, scale_layout,
                                        fp8_format, t_shape, "M")]
    if rowwise:
        shapes.append(_qq._jax_quantized_shapes(func, mode, group_size, bits, rounding,
                                                scale_layout, fp8_format, xs))
    results = []
    for ds, ss in shapes:
        results += [_sds(ds, jnp.uint8), _sds(ss, _scale_dtype(mode, x))]
        if mode == "affine":
            results.append(_sds(ss, x.dtype))
    outs = _ffi("quantize_colwise", [("x", x), ("global_scale", gs)], results,
                rowwise=1 if rowwise else 0, **p)
    per = 3 if mode == "affine" else 2

    def qa(i, shape):
        o = outs[i * per:(i + 1) * per]
        return _qa(o[0], o[1], o[2] if per == 3 else None, mode, p, gs, rounding, scale_layout,
                   fp8_format, shape)

    col = qa(0, t_shape)
    return (qa(1, xs), col) if rowwise else col


def dequantize(w, scales=None, biases=None, group_size=None, bits=None, mode="affine", *,
               global_scale=None, scale_layout="linear", fp8_format="e4m3", dtype=None,
               out=None, stream=None):
    func = "dequantize"
    _no_stream_or_out(func, stream, out)
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     logical) = _qq._unpack_weight(func, w, scales, biases, global_scale, mode, group_size,
                                   bits, scale_layout, fp8_format)
    p = _qq._jax_quant_params(func, mode, group_size, bits, "ceil", scale_layout, fp8_format)
    out_dtype = _qq._jax_dtype(func, dtype) or "bfloat16"
    w = jnp.asarray(w)
    if logical is None:
        logical = tuple(w.shape[:-1]) + (
            _qq._jax_unpacked_last(func, "w", mode, group_size, bits, w.shape),)
    operands = [("w", w), ("scales", _array(scales)), ("biases", _array(biases)),
                ("global_scale", _scalar(global_scale))]
    (y,) = _ffi("dequantize", operands, [_sds(logical, out_dtype)], **p)
    return y


def amax(x, *, out=None, stream=None):
    func = "amax"
    _no_stream_or_out(func, stream, out)
    (y,) = _ffi("amax", [("x", jnp.asarray(x))], [_sds((), jnp.float32)])
    return y


def swiglu(x, *, out=None, stream=None):
    func = "swiglu"
    _no_stream_or_out(func, stream, out)
    x = jnp.asarray(x)
    if x.ndim == 0 or x.shape[-1] % 2:
        raise ValueError(swiglu_shape_error(x.shape))
    (y,) = _ffi("swiglu", [("x", x)], [_sds(tuple(x.shape[:-1]) + (x.shape[-1] // 2,), x.dtype)])
    return y


def quantize_moe(w, scaling="32x1", *, rounding="ceil", scale_layout="linear",
                 fp8_format="e4m3", torch_dtypes=True, stream=None):
    func = "quantize_moe"
    _no_stream_or_out(func, stream)
    check_torch_dtypes(func, torch_dtypes)   # taken for torch callers; JAX results are uint8
    w = jnp.asarray(w)
    sc, p, sshape = _qq._jax_moe(func, scaling, rounding, scale_layout, fp8_format, w.shape)
    e, d1, d2 = w.shape
    # libqq writes the codes column-major per expert ([E, D1, D2] with strides
    # (D1*D2, 1, D1)): the handler gets a row-major [E, D2, D1] buffer, swapped back here.
    data_t, scales = _ffi("quantize_moe", [("w", w)],
                          [_sds((e, d2, d1), jnp.uint8), _sds(sshape, jnp.uint8)],
                          scaling=sc, **p)
    return jnp.swapaxes(data_t, -2, -1), scales


def qqmm(x, w, scales=None, group_size=None, bits=None, mode="nvfp4", *,
         global_scale_x=None, global_scale_w=None, x_scales=None, bias=None, c=None, beta=1.0,
         rounding="ceil", scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
         stream=None, route="auto"):
    func = "qqmm"
    _no_stream_or_out(func, stream, out)
    if w is None:
        raise TypeError(f"{func}: w: expected a float array, a QuantizedArray, a PreparedWeight "
                        f"or packed uint8 data; got None")
    _qq._jax_enum(func, "scale_layout", scale_layout, "scale_layout")
    w_values = None
    if isinstance(w, PreparedWeight):
        w_values, w = w.values, w.quantized
    (x, w, scales, x_scales, global_scale_x, global_scale_w, mode, group_size, bits, fp8_format,
     x_layout, w_layout, x_is_q) = qqmm_operands(func, x, w, scales, x_scales, global_scale_x,
                                                 global_scale_w, mode, group_size, bits, fp8_format,
                                                 scale_layout, _qq._jax_take, _qq._jax_take_array)
    if mode == "affine":
        raise ValueError(f"{func}: mode 'affine' has no quantized-activation GEMM; use "
                         f"qq.quantized_matmul (weight-only) for affine weights")
    p = _qq._jax_quant_params(func, mode, group_size, bits, rounding, "linear", fp8_format)
    p.pop("scale_layout")
    x_layout_e = _qq._jax_enum(func, "scale_layout", x_layout, "scale_layout")
    w_layout_e = _qq._jax_enum(func, "scale_layout", w_layout, "scale_layout")
    route_e = _qq._jax_enum(func, "route", route, "route")
    out_dtype = _qq._jax_dtype(func, dtype)
    x, w = jnp.asarray(x), jnp.asarray(w)
    if out_dtype is None:
        x_dt = jnp.dtype(x.dtype).name
        out_dtype = x_dt if (not x_is_q and x_dt in ("float32", "float16", "bfloat16")) else "bfloat16"
    try:
        beta_f = float(beta) if c is not None else 0.0
    except (TypeError, ValueError):
        raise TypeError(f"{func}: beta: expected a real number, got "
                        f"{type(beta).__name__} {beta!r}") from None
    n = w.shape[-2] if w.ndim >= 2 else 0
    shape = _qq._jax_matmul_shape(func, x.shape, w.shape, n)
    operands = [("x", x), ("x_scales", _array(x_scales)), ("w", w), ("scales", _array(scales)),
                ("global_scale_x", _scalar(global_scale_x)),
                ("global_scale_w", _scalar(global_scale_w)),
                ("bias", _array(bias)), ("c", _array(c)), ("w_values", _array(w_values))]
    (y,) = _ffi("qqmm", operands, [_sds(shape, out_dtype)], x_scale_layout=x_layout_e,
                w_scale_layout=w_layout_e, route=route_e, beta=beta_f, **p)
    return y


def quantized_matmul(x, w, scales=None, biases=None, transpose=True, group_size=None,
                     bits=None, mode="affine", *, global_scale=None, bias=None,
                     scale_layout="linear", fp8_format="e4m3", dtype=None, out=None,
                     stream=None):
    func = "quantized_matmul"
    _no_stream_or_out(func, stream, out)
    if isinstance(w, DecodeWeight):  # under jit: the packed weight (the layout's kernel is eager)
        w = w.quantized
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     w_logical) = _qq._unpack_weight(func, w, scales, biases, global_scale, mode, group_size,
                                     bits, scale_layout, fp8_format)
    p = _qq._jax_quant_params(func, mode, group_size, bits, "ceil", scale_layout, fp8_format)
    out_dtype = _qq._jax_dtype(func, dtype)
    x, w = jnp.asarray(x), jnp.asarray(w)
    n = _qq._jax_weight_n(func, mode, group_size, bits, transpose, w.shape, w_logical)
    shape = _qq._jax_matmul_shape(func, x.shape, w.shape, n)
    operands = [("x", x), ("w", w), ("scales", _array(scales)), ("biases", _array(biases)),
                ("global_scale", _scalar(global_scale)),
                ("bias", _array(bias))]
    (y,) = _ffi("quantized_matmul", operands, [_sds(shape, out_dtype or x.dtype)],
                transpose=1 if transpose else 0, **p)
    return y


def gather_qmm(x, w, scales=None, biases=None, rhs_indices=None, transpose=True,
               group_size=None, bits=None, mode="affine", *, global_scale=None, bias=None,
               scale_layout="linear", fp8_format="e4m3", dtype=None, out=None, stream=None):
    func = "gather_qmm"
    _no_stream_or_out(func, stream, out)
    require_indices(func, rhs_indices)
    if isinstance(w, DecodeWeight):  # under jit: the packed experts (the layout's kernel is eager)
        w = w.quantized
    (w, scales, biases, global_scale, mode, group_size, bits, scale_layout, fp8_format,
     w_logical) = _qq._unpack_weight(func, w, scales, biases, global_scale, mode, group_size,
                                     bits, scale_layout, fp8_format)
    p = _qq._jax_quant_params(func, mode, group_size, bits, "ceil", scale_layout, fp8_format)
    out_dtype = _qq._jax_dtype(func, dtype)
    x, w, idx = jnp.asarray(x), jnp.asarray(w), jnp.asarray(rhs_indices)
    n = _qq._jax_weight_n(func, mode, group_size, bits, transpose, w.shape, w_logical)
    shape = _qq._jax_gather_shape(func, x.shape, w.shape, idx.shape, n)
    operands = [("x", x), ("w", w), ("scales", _array(scales)), ("biases", _array(biases)),
                ("rhs_indices", idx), ("global_scale", _scalar(global_scale)),
                ("bias", _array(bias))]
    (y,) = _ffi("gather_qmm", operands, [_sds(shape, out_dtype or x.dtype)],
                transpose=1 if transpose else 0, **p)
    return y


# =========================================================================================
# qq._dispatch's entry: a public function called with tracers
# =========================================================================================

def traced(args, kwargs) -> bool:
    """True when any argument (or a QuantizedArray / PreparedWeight field, or an element of
    a tuple) is a JAX tracer."""
    tracer = jax.core.Tracer

    def t(a):
        if isinstance(a, tracer):
            return True
        if isinstance(a, QuantizedArray):
            return any(t(v) for v in (a.data, a.scales, a.biases, a.global_scale))
        if isinstance(a, PreparedWeight):
            return t(a.quantized) or t(a.values)
        if isinstance(a, (tuple, list)):
            return any(t(v) for v in a)
        return False

    return any(t(a) for a in args) or any(t(v) for v in kwargs.values())


def op(name):
    """The JAX implementation of qq.<name>, or a TypeError for the ones that have none."""
    if name in OPS:
        return globals()[name]
    raise TypeError(f"{name}: called on a JAX tracer (inside jax.jit, vmap or grad); qq.{name} "
                    f"runs on concrete arrays only. The functions that run inside jit are "
                    f"{', '.join('qq.' + o for o in OPS)}")
